"""A deadline kept by mixing the batch API and online endpoints, over batches that finish at
random times.

From the repository root::

    .venv/bin/python -m bench.deadline              # 10 trials of 2,000 rows, 40 s each (~6 min)
    .venv/bin/python -m bench.deadline --rows 500 --deadline-s 30 --trials 4

One simulated endpoint (its own process) serves the model online (50 ms a request, 64 at once)
and through its Files and Batches API, priced ``Price(2.0, 2.0)`` (the batch API: half). Each
trial uses a fresh ledger: 100 rows of a past partition are answered online first (the online
rate is then measured, as after any earlier run), then ``infer(mode="batch_api", wait=True,
deadline=now + deadline_s)`` over the trial's rows, with the default margins. The trial's batch
answers its lines at an even pace over its finish time, drawn at random (seed 33): seven
finish before the deadline, two after it and one stalls forever; a cancel takes 1 s. After the
call, the bench waits for the cancels and reruns the call, which collects what the cancelled
batches answered late, so answers paid twice are counted.

Per trial: the finish time drawn, rows answered by the deadline, by batch, online, paid twice,
online requests, and the cost against all-online (the same tokens at the online price); beside
it the limit: what a clairvoyant that knew the finish time would pay, switching at the last
moment the online endpoints allow (their measured rate, no margin): the batch price for a batch
that ends by then, else the lines answered by then at the batch price and the rest online.
Targets (issue 33): every row answered by the deadline in every trial; rows paid twice <= 1%;
0 online requests and 50% of all-online where the batch finishes in time; over the 10 trials,
cost >= 45% below all-online.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import pandas as pd

from dagster_batchllm import Price
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
PRICE = Price(input_per_mtok=2.0, output_per_mtok=2.0)
PROMPT = "Summarize this call: {text}"


def finish_times(deadline_s: float, trials: int, seed: int = 33) -> list[float | None]:
    """Seven in ten before the deadline, two after, one stalled (None), shuffled."""
    rng = random.Random(seed)
    late = max(1, round(trials * 0.2))
    early = trials - late - 1
    times: list[float | None] = [rng.uniform(0.15, 0.65) * deadline_s for _ in range(early)]
    times += [rng.uniform(1.05, 1.6) * deadline_s for _ in range(late)]
    times.append(None)
    rng.shuffle(times)
    return times


def rows(n: int, prefix: str) -> pd.DataFrame:
    return pd.DataFrame({"text": [f"{prefix} customer {i} asks about order {i * 7 % 1000}"
                                  for i in range(n)]})


def trial(sim: SimulatedEndpoint, store: str, n: int, deadline_s: float,
          finish_s: float | None, index: int) -> dict:
    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="provider", base_url=sim.base_url, models=(MODEL,),
                                api_key="k", batch_api=True, max_concurrency=64,
                                prices={MODEL: PRICE}),),
        store_url=f"sqlite:///{store}", batch_poll_initial_s=0.5, batch_poll_max_s=2.0,
        progress_interval_s=3600.0)
    with InferenceClient(settings) as client:
        client.infer(rows(100, "past"), prompt=PROMPT, model=MODEL, output_column="s",
                     max_tokens=32, scope="past")
        sim.configure(batch_in_progress_s=finish_s, batch_cancelling_s=1.0,
                      batch_validating_s=0.0, batch_finalizing_s=0.0)
        before = sim.stats(log=False)["requests"]
        table = rows(n, f"trial{index}")
        started = time.time()
        deadline = started + deadline_s
        result = client.infer(table, prompt=PROMPT, model=MODEL, output_column="summary",
                              max_tokens=32, mode="batch_api", wait=True, deadline=deadline)
        finished = time.time()
        online = sim.stats(log=False)["requests"] - before
        time.sleep(1.5)  # the cancels end; what they answered late is collected by the rerun
        rerun = client.infer(table, prompt=PROMPT, model=MODEL, output_column="summary",
                             max_tokens=32, mode="batch_api", wait=True, deadline=deadline)
        figures = rerun.stats.deadline
        answered = int(result.df["summary"].notna().sum())
        # The clairvoyant's last moment: the deadline less the online time for every row (a
        # batch's lines are answered evenly, so which rows remain is not known in advance).
        last = deadline_s - n / figures["online_requests_per_s"]
        share = 0.0 if finish_s is None else min(1.0, last / finish_s)
        limit = 0.5 if share >= 1.0 else 1.0 - share / 2
        return {
            "batch finishes (s)": "stalled" if finish_s is None else round(finish_s, 1),
            "answered by deadline": f"{answered if finished <= deadline else 0}/{n}",
            "finished (s)": round(finished - started, 1),
            "by batch": result.stats.deadline["rows_by_batch"],
            "online": result.stats.deadline["rows_online"],
            "online requests": online,
            "paid twice": figures["duplicate_rows"],
            "rerun requests": rerun.stats.requests,
            "cost / all-online": round(result.stats.cost_usd / result.stats.online_cost_usd, 3),
            "limit": round(limit, 3),
            "_cost": result.stats.cost_usd + figures["duplicate_cost_usd"],
            "_online": result.stats.online_cost_usd,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--deadline-s", type=float, default=40.0)
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp, SimulatedEndpoint(
            models=(MODEL,), api_key="k", latency_s=0.05, process=True) as sim:
        for i, finish in enumerate(finish_times(args.deadline_s, args.trials)):
            results.append(trial(sim, f"{tmp}/ledger{i}.db", args.rows, args.deadline_s,
                                 finish, i))
            print({k: v for k, v in results[-1].items() if not k.startswith("_")}, flush=True)
    frame = pd.DataFrame(results)
    print()
    print(frame[[c for c in frame.columns if not c.startswith("_")]].to_markdown(index=False))
    cost, online = frame["_cost"].sum(), frame["_online"].sum()
    twice = frame["paid twice"].sum()
    limit = (frame["limit"] * frame["_online"]).sum() / online
    print(f"\nover {len(frame)} trials: cost {cost / online:.1%} of all-online "
          f"({1 - cost / online:.1%} below; target >= 45% below; the clairvoyant limit "
          f"{limit:.1%}, {1 - limit:.1%} below); paid twice {twice} of "
          f"{args.rows * len(frame)} rows ({twice / (args.rows * len(frame)):.2%}; target "
          "<= 1%); every row by the deadline in "
          f"{sum(r['answered by deadline'] == f'{args.rows}/{args.rows}' for r in results)}"
          f"/{len(frame)} trials")


if __name__ == "__main__":
    main()
