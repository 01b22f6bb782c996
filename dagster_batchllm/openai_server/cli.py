"""The command line of a server process: ``python -m dagster_batchllm.openai_server`` serves a
responder in the foreground,

    python -m dagster_batchllm.openai_server --responder my_module:MyResponder --port 8000

prints its base URL on one line once it accepts connections. The API key, if any, is read
from the DAGSTER_BATCHLLM_SERVING_API_KEY environment variable (never a flag, so it does not
show up in process listings). The simulator's command line adds its own flags to `parser`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .endpoint import ServedEndpoint
from .server import OpenAIApp, ServerSettings, run_in_foreground
from .state import ServingState


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The flags every server process takes (the simulator's adds its own)."""
    parsed = argparse.ArgumentParser(prog=prog, description=description)
    parsed.add_argument("--host", default="127.0.0.1")
    parsed.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parsed.add_argument("--max-concurrency", type=int, default=256)
    parsed.add_argument("--models", default=None,
                        help="comma-separated; default: the responder's")
    parsed.add_argument("--responder", default=None, help="module:attr")
    parsed.add_argument("--embedding-models", default=None,
                        help="comma-separated models served on /v1/embeddings "
                             "(default: the responder's, if it embeds)")
    # Used by ServedEndpoint(process=True):
    parsed.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    parsed.add_argument("--state-from-stdin", action="store_true", help=argparse.SUPPRESS)
    return parsed


def settings_of(args: argparse.Namespace, api_key_env: str) -> ServerSettings:
    return ServerSettings(
        host=args.host, port=args.port, max_concurrency=args.max_concurrency,
        models=args.models.split(",") if args.models else None,
        api_key=os.environ.get(api_key_env) or None, responder=args.responder,
        embedding_models=args.embedding_models.split(",") if args.embedding_models else None,
    )


def main(argv: list[str] | None = None) -> None:
    args = parser("python -m dagster_batchllm.openai_server",
                  "An OpenAI-compatible server answered by a responder.").parse_args(argv)
    if not args.responder:
        sys.exit("--responder module:attr is required")
    state = (ServingState.from_export(json.load(sys.stdin)) if args.state_from_stdin
             else ServingState())
    app = OpenAIApp(settings_of(args, ServedEndpoint.API_KEY_ENV), state)
    run_in_foreground(app, args.parent_pid)
