"""The simulated server's memory: settings, fault script, rate-limit windows and stats.

Plain Python with no event loop or aiohttp, so the controller can hold the same object
while the server is stopped and hand it to the next server on restart.
"""

from __future__ import annotations

import random
from collections import deque

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
}
DEFAULT_CONFIG = {
    "latency_s": 0.0,
    "retry_after_s": 1.0,
    "seed": 0,
    "max_context_tokens": None,
    "requests_per_minute": None,
    "tokens_per_minute": None,
    "rate_limit_window_s": 60.0,
    **dict.fromkeys(FAULT_RATES, 0.0),
}
SPECIAL_OUTCOMES = ("ok", "drop", "malformed", "no_choices", "empty", "bad_structured", "stall")


def tokens(text: str) -> int:
    """The simulator's token count: one token per 4 characters, rounded up."""
    return (len(text) + 3) // 4


def normalize_outcome(outcome: int | str) -> int | str:
    """200/"ok" -> "ok"; HTTP error statuses -> int; named faults stay strings."""
    if outcome in (200, "200", "ok"):
        return "ok"
    if isinstance(outcome, str) and outcome.isdigit():
        outcome = int(outcome)
    if isinstance(outcome, int) and not isinstance(outcome, bool) and 400 <= outcome <= 599:
        return outcome
    if outcome in SPECIAL_OUTCOMES:
        return outcome
    raise ValueError(f"unknown outcome {outcome!r}; use an HTTP error status or {SPECIAL_OUTCOMES}")


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


class SimState:
    """Config, pending script and statistics of one simulated server.

    It is plain data (no event loop), exported and re-loaded as JSON so stats and the
    duplicate memory survive `SimulatedEndpoint.restart` in both thread and process mode.
    """

    def __init__(self, config: dict | None = None):
        self.config = dict(DEFAULT_CONFIG)
        self.script: deque = deque()
        self.rng = random.Random(0)
        self.killed = False  # set by /_sim/kill: answer nothing more, like a dead server
        self._faults: list[tuple[float, int | str]] = []
        self._window_requests: deque = deque()
        self._window_tokens: deque = deque()
        self._window_token_sum = 0
        self.in_flight = 0
        self.configure(**(config or {}))
        self.reset_stats()

    def configure(self, **changes) -> None:
        unknown = set(changes) - set(DEFAULT_CONFIG)
        if unknown:
            raise ValueError(f"unknown setting(s) {sorted(unknown)}; "
                             f"known: {sorted(DEFAULT_CONFIG)}")
        self.config.update(changes)
        if "seed" in changes:
            self.rng.seed(changes["seed"])
        # Cumulative thresholds, so picking a random fault costs one rng draw.
        self._faults, total = [], 0.0
        for key, outcome in FAULT_RATES.items():
            if self.config[key]:
                total += float(self.config[key])
                self._faults.append((total, outcome))

    def push_script(self, outcomes: list) -> None:
        self.script.extend(normalize_outcome(o) for o in outcomes)

    def next_outcome(self) -> int | str:
        if self.script:
            return self.script.popleft()
        if self._faults:
            draw = self.rng.random()
            for threshold, outcome in self._faults:
                if draw < threshold:
                    return outcome
        return "ok"

    def reset_stats(self) -> None:
        self.requests = self.ok = self.dropped = self.stalled = self.duplicates = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.max_concurrent = self.in_flight
        self.by_status: dict[str, int] = {}
        self.answered: set[str] = set()
        self.log: list[list] = []

    def count_status(self, status: int) -> None:
        key = str(status)
        self.by_status[key] = self.by_status.get(key, 0) + 1

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
        out = {
            "requests": self.requests,
            "ok": self.ok,
            "by_status": dict(self.by_status),
            "dropped": self.dropped,
            "stalled": self.stalled,
            "max_concurrent": self.max_concurrent,
            "in_flight": self.in_flight,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "duplicates": self.duplicates,
            "script_pending": len(self.script),
        }
        if with_log:
            out["log"] = [list(entry) for entry in self.log]
        return out

    def export(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {
            "config": dict(self.config),
            "script": list(self.script),
            "rng": [version, list(internal), gauss],
            "stats": {**self.stats(), "answered": sorted(self.answered)},
        }

    @classmethod
    def from_export(cls, data: dict) -> SimState:
        state = cls()
        state.load(data)
        return state

    def load(self, data: dict) -> None:
        self.configure(**data["config"])
        self.script = deque(data["script"])
        version, internal, gauss = data["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        stats = data["stats"]
        for key in ("requests", "ok", "dropped", "stalled", "duplicates", "max_concurrent"):
            setattr(self, key, stats[key])
        self.prompt_tokens = stats["prompt_tokens"]
        self.completion_tokens = stats["completion_tokens"]
        self.by_status = dict(stats["by_status"])
        self.answered = set(stats["answered"])
        self.log = [list(entry) for entry in stats["log"]]


def control(state: SimState, name: str, payload: dict) -> dict:
    """Apply one admin command; the /_sim/ routes and a stopped controller both use this."""
    if name == "stats":
        return state.stats(with_log=payload.get("log", True) not in (False, "0", "false"))
    if name == "script":
        state.push_script(list(payload["outcomes"]))
        return {"script_pending": len(state.script)}
    if name == "configure":
        state.configure(**payload)
        return dict(state.config)
    if name == "reset_stats":
        state.reset_stats()
        return {}
    if name == "max_in_window":
        what = payload.get("what", "requests")
        return {"value": max_in_window(state.log, float(payload["window_s"]), what)}
    if name == "kill":
        state.killed = True
        return state.export() if payload.get("export", True) else {}
    if name == "health":
        return {"ok": True}
    raise KeyError(f"unknown admin command {name!r}")
