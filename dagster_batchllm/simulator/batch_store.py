"""Files and batches of one simulated server: records in memory, contents on disk.

Plain data like `SimState` (which holds one): exported and re-loaded as JSON, so batches
survive a restart, and the files stay where they are in ``directory`` (a temp dir the
controller owns), so a 120,000-line input never sits in memory.

A record is the API object (what ``/v1/files`` and ``/v1/batches`` return) plus an ``_sim``
entry of the simulator's own bookkeeping, never sent to clients.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BATCH_WINDOW_S = 24 * 3600  # the only completion_window OpenAI accepts: "24h"
TERMINAL = ("failed", "completed", "expired", "cancelled")
_STAT_COUNTS = ("files_uploaded", "bytes_uploaded", "files_deleted", "batches_created",
                "cancel_requests", "lines_ok", "lines_failed", "lines_expired",
                "line_duplicates", "line_prompt_tokens", "line_completion_tokens",
                "api_requests")


def public(record: dict) -> dict:
    """The API object of a record: everything but the simulator's ``_sim`` bookkeeping."""
    return {key: value for key, value in record.items() if not key.startswith("_")}


class BatchStore:
    def __init__(self):
        self.directory: str | None = None
        self.files: dict[str, dict] = {}
        self.batches: dict[str, dict] = {}
        self.serial = 0  # ids stay unique across restarts: the counter is exported
        self.reset_stats()

    def reset_stats(self) -> None:
        for name in _STAT_COUNTS:
            setattr(self, name, 0)
        self.api_by_status: dict[str, int] = {}
        self.lines_by_status: dict[str, int] = {}
        self.answered_lines: set[str] = set()

    def next_id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial:06d}"

    def path(self, name: str) -> Path:
        if self.directory is None:
            raise RuntimeError("the batch store has no directory yet")
        return Path(self.directory) / name

    # -- files -----------------------------------------------------------------------

    def add_file(self, path: Path, filename: str, purpose: str) -> dict:
        """Register a file already written at ``path`` (renamed to its id's name)."""
        file_id = self.next_id("file-sim")
        final = self.path(f"{file_id}.jsonl")
        os.replace(path, final)
        record = {"id": file_id, "object": "file", "bytes": final.stat().st_size,
                  "created_at": int(time.time()), "filename": filename, "purpose": purpose,
                  "status": "processed", "expires_at": None, "status_details": None,
                  "_path": str(final)}
        self.files[file_id] = record
        return record

    def list_files(self, purpose: str | None = None) -> list[dict]:
        """Newest first, as OpenAI lists them."""
        records = [r for r in self.files.values() if purpose in (None, r["purpose"])]
        return [public(r) for r in reversed(records)]

    def delete_file(self, file_id: str) -> None:
        record = self.files.pop(file_id)
        Path(record["_path"]).unlink(missing_ok=True)
        self.files_deleted += 1

    # -- batches ---------------------------------------------------------------------

    def add_batch(self, input_file_id: str, endpoint: str, metadata: dict | None) -> dict:
        batch_id = self.next_id("batch_sim")
        now = time.time()
        record = {
            "id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": "24h",
            "status": "validating", "output_file_id": None, "error_file_id": None,
            "created_at": int(now), "in_progress_at": None,
            "expires_at": int(now) + BATCH_WINDOW_S, "finalizing_at": None,
            "completed_at": None, "failed_at": None, "expired_at": None,
            "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata, "model": None,
            "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": 0},
            "_sim": {"stage_since": now, "offset": 0, "line": 0, "release": None,
                     "line_target": None, "expire_after": None, "expire_now": False,
                     "output": str(self.path(f"{batch_id}.output.jsonl")),
                     "errors": str(self.path(f"{batch_id}.errors.jsonl"))},
        }
        self.batches[batch_id] = record
        self.batches_created += 1
        return record

    def list_batches(self) -> list[dict]:
        """Newest first, with each batch's progress under ``lines_read``."""
        return [{**public(r), "lines_read": r["_sim"]["line"]}
                for r in reversed(self.batches.values())]

    def active(self) -> list[dict]:
        return [r for r in self.batches.values() if r["status"] not in TERMINAL]

    def running_input(self, file_id: str) -> str | None:
        """The id of an unfinished batch reading this file, if any."""
        return next((r["id"] for r in self.active() if r["input_file_id"] == file_id), None)

    # -- stats and persistence -------------------------------------------------------

    def count_api_status(self, status: int) -> None:
        self.api_by_status[str(status)] = self.api_by_status.get(str(status), 0) + 1

    def count_line(self, status: int, key: str | None) -> None:
        """One answered line; ``key`` (its body's request key) when it was answered 200."""
        self.lines_by_status[str(status)] = self.lines_by_status.get(str(status), 0) + 1
        if key is None:
            self.lines_failed += 1
            return
        self.lines_ok += 1
        if key in self.answered_lines:
            self.line_duplicates += 1
        else:
            self.answered_lines.add(key)

    def stats(self) -> dict:
        by_state: dict[str, int] = {}
        for record in self.batches.values():
            by_state[record["status"]] = by_state.get(record["status"], 0) + 1
        out = {name: getattr(self, name) for name in _STAT_COUNTS}
        out.update(lines_answered=self.lines_ok + self.lines_failed,
                   api_by_status=dict(self.api_by_status),
                   lines_by_status=dict(self.lines_by_status),
                   batches_by_status=by_state, files=len(self.files))
        return out

    def export(self) -> dict:
        return {"directory": self.directory, "files": self.files, "batches": self.batches,
                "serial": self.serial, "stats": {name: getattr(self, name)
                                                 for name in _STAT_COUNTS},
                "api_by_status": self.api_by_status, "lines_by_status": self.lines_by_status,
                "answered_lines": sorted(self.answered_lines)}

    def load(self, data: dict) -> None:
        self.directory = data["directory"]
        self.files, self.batches = dict(data["files"]), dict(data["batches"])
        self.serial = data["serial"]
        for name in _STAT_COUNTS:
            setattr(self, name, data["stats"][name])
        self.api_by_status = dict(data["api_by_status"])
        self.lines_by_status = dict(data["lines_by_status"])
        self.answered_lines = set(data["answered_lines"])
