"""``python -m dagster_batchllm.openai_server``: see :mod:`.cli`."""

from .cli import main

main()
