"""The inference core: rows in, requests through a pool of endpoints, answers in a ledger.

Nothing here imports dagster or pyspark (a test checks it), so the same code serves plain
scripts, the SQL functions and Spark executors. Read it in the order the data flows:
:mod:`.settings` and :mod:`.call` (what to do), :mod:`.prompts` (rows become requests),
:mod:`.ledger` (what is answered already), :mod:`.limits` (budgets and windows), :mod:`.pool`
and :mod:`.transport` (sending, with :mod:`.retries`), :mod:`.engine` (one run),
:mod:`.results` (what comes back), :mod:`.client` (the two calls, ``infer`` and ``estimate``).
"""
