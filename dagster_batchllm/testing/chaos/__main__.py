"""A chaos worker process: ``python -m dagster_batchllm.testing.chaos '<job json>'``."""

import json
import sys

from .running import run_worker

if len(sys.argv) != 2:
    sys.exit("usage: python -m dagster_batchllm.testing.chaos '<job json>' "
             "(the crash and contention scenarios start these)")
run_worker(json.loads(sys.argv[1]))
