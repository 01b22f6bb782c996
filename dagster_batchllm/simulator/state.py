"""The simulated server's memory: `SimState`, the server's `ServingState` (protocol limits and
stats) plus settings, fault scripts, rate-limit windows, a prefix cache and batches.

Plain Python with no event loop or aiohttp, so the controller can hold the same object
while the server is stopped and hand it to the next server on restart.
"""

from __future__ import annotations

import random
from collections import deque

from ..openai_server.state import SERVING_CONFIG, ServingState
from .batch_store import BatchStore
from .prefix_cache import PrefixCache, prompt_stream

FAULT_RATES = {
    "error_rate_429": 429,
    "error_rate_500": 500,
    "error_rate_503": 503,
    "drop_rate": "drop",
    "malformed_rate": "malformed",
    "no_choices_rate": "no_choices",
    "empty_rate": "empty",
    "bad_structured_rate": "bad_structured",
    "stall_rate": "stall",
    "drop_mid_body_rate": "drop_mid_body",
}
# Seconds a batch spends in each stage; None holds it there until advance_batches().
BATCH_STAGES = ("batch_validating_s", "batch_in_progress_s", "batch_finalizing_s",
                "batch_cancelling_s")
DEFAULT_CONFIG = {
    **SERVING_CONFIG,
    "latency_s": 0.0,
    "retry_after_s": 1.0,
    "seed": 0,
    "requests_per_minute": None,
    "tokens_per_minute": None,
    "rate_limit_window_s": 60.0,
    # chat and completions: a prefix cache of this many tokens (0: none; see prefix_cache.py)
    # and the latency each prompt token it did not hold adds
    "prefix_cache_tokens": 0,
    "prefill_s_per_token": 0.0,
    # A careless server (see misbehaving.py): error messages that quote the request's
    # credentials, and 200 replies padded to this many bytes (0: none), with or without a
    # Content-Length
    "echo_credentials": False,
    "huge_reply_bytes": 0,
    "huge_reply_declared": True,
    # A server whose figures are wrong: usage fields reported instead of the counted ones
    # (e.g. {"prompt_tokens": 10**15} or {"completion_tokens": -10**6}, 1.5, "abc"), merged
    # into the usage of this share of 200 replies (chat, completions, embeddings, batch
    # lines); the stats keep the counted usage, what an honest bill would say.
    "reported_usage": None,
    "reported_usage_rate": 1.0,
    **dict.fromkeys(FAULT_RATES, 0.0),
    "embedding_latency_s": None,  # None: latency_s
    # Files and Batches
    **dict.fromkeys(BATCH_STAGES, 0.0),
    "batch_line_error_rate": 0.0,
    "batch_line_error_status": 500,
    "batch_expire_after_fraction": None,  # expire once this share of lines is answered
    "batch_max_lines": None,
    "batch_api_latency_s": 0.0,
}
SPECIAL_OUTCOMES = ("ok", "drop", "malformed", "no_choices", "empty", "bad_structured", "stall",
                    "drop_mid_body")
# Which requests each script steers: model requests, Files/Batches calls, batch lines.
SCRIPT_TARGETS = {"requests": SPECIAL_OUTCOMES, "batch_api": ("ok", "drop"),
                  "batch_lines": ("ok",)}


def normalize_outcome(outcome: int | str, target: str = "requests") -> int | str:
    """200/"ok" -> "ok"; HTTP error statuses -> int; named faults stay strings."""
    allowed = SCRIPT_TARGETS[target]
    if outcome in (200, "200", "ok"):
        return "ok"
    if isinstance(outcome, str) and outcome.isdigit():
        outcome = int(outcome)
    if isinstance(outcome, int) and not isinstance(outcome, bool) and 400 <= outcome <= 599:
        return outcome
    if outcome in allowed:
        return outcome
    raise ValueError(f"unknown outcome {outcome!r}; use an HTTP error status or {allowed}")


def max_in_window(log: list, window_s: float, what: str = "requests") -> float:
    """Peak requests (or prompt+completion tokens) whose arrival falls in any window_s window."""
    if what == "requests":
        events = sorted((entry[0], 1) for entry in log)
    elif what == "tokens":
        events = sorted((entry[0], entry[2] + entry[3]) for entry in log if entry[2] or entry[3])
    else:
        raise ValueError("what must be 'requests' or 'tokens'")
    best = current = start = 0
    for t, weight in events:
        current += weight
        while events[start][0] <= t - window_s:
            current -= events[start][1]
            start += 1
        best = max(best, current)
    return best


class SimState(ServingState):
    """Config, pending scripts, statistics and batch records of one simulated server.

    It is plain data (no event loop), exported and re-loaded as JSON so stats, the
    duplicate memory and batches survive `SimulatedEndpoint.restart` in both thread and
    process mode. Batch file contents live on disk, in ``store.directory``.
    """

    DEFAULTS = DEFAULT_CONFIG

    def __init__(self, config: dict | None = None):
        self.scripts: dict[str, deque] = {target: deque() for target in SCRIPT_TARGETS}
        self.rng = random.Random(0)
        self.line_rng = random.Random(0)  # batch lines draw apart, so timing cannot reorder them
        self._faults: list[tuple[float, int | str]] = []
        self._window_requests: deque = deque()
        self._window_tokens: deque = deque()
        self._window_token_sum = 0
        self.store = BatchStore()
        self.prefix_cache = PrefixCache()
        super().__init__(config)

    @property
    def script(self) -> deque:
        """The model-request script (chat, completions, embeddings)."""
        return self.scripts["requests"]

    def configure(self, **changes) -> None:
        super().configure(**changes)
        if "prefix_cache_tokens" in changes:
            self.prefix_cache.resize(self.config["prefix_cache_tokens"])
        if "seed" in changes:
            self.rng.seed(changes["seed"])
            self.line_rng.seed(changes["seed"])
        # Cumulative thresholds, so picking a random fault costs one rng draw.
        self._faults, total = [], 0.0
        for key, outcome in FAULT_RATES.items():
            if self.config[key]:
                total += float(self.config[key])
                self._faults.append((total, outcome))

    def reported_usage(self, counted: dict) -> dict:
        """The usage a reply reports: the counted one, or with the configured
        ``reported_usage`` fields instead (on ``reported_usage_rate`` of the replies)."""
        wrong = self.config["reported_usage"]
        if not wrong:
            return counted
        rate = self.config["reported_usage_rate"]
        if rate < 1.0 and self.rng.random() >= rate:
            return counted
        return {**counted, **wrong}

    def prefill(self, laid_out: list[tuple[str, str]], prompt_tokens: int
                ) -> tuple[int | None, float]:
        """The prompt tokens the prefix cache held (None without one) and the prefill latency
        (``prefill_s_per_token`` per prompt token not cached)."""
        cache = self.prefix_cache
        cached = cache.serve(prompt_stream(laid_out), prompt_tokens) if cache.enabled else None
        per_token = self.config["prefill_s_per_token"] or 0.0
        return cached, per_token * (prompt_tokens - (cached or 0))

    def push_script(self, outcomes: list, target: str = "requests") -> None:
        if target not in SCRIPT_TARGETS:
            raise ValueError(f"unknown script target {target!r}; known: {sorted(SCRIPT_TARGETS)}")
        self.scripts[target].extend(normalize_outcome(o, target) for o in outcomes)

    def next_outcome(self) -> int | str:
        if self.script:
            return self.script.popleft()
        if self._faults:
            draw = self.rng.random()
            for threshold, outcome in self._faults:
                if draw < threshold:
                    return outcome
        return "ok"

    def next_api_outcome(self) -> int | str:
        script = self.scripts["batch_api"]
        return script.popleft() if script else "ok"

    def next_line_outcome(self) -> int | str:
        script = self.scripts["batch_lines"]
        if script:
            return script.popleft()
        rate = self.config["batch_line_error_rate"]
        if rate and self.line_rng.random() < rate:
            return int(self.config["batch_line_error_status"])
        return "ok"

    def reset_stats(self) -> None:
        super().reset_stats()
        self.store.reset_stats()
        self.prefix_cache.reset_stats()

    @property
    def log(self) -> list[list]:
        """The chat and completions log (what max_in_window reads)."""
        return self.chat.log

    @property
    def answered(self) -> set[str]:
        """Request keys of the chat and completions ok answers (read by
        dagster_batchllm.testing.chaos)."""
        return self.chat.answered

    def admit(self, now: float, cost: int) -> float | None:
        """Sliding-window limit: seconds to wait when over, else None (and charge the request)."""
        rpm, tpm = self.config["requests_per_minute"], self.config["tokens_per_minute"]
        if not rpm and not tpm:
            return None
        window = float(self.config["rate_limit_window_s"])
        requests, charged = self._window_requests, self._window_tokens
        while requests and requests[0] <= now - window:
            requests.popleft()
        while charged and charged[0][0] <= now - window:
            self._window_token_sum -= charged.popleft()[1]
        if rpm and len(requests) + 1 > rpm * window / 60.0:
            return max(requests[0] + window - now, 0.001) if requests else window
        if tpm and self._window_token_sum + cost > tpm * window / 60.0:
            # Wait until enough charged tokens leave the window (a whole window if never).
            excess, wait = self._window_token_sum + cost - tpm * window / 60.0, window
            for t, spent in charged:
                excess -= spent
                if excess <= 0:
                    wait = t + window - now
                    break
            return max(wait, 0.001)
        requests.append(now)
        charged.append((now, cost))
        self._window_token_sum += cost
        return None

    def stats(self, with_log: bool = True) -> dict:
        out = super().stats(with_log)
        out["script_pending"] = len(self.script)
        out["prefix_cache"] = self.prefix_cache.stats()
        out["batches"] = {**self.store.stats(), "api_script_pending": len(self.scripts[
            "batch_api"]), "line_script_pending": len(self.scripts["batch_lines"])}
        return out

    def export(self) -> dict:
        return {
            **super().export(),
            "scripts": {target: list(script) for target, script in self.scripts.items()},
            "rng": _rng_export(self.rng), "line_rng": _rng_export(self.line_rng),
            "store": self.store.export(), "prefix_cache": self.prefix_cache.export(),
        }

    def load(self, data: dict) -> None:
        super().load(data)
        self.scripts = {target: deque(data["scripts"].get(target, ()))
                        for target in SCRIPT_TARGETS}
        _rng_load(self.rng, data["rng"])
        _rng_load(self.line_rng, data["line_rng"])
        self.store.load(data["store"])
        self.prefix_cache.load(data.get("prefix_cache", {}))

    def control(self, name: str, payload: dict) -> dict:
        """Apply one admin command; the /_sim/ routes and a stopped controller both use this."""
        if name == "script":
            target = payload.get("target", "requests")
            self.push_script(list(payload["outcomes"]), target)
            return {"script_pending": len(self.scripts[target])}
        if name == "max_in_window":
            what = payload.get("what", "requests")
            return {"value": max_in_window(self.log, float(payload["window_s"]), what)}
        if name == "batches":
            return {"data": self.store.list_batches()}
        if name == "files":
            return {"data": self.store.list_files()}
        if name == "kill":
            self.prefix_cache.clear()  # a dead server's GPU memory is gone
        if name in SERVER_COMMANDS:
            raise ValueError(f"{name} needs a running server")
        return super().control(name, payload)


def _rng_export(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_load(rng: random.Random, data: list) -> None:
    version, internal, gauss = data
    rng.setstate((version, tuple(internal), gauss))


# Admin commands that need the running server's event loop (they process batch lines).
SERVER_COMMANDS = ("advance_batches", "expire_batches", "settle_batches")
