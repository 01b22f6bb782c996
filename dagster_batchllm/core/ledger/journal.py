"""A run's answers on local disk before the ledger has them, so a killed process loses none.

The ledger is written in batches (see :mod:`.ledger_writer`); a SIGKILL, an out-of-memory kill
or a pod evicted past its grace period loses the batch not written yet, and a rerun pays for
those answers again. So each paid-for answer is first appended to a journal file of its run,
one JSON line, by a single ``write`` (in the kernel's hands once it returns: a killed process
loses nothing written). A run that ends removes its journal; the next run on the same ledger
folds the journals of runs that died into the ledger before it looks anything up. A rerun then
pays again only for the requests that were in flight.

Each journal is locked (``flock``) by its live run, so another run never folds a journal that
is still being written; the lock ends with the process, however it ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no journal (the ledger's batches are all there is)
    fcntl = None  # type: ignore[assignment]

from .stores import redact_url
from .table import Ledger

_SUFFIX = ".jsonl"
_FOLD_BATCH = 500
_LINES_PER_WRITE = 256
_encode = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per line


class JsonSafeText(str):
    """Text known to need no escaping in JSON (base64 checked by a strict decode, say): the
    journal writes it between quotes as it is. An embedding's 2 KB of base64 per row was the
    bulk of the journal's CPU, spent finding nothing to escape."""

    __slots__ = ()


def _array_line(values: list[Any], safe_at: int) -> str:
    """``values`` as a JSON array, the JSON-safe text at ``safe_at`` spliced in unescaped."""
    text = values[safe_at] if safe_at >= 0 else None
    if type(text) is not JsonSafeText:
        return _encode(values)
    head = _encode(values[:safe_at])[:-1]  # "[a,b" ("[" when nothing comes before)
    tail = _encode(values[safe_at + 1:])[1:]  # "c,d]" ("]" when nothing comes after)
    return (f'{head}{"," if safe_at else ""}"{text}"'
            f'{"," if len(values) > safe_at + 1 else ""}{tail}')


def journal_dir_for(ledger: Ledger) -> Path | None:
    """Where the journals of ``ledger``'s runs live: next to a SQLite file, else in the temp
    dir under a name derived from the database and table (None for an in-memory ledger)."""
    if ledger.in_memory or fcntl is None:
        return None
    url = ledger.engine.url
    if url.get_backend_name() == "sqlite" and url.database:
        return Path(url.database).resolve().parent / f".{Path(url.database).name}.journal"
    digest = hashlib.sha256(
        f"{redact_url(ledger.url)}|{ledger.table.fullname}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "batchllm-journal" / digest


class AnswerJournal:
    """This run's journal file; ``append`` a record, ``close`` (removing it) at the end."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.path = directory / f"{name}{_SUFFIX}"
        # Locked under a name folding ignores, then renamed (the lock stays with the file): a
        # run that folds at the same moment never takes an unlocked new journal for a dead one.
        creating = directory / f"{name}.creating"
        self._fd = os.open(creating, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(creating, self.path)
        self._fields: tuple[str, ...] | None = None  # those of the last object line
        self._safe_at = -1  # where "response" is among them

    def append(self, record: dict[str, Any]) -> None:
        self.append_many([record])

    def append_many(self, records: list[dict[str, Any]]) -> None:
        """A ``write`` per ``_LINES_PER_WRITE`` records (a grouped reply's answers arrive
        together; one event-loop turn may bring thousands, whose single write would hold
        their text three times over at once).

        A record with the same fields as the object line before it is written as a JSON array
        of its values (half the CPU of an object, which a run pays for every answer); the
        reader takes the field names from that object line."""
        for start in range(0, len(records), _LINES_PER_WRITE):
            lines = []
            fields, safe_at = self._fields, self._safe_at
            for record in records[start:start + _LINES_PER_WRITE]:
                keys = tuple(record)
                if keys == fields:
                    lines.append(_array_line(list(record.values()), safe_at))
                else:
                    lines.append(_encode(record))
                    fields = keys
                    safe_at = keys.index("response") if "response" in keys else -1
            lines.append("")
            os.write(self._fd, "\n".join(lines).encode())
            self._fields, self._safe_at = fields, safe_at  # once its object line is written

    def close(self, *, remove: bool) -> None:
        """``remove``: every record is in the ledger; otherwise the next run folds it."""
        if self._fd < 0:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        os.close(self._fd)  # after the unlink: no other run can fold it in between
        self._fd = -1


def fold_abandoned(directory: Path | None, ledger: Ledger, log: Any) -> int:
    """Write the records of journals whose run has died into ``ledger``; remove them.

    Blocking (run it on a thread). Returns the records folded. A journal that cannot be read
    or written stays for the next run, with a warning."""
    if directory is None or not directory.is_dir():
        return 0
    folded = 0
    for path in sorted(directory.glob(f"*{_SUFFIX}")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # folded by another run just now
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its run is alive
                continue
            records = read_records(path)
            for start in range(0, len(records), _FOLD_BATCH):
                ledger.upsert(records[start:start + _FOLD_BATCH])
            path.unlink()
            folded += len(records)
        except Exception as exc:  # kept for the next run; this run sends those requests
            log.warning(f"batchllm: could not fold the answers journal {path} into the ledger "
                        f"(kept for the next run): {type(exc).__name__}: {exc}")
        finally:
            os.close(fd)
    if folded:
        log.info(f"batchllm: folded {folded} answers of interrupted runs from {directory} "
                 "into the ledger")
    return folded


def read_records(path: Path) -> list[dict[str, Any]]:
    """A journal's records as dicts: object lines, and array lines that take the field names
    of the object line before them; a last line cut off by a kill is not a record."""
    records = []
    fields: list[str] = []
    with path.open("rb") as lines:
        for line in lines:
            if not line.endswith(b"\n"):
                break  # cut off by the kill: that answer was never acknowledged
            record = json.loads(line)
            if isinstance(record, list):  # the fields of the last object line
                records.append(dict(zip(fields, record, strict=True)))
            else:
                records.append(record)
                fields = list(record)
    return records
