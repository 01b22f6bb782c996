"""Run the simulated endpoint in the foreground.

    python -m dagster_batchllm.simulator --port 8000 --latency-s 0.1 --models a,b \
        --embedding-models sim-embed --embedding-dimensions 384

prints its base URL on one line once it accepts connections. The API key, if any, is
read from the DAGSTER_BATCHLLM_SIM_API_KEY environment variable (never a flag, so it
does not show up in process listings).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

from .endpoint import API_KEY_ENV
from .server import ServerSettings, serve, watch_parent
from .state import BATCH_STAGES, SimState


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dagster_batchllm.simulator",
                                     description="Simulated OpenAI-compatible endpoint.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--max-concurrency", type=int, default=256)
    parser.add_argument("--models", default=None, help="comma-separated; default: the responder's")
    parser.add_argument("--responder", default=None, help="module:attr (default: EchoResponder)")
    parser.add_argument("--max-context-tokens", type=int, default=None)
    parser.add_argument("--requests-per-minute", type=float, default=None)
    parser.add_argument("--tokens-per-minute", type=float, default=None)
    parser.add_argument("--rate-limit-window-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--embedding-models", default=None,
                        help="comma-separated models served on /v1/embeddings (default: none)")
    parser.add_argument("--embedding-dimensions", type=int, default=384)
    parser.add_argument("--max-inputs-per-request", type=int, default=2048)
    parser.add_argument("--no-embedding-base64", action="store_true",
                        help='answer encoding_format="base64" with a 400')
    parser.add_argument("--max-image-bytes", type=int, default=20 * 1024 * 1024)
    parser.add_argument("--batch-stage-s", type=float, default=0.0,
                        help="seconds a batch spends in each stage (negative: until advanced)")
    parser.add_argument("--files-dir", default=None,
                        help="where uploaded and batch files go (default: a temp dir)")
    # Used by SimulatedEndpoint(process=True):
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--state-from-stdin", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


async def _run(args: argparse.Namespace, state: SimState) -> None:
    settings = ServerSettings(
        host=args.host, port=args.port, max_concurrency=args.max_concurrency,
        models=args.models.split(",") if args.models else None,
        api_key=os.environ.get(API_KEY_ENV) or None, responder=args.responder,
        embedding_models=args.embedding_models.split(",") if args.embedding_models else None,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.parent_pid:
        loop.create_task(watch_parent(args.parent_pid, stop))

    def on_ready(port: int) -> None:
        print(f"http://{args.host}:{port}/v1", flush=True)

    await serve(settings, state, on_ready, stop)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
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
    try:
        import uvloop  # optional: a faster loop when the environment has it
    except ImportError:
        asyncio.run(_run(args, state))
    else:
        uvloop.run(_run(args, state))


if __name__ == "__main__":
    main()
