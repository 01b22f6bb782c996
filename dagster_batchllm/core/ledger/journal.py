"""A run's answers on local disk before the ledger has them, so a killed process loses none.

The ledger is written in batches (see :mod:`.writer`); a SIGKILL, an out-of-memory kill
or a pod evicted past its grace period loses the batch not written yet, and a rerun pays for
those answers again. So each paid-for answer is first appended to a journal file of its run,
one JSON line, by a single ``write`` (in the kernel's hands once it returns: a killed process
loses nothing written). A run that ends removes its journal; the journals of runs that died are
folded into the ledger by the next run on it before it looks anything up, and by every run
still going while they die (its writer looks every second: :meth:`JournalDirectory.fold_abandoned`
is cheap when there is nothing to fold). A rerun, or a run beside the one killed, then pays
again only for the requests that were in flight.

Each journal is locked (``flock``) by its live run, so another run never folds a journal that
is still being written; the lock ends with the process, however it ends.

A journal's answers are served as paid for, so no one else may write one. Journals live in a
directory of the user's own, mode 0700: next to a SQLite ledger as ``.<file>.journal/``, for a
database server in ``$TMPDIR/batchllm-journal-<uid>/<hash of the URL and table>/``. A directory
that is another user's, a symbolic link or not a directory is refused (:class:`JournalUnsafeError`:
the run does not start); one of the user's own that others may read or write is made 0700
again, with a warning. Journal files are created 0600, and a file is folded only if it is a
regular file (opened without following a link) of this user that no one else can write; a
record is folded only if it has the form of a paid-for answer (:func:`_untrusted`). A journal
keeps no request body (it would double what a run writes to disk), so a record's key cannot be
recomputed from it: the checks above are what keeps a planted answer out.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no journal (the ledger's batches are all there is)
    fcntl = None  # type: ignore[assignment]

from ..errors import JournalUnsafeError, LedgerVanishedError
from .stores import check_ledger_file, redact_url
from .table import OK, Ledger

_SUFFIX = ".jsonl"
_FOLD_BATCH = 500
_LINES_PER_WRITE = 256
_encode = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per line

# What a journal record may hold: a ledger record of a paid-for answer (see table.new_record),
# each of these fields of its type; a column of the ledger not named here, a plain value.
_KEY = re.compile(r"[0-9a-f]{64}")  # every request key is a SHA-256 in hex
_TEXT = ("scope", "partition_key", "model")
_TEXT_OR_NONE = ("response", "error", "error_type", "endpoint", "run_id")
_COUNTS = ("prompt_tokens", "completion_tokens", "attempts")
_COUNTS_OR_NONE = ("cached_tokens", "estimated_prompt_tokens")  # absent in older journals
_NUMBERS_OR_NONE = ("latency_ms", "cost_usd")
_SCALARS = (str, int, float, bool, type(None))
_NOT_WRITTEN = frozenset(("created_at", "updated_at"))  # set by the upsert, never journaled
_MAX_COUNT = 2 ** 63 - 1  # the widest integer a ledger column holds


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


def _location(ledger: Ledger) -> tuple[Path, bool] | None:
    """Where the journals of ``ledger``'s runs live, and whether the directory above it is the
    user's own journal directory (checked too) rather than the ledger's (None: no journal)."""
    if ledger.in_memory or fcntl is None:
        return None
    url = ledger.engine.url
    if url.get_backend_name() == "sqlite" and url.database:
        database = Path(url.database).resolve()
        return database.parent / f".{database.name}.journal", False
    digest = hashlib.sha256(
        f"{redact_url(ledger.url)}|{ledger.table.fullname}".encode()).hexdigest()[:16]
    return (Path(tempfile.gettempdir()) / f"batchllm-journal-{os.geteuid()}" / digest, True)


def journal_dir_for(ledger: Ledger) -> Path | None:
    """Where the journals of ``ledger``'s runs live: next to a SQLite file, else in the user's
    own directory under the temp dir, named after the database and table (None for an
    in-memory ledger)."""
    location = _location(ledger)
    return None if location is None else location[0]


def _refuse(path: Path, problem: str, fix: str) -> JournalUnsafeError:
    return JournalUnsafeError(
        f"the journal directory {path} {problem}: another user could plant answers there that "
        f"a run would serve as paid for, so this run cannot keep a crash journal safely and "
        f"sends nothing. {fix}")


def _open_private(path: Path, log: Any, parent_fd: int | None = None) -> int:
    """A directory file descriptor of ``path`` (created 0700 if missing; ``parent_fd``: that
    of its parent, already checked), checked to be a directory of this user that no one else
    may use; one of this user's that others could is made 0700."""
    name: str = path.name if parent_fd is not None else str(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    fix = (f"Remove {path} (or set TMPDIR to a directory of your own)" if parent_fd is None
           and path.name.startswith("batchllm-journal-") else f"Remove {path}")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as exc:  # ELOOP: a symbolic link; ENOTDIR: something else
        raise _refuse(path, f"cannot be opened as a directory without following a link "
                            f"({exc.strerror}; it is a symbolic link or not a directory)",
                      f"{fix}, and let the run create it.") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise _refuse(path, f"belongs to another user (uid {st.st_uid}; this run's is "
                                f"{os.geteuid()})",
                          f"{fix} (its journals are not this user's to fold), or give this "
                          "user's ledger a path of its own.")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
            log.warning(f"batchllm: the journal directory {path} was open to other users (mode "
                        f"{stat.S_IMODE(st.st_mode):04o}); made it private (0700). Only this "
                        "user's journal files that no one else can write are folded from it.")
    except BaseException:
        os.close(fd)
        raise
    return fd


class JournalDirectory:
    """The directory of a ledger's journals, checked private and held open: every file in it
    is created, read and removed through its descriptor, so the directory cannot be swapped
    for another under the run. ``close`` at the end of the run."""

    def __init__(self, path: Path, log: Any, *, private_parent: bool = False):
        """``private_parent``: the directory above is the user's own journal directory (the
        temp dir's), checked too; raises :class:`JournalUnsafeError` when either is unsafe."""
        self.path = path
        self.log = log
        parent_fd = _open_private(path.parent, log) if private_parent else None
        try:
            self.fd = _open_private(path, log, parent_fd)
        finally:
            if parent_fd is not None:
                os.close(parent_fd)
        self._refused: set[str] = set()  # files not folded, each warned about once

    @classmethod
    def for_ledger(cls, ledger: Ledger, log: Any) -> JournalDirectory | None:
        location = _location(ledger)
        if location is None:
            return None
        return cls(location[0], log, private_parent=location[1])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def fold_abandoned(self, ledger: Ledger) -> int:
        """Write the trusted records of journals whose run has died into ``ledger``, and
        remove those journals; the records folded. Blocking (run it on a thread); a journal
        whose run lives costs an ``open`` and a failed ``flock``. A journal that cannot be
        folded stays, with a warning; :class:`LedgerVanishedError` (the ledger's file is gone)
        is raised, the journal kept."""
        try:
            names = sorted(entry.name for entry in os.scandir(self.fd)
                           if entry.name.endswith(_SUFFIX))
        except OSError as exc:
            self.log.warning(f"batchllm: could not list the journal directory {self.path}: "
                             f"{type(exc).__name__}: {exc}")
            return 0
        folded = sum(self._fold(name, ledger) for name in names)
        if folded:
            self.log.info(f"batchllm: folded {folded} answers of interrupted runs from "
                          f"{self.path} into the ledger")
        return folded

    def _fold(self, name: str, ledger: Ledger) -> int:
        try:
            # O_NONBLOCK: a FIFO planted under a journal's name must not hang the run.
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.fd)
        except FileNotFoundError:  # folded by another run just now
            return 0
        except OSError as exc:  # ELOOP: a symbolic link, never followed
            self._not_folded(name, f"it cannot be opened without following a link "
                                   f"({exc.strerror})")
            return 0
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its run is alive
                return 0
            st = os.fstat(fd)
            if st.st_nlink == 0:  # folded and removed by another run while we waited
                return 0
            problem = _untrusted_file(st)
            if problem is not None:
                self._not_folded(name, problem)
                return 0
            with os.fdopen(os.dup(fd), "rb") as lines:
                records, problems = _parse(lines)
            trusted = []
            columns = frozenset(c.name for c in ledger.table.columns) - _NOT_WRITTEN
            for record in records:
                problem = _untrusted(record, columns)
                if problem is None:
                    trusted.append(record)
                else:
                    problems.append(problem)
            if problems:
                self.log.warning(
                    f"batchllm: {len(problems)} records of the journal {self.path / name} are "
                    f"not answers this library wrote and are not folded (first: "
                    f"{problems[0]}); a rerun sends those requests again")
            for start in range(0, len(trusted), _FOLD_BATCH):
                ledger.upsert(trusted[start:start + _FOLD_BATCH])
            check_ledger_file(ledger.engine)  # else the journal is all that has them
            os.unlink(name, dir_fd=self.fd)
            return len(trusted)
        except LedgerVanishedError:
            raise
        except Exception as exc:  # kept for the next run; this run sends those requests
            self.log.warning(f"batchllm: could not fold the answers journal {self.path / name} "
                             f"into the ledger (kept for the next run): "
                             f"{type(exc).__name__}: {exc}")
            return 0
        finally:
            os.close(fd)

    def _not_folded(self, name: str, problem: str) -> None:
        if name not in self._refused:
            self._refused.add(name)
            self.log.warning(
                f"batchllm: the journal file {self.path / name} is not folded into the ledger: "
                f"{problem}. Its answers are not trusted (a rerun sends those requests "
                "again); remove it once you know where it came from.")


def _untrusted_file(st: os.stat_result) -> str | None:
    """Why a journal file with this ``fstat`` is not folded, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.geteuid():
        return f"it belongs to another user (uid {st.st_uid}; this run's is {os.geteuid()})"
    if stat.S_IMODE(st.st_mode) & 0o022:
        return (f"other users may write it (mode {stat.S_IMODE(st.st_mode):04o}; journals "
                "are created 0600)")
    return None


def _untrusted(record: dict[str, Any], columns: frozenset[str]) -> str | None:
    """Why ``record`` is not a paid-for answer as a run journals it into a ledger of
    ``columns``, or None. Its key cannot be recomputed (no request body is kept), so its form
    is what is checked."""
    unknown = record.keys() - columns
    if unknown:
        return f"fields the ledger has no column for: {sorted(unknown)}"
    for name, value in record.items():
        if not isinstance(value, _SCALARS):
            return f"{name} is not a plain value"
    key = record.get("request_key")
    if type(key) is not str or not _KEY.fullmatch(key):
        return f"request_key {key!r} is not a request key (64 hex digits)"
    if record.get("status") != OK:
        return f"status {record.get('status')!r} is not {OK!r} (a journal keeps answers only)"
    for name in _TEXT:
        if type(record.get(name)) is not str:
            return f"{name} is not text"
    for name in _TEXT_OR_NONE:
        if record.get(name) is not None and type(record[name]) is not str:
            return f"{name} is not text"
    for name in (*_COUNTS, *_COUNTS_OR_NONE):
        value = record.get(name)
        if value is None and name in _COUNTS_OR_NONE:
            continue
        if type(value) is not int or not 0 <= value <= _MAX_COUNT:
            return f"{name} {value!r} is not a count"
    if record["attempts"] < 1:
        return "attempts is 0 (a journal keeps answers paid for only)"
    for name in _NUMBERS_OR_NONE:
        value = record.get(name)
        if value is not None and (type(value) not in (int, float) or not math.isfinite(value)):
            return f"{name} {value!r} is not a number"
    return None


class AnswerJournal:
    """This run's journal file; ``append`` a record, ``close`` (removing it) at the end."""

    def __init__(self, directory: JournalDirectory | Path):
        """``directory``: the ledger's (a path is opened and checked, and closed with this)."""
        self._own_directory = not isinstance(directory, JournalDirectory)
        if self._own_directory:
            directory = JournalDirectory(directory, logging.getLogger("dagster_batchllm"))
        self.directory = directory
        name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.name = f"{name}{_SUFFIX}"
        self.path = directory.path / self.name
        # Locked under a name folding ignores, then renamed (the lock stays with the file): a
        # run that folds at the same moment never takes an unlocked new journal for a dead one.
        creating = f"{name}.creating"
        self._fd = os.open(creating, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                           | os.O_NOFOLLOW, 0o600, dir_fd=directory.fd)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(creating, self.name, src_dir_fd=directory.fd, dst_dir_fd=directory.fd)
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
            data = memoryview("\n".join(lines).encode())
            while data:  # a short write (a disk filling up) goes on where it stopped
                data = data[os.write(self._fd, data):]
            self._fields, self._safe_at = fields, safe_at  # once its object line is written

    def close(self, *, remove: bool) -> None:
        """``remove``: every record is in the ledger; otherwise the next run folds it."""
        if self._fd < 0:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.name, dir_fd=self.directory.fd)
        os.close(self._fd)  # after the unlink: no other run can fold it in between
        self._fd = -1
        if self._own_directory:
            self.directory.close()


def fold_abandoned(directory: Path | None, ledger: Ledger, log: Any) -> int:
    """Fold the journals in ``directory`` whose run has died into ``ledger`` (see
    :meth:`JournalDirectory.fold_abandoned`; raises :class:`JournalUnsafeError` for a
    directory that is not private). Blocking. Returns the records folded."""
    if directory is None or fcntl is None or not directory.is_dir():
        return 0
    journals = JournalDirectory(directory, log)
    try:
        return journals.fold_abandoned(ledger)
    finally:
        journals.close()


def _parse(lines: Iterable[bytes]) -> tuple[list[dict[str, Any]], list[str]]:
    """A journal's records as dicts (object lines, and array lines that take the field names
    of the object line before them), and what was wrong with the lines that are not records.
    A last line cut off by a kill is neither: that answer was never acknowledged."""
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    fields: list[str] | None = None
    for number, line in enumerate(lines, 1):
        if not line.endswith(b"\n"):
            break
        try:
            record = json.loads(line)
            if isinstance(record, list):  # the fields of the last object line
                if fields is None:
                    raise ValueError("an array line before any object line")
                records.append(dict(zip(fields, record, strict=True)))
            elif isinstance(record, dict):
                records.append(record)
                fields = list(record)
            else:
                raise ValueError("neither an object nor an array")
        except ValueError as exc:  # JSONDecodeError, a length that does not match
            problems.append(f"line {number}: {exc}")
            # The lines after a bad one may be arrays of the fields it named: none is read
            # as another object line's fields, which they may match in number only.
            fields = None
    return records, problems


def read_records(path: Path) -> list[dict[str, Any]]:
    """A journal's records as dicts; ValueError for a line that is not a record."""
    with path.open("rb") as lines:
        records, problems = _parse(lines)
    if problems:
        raise ValueError(f"{path}: {problems[0]}")
    return records
