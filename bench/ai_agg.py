"""``ai_agg`` over one group many times the model's context: it finishes, every row reaches a
level-1 request whole (counted at the server), and a rerun sends nothing.

From the repository root::

    .venv/bin/python -m bench.ai_agg              # 1,200 rows, a 4,096-token context
    .venv/bin/python -m bench.ai_agg --quick      # 300 rows, a 1,024-token context

One simulated endpoint (``max_context_tokens`` as given: it refuses a longer request with
400 ``context_length_exceeded``, as vLLM does), ``--latency`` seconds a request, concurrency
16. Its responder (``dagster_batchllm.simulator.aggregation.AggregatingResponder``) answers an
aggregate request with the rows it got and a digest of their exact texts, and counts each row
of each level-1 request. The query, on DuckDB::

    SELECT ai_agg(body, 'What do these customers complain about most?') FROM tickets

Figures: the group's size against the context; levels and requests per level (from
``llm.aggregate`` with the same arguments, which the ledger answers whole); rows per level-1
request; the server's count of rows at level 1 against the table's, and whether the final
answer's digest is the rows' (no row dropped, repeated or cut); seconds. Then the rerun
(requests sent: the target is 0), and the group grown by 1% (requests sent per level: only
the chunks the new rows land in, and the levels above them); and the same growth with the
rows ordered by a column (``order_by=``: new rows land at the end, so only the last chunks
change).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import Counter

import duckdb
import pandas as pd

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.simulator.aggregation import AggregatingResponder, read_answer, rows_digest
from dagster_batchllm.sql import register_ai_functions
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
INSTRUCTION = "What do these customers complain about most?"
QUERY = f"SELECT ai_agg(body, '{INSTRUCTION}') AS answer FROM tickets"


def tickets(n: int, seed: int = 11, start: int = 0) -> list[str]:
    """Support tickets of about 155 characters (~39 tokens) each."""
    rng = random.Random(seed)
    things = ["lamp", "chair", "kettle", "desk", "sofa", "blender", "printer", "monitor"]
    faults = ["arrived broken", "stopped working after a week", "is missing a part",
              "was the wrong colour", "came two weeks late", "was charged twice"]
    return [f"Ticket {start + i:06d}: the {rng.choice(things)} I ordered {rng.choice(faults)}; "
            f"order {rng.randint(10_000, 99_999)}, I called {rng.randint(1, 5)} times and "
            f"nobody answered, please refund or replace it as soon as you can."
            for i in range(n)]


def run(rows: int, context: int, max_tokens: int, latency: float) -> None:
    responder = AggregatingResponder(models=(MODEL,))
    with SimulatedEndpoint(models=(MODEL,), responder=responder, max_context_tokens=context,
                           latency_s=latency) as sim, tempfile.TemporaryDirectory() as tmp:
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="sim", base_url=sim.base_url, models=(MODEL,),
                                    max_concurrency=16, max_context_tokens=context),),
            store_url=f"sqlite:///{tmp}/ledger.db", default_max_tokens=max_tokens,
            progress_interval_s=600)
        client = InferenceClient(settings)
        body = tickets(rows)
        frame = pd.DataFrame({"body": body})
        con = duckdb.connect()
        con.register("tickets", frame)
        register_ai_functions(con, client)
        tokens = sum(len(t) for t in body) // 4
        print(f"{rows:,} rows, ~{tokens:,} tokens: {tokens / context:.1f}x the {context:,}-token "
              f"context (max_tokens={max_tokens}, latency {latency * 1000:.0f} ms)")

        start = time.perf_counter()
        [(answer,)] = con.sql(QUERY).fetchall()
        seconds = time.perf_counter() - start
        sent = sim.stats(log=False)["requests"]
        figures = client.aggregate(frame, instruction=INSTRUCTION, column="body").figures
        per_request = figures.rows_per_level1_request
        mean = sum(per_request) / len(per_request)
        counted, digest = read_answer(answer)
        print(f"first run: {seconds:.2f} s, {sent} requests sent; {figures.levels} levels, "
              f"requests per level {figures.requests_per_level}; rows per level-1 request "
              f"{min(per_request)}-{max(per_request)} (mean {mean:.1f})")
        print(f"  at the server: {responder.rows_at_level1:,} rows in level-1 requests of "
              f"{rows:,}; every row once, whole: {responder.rows_seen == Counter(body)}; "
              f"the answer covers {counted:,} rows, digest matches: "
              f"{digest == rows_digest(body)}; refused for length: "
              f"{sim.stats(log=False)['by_status'].get('400', 0)}")

        start = time.perf_counter()
        [(again,)] = con.sql(QUERY).fetchall()
        print(f"rerun: {time.perf_counter() - start:.2f} s, "
              f"{sim.stats(log=False)['requests'] - sent} requests sent, same answer: "
              f"{again == answer}")

        grown = body + tickets(max(1, rows // 100), seed=12, start=rows)
        before = sim.stats(log=False)["requests"]
        start = time.perf_counter()
        result = client.aggregate(pd.DataFrame({"body": grown}), instruction=INSTRUCTION,
                                  column="body")
        print(f"grown by {len(grown) - rows} rows: {time.perf_counter() - start:.2f} s, "
              f"requests sent per level {result.figures.sent_per_level} (of "
              f"{result.figures.requests_per_level}); {sim.stats(log=False)['requests'] - before}"
              f" at the server; answer covers {read_answer(result.df['answer'][0])[0]:,} rows")
        # The same growth, the rows ordered by a column (their ticket number, as a timestamp
        # would): the new rows land at the end, so only the last chunks change.
        numbered = pd.DataFrame({"ticket": range(len(body)), "body": body})
        client.aggregate(numbered, instruction=INSTRUCTION, column="body", order_by="ticket")
        more = pd.DataFrame({"ticket": range(len(grown)), "body": grown})
        start = time.perf_counter()
        ordered = client.aggregate(more, instruction=INSTRUCTION, column="body",
                                   order_by="ticket")
        print(f"grown by {len(grown) - rows} rows, order_by='ticket': "
              f"{time.perf_counter() - start:.2f} s, requests sent per level "
              f"{ordered.figures.sent_per_level} (of {ordered.figures.requests_per_level})")
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 rows, a 1,024-token context")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds a request")
    args = parser.parse_args()
    if args.quick:
        run(rows=300, context=1024, max_tokens=64, latency=args.latency)
    else:
        run(rows=1200, context=4096, max_tokens=128, latency=args.latency)


if __name__ == "__main__":
    main()
