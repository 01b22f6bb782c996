"""The inference core: rows in, requests through a pool of endpoints, answers in a ledger.

Nothing here imports dagster or pyspark (a test checks it), so the same code serves plain
scripts, the SQL functions and Spark executors. Read it in the order the data flows:
:mod:`.settings` and :mod:`.tasks` (what to do: each job a call and a task),
:mod:`.requests` (what every layer passes on), :mod:`.ledger` (what is answered already),
:mod:`.limits` (budgets and windows), :mod:`.pool` and :mod:`.transport` (sending, with
:mod:`.retries`), :mod:`.run` (one run, whatever the job), :mod:`.batch` (the offline batch
APIs' passes), :mod:`.results` (what comes back), :mod:`.client` (every job's call and its
estimate).
"""
