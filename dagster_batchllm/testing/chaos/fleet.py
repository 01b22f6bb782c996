"""The chaos suite's sizes, its simulated endpoints (rate limits enforced and measured on their
side) and the clients' settings."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ...core import EndpointSpec, InferenceClient, InferenceSettings
from ...simulator.endpoint import SimulatedEndpoint
from .data import MAX_TOKENS, MODEL, PROMPT, SCHEMA
from .outcome import Outcome, classify_rows


@dataclass(frozen=True)
class Scale:
    """How big and how long each scenario is; ``BENCH`` for bench/chaos.py, ``TEST`` for
    pytest."""

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
SCALES = {"bench": BENCH, "test": TEST}


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

    def in_flight(self) -> int:
        return sum(sim.stats(log=False)["in_flight"] for sim in self.sims)

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


@contextlib.contextmanager
def measured(outcome: Outcome, fleet: Fleet) -> Iterator[None]:
    """Times the block into ``outcome.wall_s``, then (whatever happened) stops the fleet and
    reads its figures into ``outcome``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        outcome.wall_s = time.perf_counter() - started
        fleet.measure(outcome)


def tally(outcome: Outcome, scale: Scale, frames: list, *, structured: bool = False) -> None:
    """Classify the rows of (input, output or None) pairs and price them with nothing going
    wrong (``clean_tokens``)."""
    classify_rows(outcome, frames, structured=structured)
    outcome.clean_tokens = clean_tokens(scale, [df for df, _ in frames], structured=structured)
