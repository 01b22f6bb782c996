"""The benchmarks: each module is a script, run from the repository root as a module, e.g.::

    .venv/bin/python -m bench.core_throughput --quick

so the root is on ``sys.path`` (the scripts import each other as ``bench.<name>``, and the
example code location's ``assets``/``resources`` import as they are). Each script's docstring
says what it measures and how to run it; shared code for tests and benchmarks lives in
:mod:`dagster_batchllm.testing`, what only the benchmarks share here (``child``,
``peak_memory``, ``baselines``).
"""
