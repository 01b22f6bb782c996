"""A server's memory: its protocol limits (config) and what it has served (stats).

Plain Python with no event loop or aiohttp, so an endpoint's controller can hold the same object
while the server is stopped, and hand it (or its JSON export, to a subprocess) to the next
server on restart. The simulator's state extends it with fault scripts, rate limits and
batches.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# The protocol's limits, each as OpenAI or vLLM has one.
SERVING_CONFIG: dict[str, Any] = {
    "max_context_tokens": None,  # None: no limit
    # /v1/embeddings
    "embedding_dimensions": 384,
    "max_inputs_per_request": 2048,
    "embedding_base64": True,
    "embedding_max_context_tokens": None,  # None: max_context_tokens
    # image parts of chat messages
    "max_image_bytes": 20 * 1024 * 1024,
}


def request_key(body: dict) -> str:
    """The duplicate-detection key of a request body: a hash of its canonical JSON."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(canonical.encode(), digest_size=12).hexdigest()


class Tally:
    """Counters of one API: chat + completions, or embeddings.

    ``log`` holds one [t_monotonic, status_or_outcome, prompt_tokens, completion_tokens
    (embeddings: inputs)] row per request at arrival; ``answered`` the request keys of ok
    answers, to count duplicates.
    """

    COUNTS = ("requests", "ok", "dropped", "stalled", "duplicates", "prompt_tokens",
              "completion_tokens", "inputs")

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        for name in self.COUNTS:
            setattr(self, name, 0)
        self.by_status: dict[str, int] = {}
        self.answered: set[str] = set()
        self.log: list[list] = []

    def count_status(self, status: int) -> None:
        key = str(status)
        self.by_status[key] = self.by_status.get(key, 0) + 1

    def count_ok(self, body: dict) -> None:
        self.ok += 1
        key = request_key(body)
        if key in self.answered:
            self.duplicates += 1
        else:
            self.answered.add(key)

    def as_dict(self, skip: tuple[str, ...] = (), with_log: bool = True) -> dict:
        out = {name: getattr(self, name) for name in self.COUNTS if name not in skip}
        out["by_status"] = dict(self.by_status)
        if with_log:
            out["log"] = [list(entry) for entry in self.log]
        return out

    def export(self) -> dict:
        return {**self.as_dict(), "answered": sorted(self.answered)}

    def load(self, data: dict) -> None:
        for name in self.COUNTS:
            setattr(self, name, data[name])
        self.by_status = dict(data["by_status"])
        self.answered = set(data["answered"])
        self.log = [list(entry) for entry in data["log"]]


class ImageTally:
    """Images received in chat requests: totals, and one record per request that had any."""

    COUNTS = ("requests", "images", "bytes", "remote", "rejected")

    def __init__(self):
        for name in self.COUNTS:
            setattr(self, name, 0)
        self.records: list[dict] = []

    def record(self, entry: list, images: list, prompt: str) -> None:
        """``entry`` is the request's log row: its status is read when stats are asked for."""
        self.requests += 1
        self.images += len(images)
        self.bytes += sum(image.size for image in images)
        self.remote += sum(1 for image in images if image.remote)
        self.records.append({"entry": entry, "prompt": prompt[:200],
                             "sha256": [image.sha256 for image in images],
                             "bytes": sum(image.size for image in images),
                             "remote": sum(1 for image in images if image.remote)})

    def as_dict(self, with_log: bool = True) -> dict:
        out = {name: getattr(self, name) for name in self.COUNTS}
        if with_log:
            out["log"] = [{"status": r["entry"][1], **{k: v for k, v in r.items() if k != "entry"}}
                          for r in self.records]
        return out

    def load(self, data: dict) -> None:
        for name in self.COUNTS:
            setattr(self, name, data[name])
        self.records = [{"entry": [0.0, r["status"], 0, 0],
                         **{k: v for k, v in r.items() if k != "status"}} for r in data["log"]]


class ServingState:
    """Config and statistics of one server, exported and re-loaded as JSON so they survive a
    restart in both thread and process mode."""

    #: The settings `configure` knows, with their defaults.
    DEFAULTS: dict[str, Any] = SERVING_CONFIG

    def __init__(self, config: dict | None = None):
        self.config = dict(self.DEFAULTS)
        self.killed = False  # set by the kill admin command: answer nothing more
        self.in_flight = 0
        self.configure(**(config or {}))
        self.reset_stats()

    def configure(self, **changes: Any) -> None:
        unknown = set(changes) - set(self.DEFAULTS)
        if unknown:
            raise ValueError(f"unknown setting(s) {sorted(unknown)}; "
                             f"known: {sorted(self.DEFAULTS)}")
        self.config.update(changes)

    def reported_usage(self, counted: dict) -> dict:
        """The usage a reply reports: the usage counted."""
        return counted

    def prefill(self, laid_out: list[tuple[str, str]], prompt_tokens: int
                ) -> tuple[int | None, float]:
        """The prompt tokens a prefix cache held (None: no cache) and the latency the rest adds,
        for a prompt laid out as (role, text) pairs: none here."""
        return None, 0.0

    def reset_stats(self) -> None:
        self.chat, self.embeddings, self.images = Tally(), Tally(), ImageTally()
        self.max_concurrent = self.in_flight

    def stats(self, with_log: bool = True) -> dict:
        """Counters since start or reset_stats(): chat and completions at the top level, then
        ``embeddings`` and ``images``; ``log`` (chat and completions) unless ``with_log`` is
        false."""
        out = self.chat.as_dict(skip=("inputs",), with_log=False)
        out.update(max_concurrent=self.max_concurrent, in_flight=self.in_flight)
        out["embeddings"] = self.embeddings.as_dict(skip=("completion_tokens",), with_log=with_log)
        out["images"] = self.images.as_dict(with_log)
        if with_log:
            out["log"] = [list(entry) for entry in self.chat.log]
        return out

    def export(self) -> dict:
        return {"config": dict(self.config), "max_concurrent": self.max_concurrent,
                "chat": self.chat.export(), "embeddings": self.embeddings.export(),
                "images": self.images.as_dict()}

    @classmethod
    def from_export(cls, data: dict) -> ServingState:
        state = cls()
        state.load(data)
        return state

    def load(self, data: dict) -> None:
        self.configure(**data["config"])
        self.max_concurrent = data["max_concurrent"]
        self.chat.load(data["chat"])
        self.embeddings.load(data["embeddings"])
        self.images.load(data["images"])

    def control(self, name: str, payload: dict) -> dict:
        """Apply one admin command (the server's admin route, or a stopped controller's)."""
        if name == "stats":
            return self.stats(with_log=payload.get("log", True) not in (False, "0", "false"))
        if name == "reset_stats":
            self.reset_stats()
            return {}
        if name == "configure":
            self.configure(**payload)
            return dict(self.config)
        if name == "kill":
            self.killed = True
            return self.export() if payload.get("export", True) else {}
        if name == "health":
            return {"ok": True}
        raise KeyError(f"unknown admin command {name!r}")
