"""Run the simulated endpoint in the foreground.

    python -m dagster_batchllm.simulator --port 8000 --latency-s 0.1 --models a,b \
        --embedding-models sim-embed --embedding-dimensions 384

prints its base URL on one line once it accepts connections. The API key, if any, is
read from the DAGSTER_BATCHLLM_SIM_API_KEY environment variable (never a flag, so it
does not show up in process listings).
"""

from __future__ import annotations

import json
import os
import sys

from ..openai_server.cli import parser, settings_of
from ..openai_server.server import run_in_foreground
from .endpoint import SimulatedEndpoint
from .server import SimApp
from .state import BATCH_STAGES, SimState


def main(argv: list[str] | None = None) -> None:
    flags = parser("python -m dagster_batchllm.simulator", "Simulated OpenAI-compatible endpoint.")
    flags.set_defaults(responder=None)  # None: EchoResponder
    flags.add_argument("--latency-s", type=float, default=0.0)
    flags.add_argument("--max-context-tokens", type=int, default=None)
    flags.add_argument("--requests-per-minute", type=float, default=None)
    flags.add_argument("--tokens-per-minute", type=float, default=None)
    flags.add_argument("--rate-limit-window-s", type=float, default=60.0)
    flags.add_argument("--seed", type=int, default=0)
    flags.add_argument("--embedding-dimensions", type=int, default=384)
    flags.add_argument("--max-inputs-per-request", type=int, default=2048)
    flags.add_argument("--no-embedding-base64", action="store_true",
                       help='answer encoding_format="base64" with a 400')
    flags.add_argument("--max-image-bytes", type=int, default=20 * 1024 * 1024)
    flags.add_argument("--batch-stage-s", type=float, default=0.0,
                       help="seconds a batch spends in each stage (negative: until advanced)")
    flags.add_argument("--files-dir", default=None,
                       help="where uploaded and batch files go (default: a temp dir)")
    args = flags.parse_args(argv)
    if args.state_from_stdin:
        state = SimState.from_export(json.load(sys.stdin))
    else:
        state = SimState({
            "latency_s": args.latency_s, "max_context_tokens": args.max_context_tokens,
            "requests_per_minute": args.requests_per_minute,
            "tokens_per_minute": args.tokens_per_minute,
            "rate_limit_window_s": args.rate_limit_window_s, "seed": args.seed,
            "embedding_dimensions": args.embedding_dimensions,
            "max_inputs_per_request": args.max_inputs_per_request,
            "embedding_base64": not args.no_embedding_base64,
            "max_image_bytes": args.max_image_bytes,
            **dict.fromkeys(BATCH_STAGES, None if args.batch_stage_s < 0 else args.batch_stage_s),
        })
        if args.files_dir:
            os.makedirs(args.files_dir, exist_ok=True)
            state.store.directory = args.files_dir
    app = SimApp(settings_of(args, SimulatedEndpoint.API_KEY_ENV), state)
    run_in_foreground(app, args.parent_pid)


if __name__ == "__main__":
    main()
