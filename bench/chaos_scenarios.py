"""The chaos scenarios of ``bench/chaos.py``, shared with their reduced form in tests/test_chaos.py.

Each scenario pushes a table through ``InferenceClient.infer()`` against simulated endpoints while
something goes wrong, then measures on the *server* side: requests that arrived, 200 answers given
to the same request more than once (across all endpoints), tokens billed, and the peak requests and
tokens in any rate-limit window. It also checks every output row: ok (and the right answer for
that row), failed with a typed reason, or deferred; anything else is a missing row.

Scenarios 5 and 6 infer in subprocesses started as ``python bench/chaos_scenarios.py worker
'<job json>'`` (see ``run_worker`` for the job's keys).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from dagster_batchllm.core.client import InferenceClient  # noqa: E402
from dagster_batchllm.core.errors import ErrorType  # noqa: E402
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings  # noqa: E402
from dagster_batchllm.testing import SimulatedEndpoint  # noqa: E402

MODEL = "sim-model"
PROMPT = "Summarize ticket {ticket}: {text}"
MAX_TOKENS = 48
POSTGRES_URL = os.environ.get(
    "BATCHLLM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
ERROR_CODES = {e.value for e in ErrorType} | {"internal_error"}
SCHEMA = {
    "type": "object",
    "properties": {"topic": {"type": "string"}, "words": {"type": "integer"}},
    "required": ["topic", "words"],
    "additionalProperties": False,
}
_WORDS = ["refund", "order", "invoice", "delivery", "late", "broken", "screen", "battery",
          "password", "reset", "account", "billing", "upgrade", "cancel", "plan", "router",
          "signal", "outage", "technician", "appointment", "warranty", "replacement", "courier",
          "address", "charge", "twice", "discount", "loyalty", "voucher", "complaint", "manager",
          "callback", "survey"]


# -- sizes -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scale:
    """How big and how long each scenario is; ``BENCH`` for chaos.py, ``TEST`` for pytest."""

    name: str
    rows: int                 # rows per scenario (scenarios 1-4, 7, 8)
    crash_rows: int           # scenario 5
    contention_rows: int      # scenario 6: rows per partition (4 partitions, half overlapping)
    storm_s: float            # scenario 1: how long 30% of requests get 429 (the issue: 60 s)
    restart_down_s: float     # scenario 4: how long the restarted endpoint stays down (10 s)
    window_s: float           # rate-limit window of the endpoints, client and server side
    rps: float                # requests per second each endpoint allows
    tps: float                # tokens per second each endpoint allows
    latency_s: float          # simulated service time of one request
    retry_after_s: float      # scenario 1: the Retry-After of the storm's 429s
    timeout_s: float          # request timeout (scenario 3's slow endpoint goes past it)
    concurrency: int          # max_concurrency per endpoint
    process_sims: bool        # simulated endpoints in subprocesses (their own GIL)


BENCH = Scale("bench", rows=3000, crash_rows=3000, contention_rows=1000, storm_s=20.0,
              restart_down_s=10.0, window_s=2.0, rps=150.0, tps=15000.0, latency_s=0.05,
              retry_after_s=1.0, timeout_s=2.0, concurrency=32, process_sims=True)
TEST = Scale("test", rows=300, crash_rows=300, contention_rows=120, storm_s=3.0,
             restart_down_s=1.5, window_s=1.0, rps=100.0, tps=10000.0, latency_s=0.01,
             retry_after_s=0.1, timeout_s=1.0, concurrency=16, process_sims=False)


# -- the data --------------------------------------------------------------------------------

def make_frame(n: int, *, offset: int = 0, seed: int = 7, dup_every: int = 20):
    """``n`` ticket rows with a non-default index; every ``dup_every``-th row repeats an earlier
    one (same prompt, so one request answers both). Row ``i`` is the same in every call."""
    import pandas as pd

    tickets, texts = [], []
    for i in range(offset, offset + n):
        source = i - 7 if dup_every and i % dup_every == dup_every - 1 and i >= 7 else i
        rng = random.Random(seed * 1_000_003 + source)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 30)))
        tickets.append(f"T{source:06d}")
        texts.append(f"Customer says {words}.")
    return pd.DataFrame({"ticket": tickets, "text": texts},
                        index=pd.RangeIndex(10_000 + offset, 10_000 + offset + n, name="row_id"))


def expected_reply(ticket: str, text: str, structured: bool = False) -> object:
    """What the simulated endpoint's echo responder answers for a row (see EchoResponder)."""
    import re

    prompt = re.sub(r"\s+", " ", PROMPT.format(ticket=ticket, text=text)).strip()
    if structured:
        return {"topic": prompt[:200], "words": len(prompt.split())}
    reply = "[sim] " + prompt
    if (len(reply) + 3) // 4 > MAX_TOKENS:
        reply = reply[: MAX_TOKENS * 4]
    return reply


# -- endpoints and clients -------------------------------------------------------------------

class Fleet:
    """Simulated endpoints with rate limits enforced (and measured) on their side, and the
    ``EndpointSpec``s that tell the client the same limits."""

    def __init__(self, scale: Scale, count: int, *, seed: int = 1, rps: float | None = None,
                 tps: float | None = None, concurrency: int | None = None,
                 latency_s: float | None = None, **faults):
        self.scale = scale
        self.rps = rps or scale.rps
        self.tps = tps or scale.tps
        self.window_s = scale.window_s
        self.concurrency = concurrency or scale.concurrency
        self.sims: list[SimulatedEndpoint] = []
        try:
            for i in range(count):
                sim = SimulatedEndpoint(
                    models=(MODEL,), process=scale.process_sims, max_concurrency=4096,
                    latency_s=scale.latency_s if latency_s is None else latency_s,
                    requests_per_minute=self.rps * 60, tokens_per_minute=self.tps * 60,
                    rate_limit_window_s=self.window_s, seed=seed + i,
                )
                self.sims.append(sim.start())
                if faults:
                    sim.configure(**faults)
        except BaseException:
            self.stop()
            raise

    @property
    def urls(self) -> list[str]:
        return [sim.base_url for sim in self.sims]

    def specs(self) -> tuple[EndpointSpec, ...]:
        return fleet_specs(self.describe())

    def describe(self) -> dict:
        """What a worker process needs to build the same ``EndpointSpec``s."""
        return {"urls": self.urls, "rps": self.rps, "tps": self.tps, "window_s": self.window_s,
                "concurrency": self.concurrency}

    def settings(self, *, store_url: str | None, **overrides) -> InferenceSettings:
        return InferenceSettings(endpoints=self.specs(),
                                 **{**client_options(self.scale, store_url), **overrides})

    def answered(self) -> int:
        """200 answers so far, over all endpoints (a stopped one reports its kept figures)."""
        total = 0
        for sim in self.sims:
            try:
                total += sim.stats(log=False)["ok"]
            except OSError:
                pass  # one being stopped right now
        return total

    def configure(self, **changes) -> None:
        for sim in self.sims:
            sim.configure(**changes)

    def stop(self) -> None:
        for sim in self.sims:
            sim.stop()

    def measure(self, outcome: Outcome) -> None:
        """Stop the endpoints and read their figures (duplicates across endpoints included)."""
        self.stop()  # a stopped endpoint keeps its state, the answered-request memory included
        answered: set[str] = set()
        ok = 0
        req_limit = self.rps * self.window_s
        tok_limit = self.tps * self.window_s
        worst_req = worst_tok = worst_conc = 0.0
        for i, sim in enumerate(self.sims):
            stats = sim.stats(log=False)
            outcome.requests += stats["requests"]
            outcome.tokens += stats["prompt_tokens"] + stats["completion_tokens"]
            for status, count in stats["by_status"].items():
                outcome.statuses[status] = outcome.statuses.get(status, 0) + count
            outcome.statuses["drop"] = outcome.statuses.get("drop", 0) + stats["dropped"]
            outcome.statuses["stall"] = outcome.statuses.get("stall", 0) + stats["stalled"]
            ok += stats["ok"]
            answered |= sim._state.answered
            peak_req = sim.max_in_window(self.window_s, "requests")
            peak_tok = sim.max_in_window(self.window_s, "tokens")
            outcome.require(peak_req <= req_limit,
                            f"ep{i}: {peak_req:.0f} requests arrived within {self.window_s:g} s "
                            f"(limit {req_limit:.0f})")
            outcome.require(peak_tok <= tok_limit,
                            f"ep{i}: {peak_tok:.0f} tokens billed within {self.window_s:g} s "
                            f"(limit {tok_limit:.0f})")
            worst_req = max(worst_req, peak_req / req_limit)
            worst_tok = max(worst_tok, peak_tok / tok_limit)
            worst_conc = max(worst_conc, stats["max_concurrent"])
        outcome.duplicates += ok - len(answered)
        verdict = "yes" if worst_req <= 1 and worst_tok <= 1 else "NO"
        outcome.limits = (f"{verdict}: peak {worst_req:.0%} of req, {worst_tok:.0%} of tok "
                          f"limit per {self.window_s:g} s; conc {worst_conc:.0f}/"
                          f"{self.concurrency}")


def fleet_specs(fleet: dict) -> tuple[EndpointSpec, ...]:
    return tuple(
        EndpointSpec(name=f"ep{i}", base_url=url, models=(MODEL,),
                     max_concurrency=fleet["concurrency"],
                     requests_per_minute=int(fleet["rps"] * 60),
                     tokens_per_minute=int(fleet["tps"] * 60),
                     rate_limit_window_s=fleet["window_s"])
        for i, url in enumerate(fleet["urls"])
    )


def client_options(scale: Scale, store_url: str | None) -> dict:
    return dict(
        store_url=store_url, request_timeout_s=scale.timeout_s, max_attempts=6,
        retry_initial_backoff_s=0.05, retry_max_backoff_s=1.0, max_retry_after_s=2.0,
        breaker_failure_threshold=5, breaker_cooldown_s=1.0, ledger_flush_interval_s=0.1,
        progress_interval_s=3600.0, coordination_interval_s=0.25,
    )


def infer(client: InferenceClient, df, *, structured: bool = False, **kwargs):
    extra = {"response_format": SCHEMA} if structured else {}
    return client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                        max_tokens=MAX_TOKENS, **extra, **kwargs)


# -- measuring -------------------------------------------------------------------------------

@dataclass
class Outcome:
    """One scenario's figures and the requirements it broke (``problems``: empty when it passed)."""

    name: str
    rows: int = 0
    ok: int = 0
    failed: int = 0
    deferred: int = 0
    missing: int = 0
    wrong: int = 0
    requests: int = 0
    duplicates: int = 0
    allowed_duplicates: int = 0
    tokens: int = 0
    clean_tokens: int | None = None
    budget: int | None = None
    limits: str = ""
    wall_s: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def require(self, condition: bool, problem: str) -> None:
        if not condition:
            self.problems.append(problem)

    def as_row(self) -> list[str]:
        tokens = f"{self.tokens:,}"
        if self.clean_tokens:
            tokens += f" ({self.tokens / self.clean_tokens:.2f}x of {self.clean_tokens:,})"
        if self.budget is not None:
            tokens += f"; budget {self.budget:,}"
        dups = str(self.duplicates)
        if self.allowed_duplicates:
            dups += f" (<= {self.allowed_duplicates} in flight at crashes)"
        return [
            self.name,
            f"{self.ok} / {self.failed} / {self.deferred} / {self.missing}",
            str(self.requests), dups, tokens, self.limits, f"{self.wall_s:.1f}",
        ]


def classify_rows(outcome: Outcome, frames: list, *, structured: bool = False) -> None:
    """Count ok / failed / deferred / missing rows over (input, result) pairs; check answers."""
    for df, result in frames:
        outcome.rows += len(df)
        out = result.df if result is not None else None
        if out is None or len(out) != len(df) or not out.index.equals(df.index):
            outcome.missing += len(df)
            outcome.problems.append("the result lost rows or reordered the index")
            continue
        for ticket, text, value, error in zip(df["ticket"], df["text"], out["summary"],
                                              out["summary_error"], strict=True):
            if error is None and value is not None:
                outcome.ok += 1
                if value != expected_reply(ticket, text, structured):
                    outcome.wrong += 1
            elif isinstance(error, str) and value is None and error.startswith("deferred:"):
                outcome.deferred += 1
            elif (isinstance(error, str) and value is None
                  and error.split(":", 1)[0] in ERROR_CODES and len(error.split(":", 1)[1]) > 2):
                outcome.failed += 1
                code = error.split(":", 1)[0]
                outcome.failures[code] = outcome.failures.get(code, 0) + 1
            else:
                outcome.missing += 1


def finish(outcome: Outcome) -> Outcome:
    outcome.require(outcome.missing == 0, f"{outcome.missing} rows have no outcome")
    outcome.require(outcome.wrong == 0, f"{outcome.wrong} rows got another row's answer")
    outcome.require(outcome.duplicates <= outcome.allowed_duplicates,
                    f"{outcome.duplicates} duplicate deliveries "
                    f"(allowed: {outcome.allowed_duplicates}, the requests in flight at crashes)")
    if outcome.budget is not None:
        outcome.require(outcome.tokens <= outcome.budget,
                        f"the servers billed {outcome.tokens} tokens over a budget of "
                        f"{outcome.budget}")
    return outcome


_CLEAN: dict[tuple, int] = {}


def clean_tokens(scale: Scale, frames: list, *, structured: bool = False) -> int:
    """Tokens the servers bill for these rows with nothing going wrong (cached per data set)."""
    key = (scale.name, structured, tuple((len(df), df.index[0]) for df in frames))
    if key not in _CLEAN:
        with SimulatedEndpoint(models=(MODEL,)) as sim:
            spec = EndpointSpec(name="clean", base_url=sim.base_url, models=(MODEL,),
                                max_concurrency=64)
            client = InferenceClient(InferenceSettings(
                endpoints=(spec,), **{**client_options(scale, None), "coordinate_runs": False}))
            try:
                for df in frames:
                    infer(client, df, structured=structured)
            finally:
                client.close()
            stats = sim.stats(log=False)
            _CLEAN[key] = stats["prompt_tokens"] + stats["completion_tokens"]
    return _CLEAN[key]


class Background:
    """Run ``infer`` on a thread while the scenario breaks things from this one."""

    def __init__(self, fn: Callable[[], object]):
        self.result = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; whether the call has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("infer() did not finish in time")
        if self.error is not None:
            raise self.error
        return self.result


def wait_until(condition: Callable[[], bool], timeout: float, poll_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


def distinct_requests(df) -> int:
    return len(set(zip(df["ticket"], df["text"], strict=True)))


# -- the scenarios ---------------------------------------------------------------------------

def run_in_process(outcome: Outcome, fleet: Fleet, df, during: Callable[[Background], None],
                   *, structured: bool = False, timeout_s: float = 300.0, **infer_kwargs):
    """Infer ``df`` on a thread, let ``during`` break things meanwhile, then measure it all."""
    client = InferenceClient(fleet.settings(store_url=None))
    started = time.perf_counter()
    try:
        job = Background(lambda: infer(client, df, structured=structured, **infer_kwargs))
        try:
            during(job)
            result = job.join(timeout_s)
        finally:
            fleet.configure(latency_s=0.0)  # a stalled job must not hold the stop below
    finally:
        outcome.wall_s = time.perf_counter() - started
        client.close()
        fleet.measure(outcome)
    classify_rows(outcome, [(df, result)], structured=structured)
    outcome.clean_tokens = clean_tokens(fleet.scale, [df], structured=structured)
    return result


def scenario_429_storm(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome(f"1. 429 storm: 30% for {scale.storm_s:g} s (issue: 60 s)")
    df = make_frame(scale.rows)
    fleet = Fleet(scale, 1, error_rate_429=0.3, retry_after_s=scale.retry_after_s)

    def during(job: Background) -> None:
        job.wait(scale.storm_s)
        fleet.configure(error_rate_429=0.0)
        outcome.notes.append(f"storm over after {scale.storm_s:g} s; "
                             f"run still going: {job.running}")

    run_in_process(outcome, fleet, df, during)
    outcome.require(outcome.statuses.get("429", 0) > 0, "the storm sent no 429")
    return finish(outcome)


def scenario_5xx_and_drops(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("2. 10% HTTP 500 + 3% dropped connections")
    df = make_frame(scale.rows)
    fleet = Fleet(scale, 2, error_rate_500=0.10, drop_rate=0.03)
    run_in_process(outcome, fleet, df, lambda job: None)
    outcome.require(outcome.statuses.get("500", 0) > 0 and outcome.statuses.get("drop", 0) > 0,
                    "no 500 or no dropped connection happened")
    return finish(outcome)


def scenario_slow_endpoint(scale: Scale, workdir: Path) -> Outcome:
    slow = scale.timeout_s * 2.5
    outcome = Outcome(f"3. slow endpoint: 1 of 2 goes to {slow:g} s "
                      f"(timeout {scale.timeout_s:g} s)")
    df = make_frame(scale.rows)
    fleet = Fleet(scale, 2)
    target = distinct_requests(df) * 0.2

    def during(job: Background) -> None:
        reached = wait_until(lambda: fleet.answered() >= target or not job.running, 120)
        fleet.sims[0].configure(latency_s=slow)
        outcome.require(reached and job.running, "the run ended before the endpoint slowed")

    run_in_process(outcome, fleet, df, during)
    return finish(outcome)


def scenario_endpoint_death(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome(f"4. 1 of 3 endpoints killed at 30%, 1 restarted ({scale.restart_down_s:g} s"
                      " down)")
    df = make_frame(scale.rows)
    # Slow enough that the last 70% take one endpoint twice the downtime: the restarted one
    # must come back while rows are still being sent.
    fleet = Fleet(scale, 3, rps=min(scale.rps, 0.7 * scale.rows / (2 * scale.restart_down_s)))
    target = distinct_requests(df) * 0.3

    def during(job: Background) -> None:
        reached = wait_until(lambda: fleet.answered() >= target or not job.running, 120)
        outcome.require(reached and job.running, "the run ended before the endpoints died")
        dead, restarted = fleet.sims[0], fleet.sims[1]
        dead.stop()
        restarted.stop()
        time.sleep(scale.restart_down_s)
        outcome.require(job.running, "the run ended while an endpoint was down (make it longer)")
        restarted.start()

    run_in_process(outcome, fleet, df, during)
    return finish(outcome)


def scenario_budget_edge(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("7. token budget runs out mid-batch, concurrency 128")
    df = make_frame(scale.rows)
    # Faster endpoint limits than elsewhere, and latency, so 128 requests really are in flight.
    fleet = Fleet(scale, 1, concurrency=128, rps=scale.rps * 8, tps=scale.tps * 8,
                  latency_s=max(0.1, scale.latency_s))
    outcome.budget = clean_tokens(scale, [df]) // 2
    run_in_process(outcome, fleet, df, lambda job: None, token_budget=outcome.budget)
    outcome.require(outcome.deferred > 0 and outcome.ok > 0,
                    "the budget did not run out mid-batch (no deferred or no ok rows)")
    return finish(outcome)


def scenario_bad_replies(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("8. bad replies: non-JSON, no choices, empty, bad schema, stalled")
    df = make_frame(scale.rows)
    fleet = Fleet(scale, 2, malformed_rate=0.02, no_choices_rate=0.02, empty_rate=0.02,
                  bad_structured_rate=0.02, stall_rate=0.01)
    run_in_process(outcome, fleet, df, lambda job: None, structured=True)
    for code in ("malformed_response", "invalid_structured_output"):
        outcome.require(outcome.failures.get(code, 0) > 0, f"no row failed with {code}")
    outcome.require(outcome.statuses.get("stall", 0) > 0, "no reply stalled")
    return finish(outcome)


# -- scenarios with inferring subprocesses ---------------------------------------------------

def start_worker(job: dict) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "worker",
                             json.dumps(job)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def worker_result(proc: subprocess.Popen, job: dict, timeout_s: float = 300.0):
    """Wait for a worker; its output table, or None (with its stderr as the reason)."""
    import pandas as pd

    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    if proc.returncode != 0:
        return None, (err or b"").decode(errors="replace")[-2000:]
    return pd.read_pickle(job["out"]), ""


def run_worker(job: dict) -> None:
    """The inferring process of scenarios 5 and 6: one ``infer`` call over one partition.

    ``job``: scale (name), fleet (``Fleet.describe()``), store_url, ledger_table, rows, offset
    and seed (of ``make_frame``), partition, out (where the output columns are pickled).
    """
    scale = SCALES[job["scale"]]
    settings = InferenceSettings(
        endpoints=fleet_specs(job["fleet"]),
        **{**client_options(scale, job["store_url"]), "ledger_table": job["ledger_table"]},
    )
    df = make_frame(job["rows"], offset=job["offset"], seed=job["seed"])
    with InferenceClient(settings) as client:
        result = infer(client, df, partition_key=job["partition"], run_id=job["partition"])
    tmp = job["out"] + ".tmp"
    result.df[["summary", "summary_error"]].to_pickle(tmp)
    os.replace(tmp, job["out"])


def ledger_counts(store_url: str, table: str) -> dict[tuple[str, str], int]:
    """(partition, status) -> records, read straight from the ledger database."""
    import sqlalchemy as sa

    from dagster_batchllm.core.ledger.stores import normalize_store_url, validate_identifier

    engine = sa.create_engine(normalize_store_url(store_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                f"SELECT partition_key, status, COUNT(*) FROM {validate_identifier(table)} "
                "GROUP BY partition_key, status")).all()
    finally:
        engine.dispose()
    return {(p, st): int(c) for p, st, c in rows}


class _Table:
    def __init__(self, df):
        self.df = df


def scenario_crash(scale: Scale, workdir: Path) -> Outcome:
    outcome = Outcome("5. SIGKILL x3 at random points, each rerun resumes from the ledger")
    df = make_frame(scale.crash_rows)
    distinct = distinct_requests(df)
    fleet = Fleet(scale, 2)
    store_url, table = f"sqlite:///{workdir / 'crash-ledger.db'}", "batchllm_requests"
    job = {"scale": scale.name, "fleet": fleet.describe(), "store_url": store_url,
           "ledger_table": table, "rows": scale.crash_rows, "offset": 0, "seed": 7,
           "partition": "crash", "out": str(workdir / "crash.pkl")}
    rng = random.Random(5)
    started = time.perf_counter()
    out = None
    try:
        answered_before = recorded_before = 0
        for k in range(3):
            proc = start_worker(job)
            target = answered_before + rng.uniform(0.08, 0.25) * distinct
            wait_until(lambda target=target, proc=proc:
                       fleet.answered() >= target or proc.poll() is not None, 300)
            if proc.poll() is not None:
                # On a small or fast run the rows can all be answered before the kill point;
                # that is a shorter scenario, not a failure (unless the run itself failed).
                finished, error = worker_result(proc, job)
                if finished is None:
                    outcome.problems.append(f"run {k + 1} failed before it was killed: "
                                            f"{error[-300:]}")
                else:
                    outcome.notes.append(f"run {k + 1} finished before its kill point")
                break
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()
            time.sleep(0.3)  # the endpoints see the closed connections and give up on them
            answered_now = fleet.answered()
            recorded = ledger_counts(store_url, table).get(("crash", "ok"), 0)
            lost = (answered_now - answered_before) - (recorded - recorded_before)
            outcome.allowed_duplicates += lost
            outcome.notes.append(f"kill {k + 1}: {answered_now} answered, {recorded} recorded, "
                                 f"{lost} answered but not yet recorded")
            answered_before, recorded_before = answered_now, recorded
        proc = start_worker(job)
        out, error = worker_result(proc, job)
        outcome.require(out is not None, f"the resumed run failed: {error}")
    finally:
        outcome.wall_s = time.perf_counter() - started
        fleet.measure(outcome)
    classify_rows(outcome, [(df, _Table(out) if out is not None else None)])
    outcome.clean_tokens = clean_tokens(scale, [df])
    return finish(outcome)


def scenario_contention(scale: Scale, workdir: Path, backend: str = "sqlite") -> Outcome:
    label = "SQLite" if backend == "sqlite" else "PostgreSQL"
    outcome = Outcome(f"6. 4 processes, overlapping partitions, one {label} ledger")
    n = scale.contention_rows
    parts = [(f"p{i}", i * n // 2) for i in range(4)]
    frames = [make_frame(n, offset=offset) for _, offset in parts]
    table = f"chaos_{uuid.uuid4().hex[:12]}"
    if backend == "sqlite":
        store_url = f"sqlite:///{workdir / 'contention-ledger.db'}"
    else:
        store_url = POSTGRES_URL
        reason = postgres_unavailable()
        if reason:
            outcome.notes.append(f"skipped: {reason}")
            outcome.limits = "skipped"
            return outcome
    fleet = Fleet(scale, 2)
    jobs = [{"scale": scale.name, "fleet": fleet.describe(), "store_url": store_url,
             "ledger_table": table, "rows": n, "offset": offset, "seed": 7, "partition": part,
             "out": str(workdir / f"{backend}-{part}.pkl")} for part, offset in parts]
    started = time.perf_counter()
    results = []
    try:
        procs = [start_worker(job) for job in jobs]
        for proc, job in zip(procs, jobs, strict=True):
            out, error = worker_result(proc, job)
            outcome.require(out is not None, f"partition {job['partition']} failed: {error}")
            results.append(_Table(out) if out is not None else None)
        counts = ledger_counts(store_url, table)
        for (part, _), df in zip(parts, frames, strict=True):
            recorded = sum(c for (p, st), c in counts.items() if p == part and st != "deferred")
            outcome.require(recorded == distinct_requests(df),
                            f"the ledger holds {recorded} records for {part}, "
                            f"expected {distinct_requests(df)}")
    finally:
        outcome.wall_s = time.perf_counter() - started
        fleet.measure(outcome)
        if backend != "sqlite":
            drop_tables(store_url, [table, f"{table}_holders"])
    classify_rows(outcome, list(zip(frames, results, strict=True)))
    outcome.clean_tokens = clean_tokens(scale, frames)
    return finish(outcome)


def postgres_unavailable() -> str | None:
    try:
        import psycopg  # noqa: F401
        import sqlalchemy as sa
    except ImportError:
        return "psycopg is not installed"
    engine = sa.create_engine(POSTGRES_URL)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except Exception as exc:  # any failure to connect: no server here
        return f"PostgreSQL not reachable ({type(exc).__name__})"
    finally:
        engine.dispose()
    return None


def drop_tables(store_url: str, tables: list[str]) -> None:
    import sqlalchemy as sa

    from dagster_batchllm.core.ledger.stores import normalize_store_url, validate_identifier

    engine = sa.create_engine(normalize_store_url(store_url))
    try:
        with engine.begin() as conn:
            for name in tables:
                conn.execute(sa.text(f"DROP TABLE IF EXISTS {validate_identifier(name)}"))
    finally:
        engine.dispose()


SCALES = {"bench": BENCH, "test": TEST}
SCENARIOS: dict[str, Callable[[Scale, Path], Outcome]] = {
    "429_storm": scenario_429_storm,
    "5xx_and_drops": scenario_5xx_and_drops,
    "slow_endpoint": scenario_slow_endpoint,
    "endpoint_death": scenario_endpoint_death,
    "crash": scenario_crash,
    "contention_sqlite": scenario_contention,
    "contention_postgres": lambda scale, workdir: scenario_contention(scale, workdir, "postgres"),
    "budget_edge": scenario_budget_edge,
    "bad_replies": scenario_bad_replies,
}


def run_scenario(name: str, scale: Scale, workdir: Path | None = None, *,
                 scenarios: dict[str, Callable[[Scale, Path], Outcome]] | None = None) -> Outcome:
    """``scenarios``: where ``name`` is looked up (these by default; chaos.py adds others)."""
    scenario = (scenarios or SCENARIOS)[name]
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix=f"chaos-{name}-") as tmp:
            return scenario(scale, Path(tmp))
    return scenario(scale, workdir)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        run_worker(json.loads(sys.argv[2]))
    else:
        sys.exit("usage: chaos_scenarios.py worker '<job json>' (bench/chaos.py runs them all)")
