"""Path cells: which local files a table's cell may make this process read, and how.

A cell of an ``images=`` column, of SQL's ``files =>`` or of ``ai_parse_document`` may hold a
local path. Tables are often written by people who do not run the code, so a path in a cell is
read only when it names a regular file under the configured roots (``files_roots``; empty, the
default: the working directory when the call starts):

- The path is resolved first (``..`` and every symlink: ``os.path.realpath``, which looks at
  directory entries and opens nothing). A path that resolves outside every root is refused
  with one message whether or not it exists, so an error tells nothing about the rest of the
  disk.
- Under a root, a missing file, a directory, a FIFO, a device or a socket is refused from its
  ``stat``, never opened (opening a FIFO waits until someone writes to it).
- The file is then opened one path component at a time from its root, never following a
  symlink (``O_NOFOLLOW``) and never waiting (``O_NONBLOCK``), and the open descriptor is
  checked again (``fstat``: a regular file, the very one that was checked), so a path swapped
  between the check and the open (for a symlink out, or a FIFO) is refused, not read.
- No message quotes the file's bytes.

``http(s)://`` URLs are not read here: the model server fetches them, unless the settings say
``allow_image_urls=False``.

A policy is plain data (it travels to Spark executors with the settings). The request renderer
(``run/prompts.py``) reads image cells without the call's settings, so the chat task puts its
policy *in force* while its rows are rendered (:func:`under_policy`); a path read with none in
force follows the default policy (the working directory, URLs allowed).

Example::

    >>> policy = FilePolicy(roots=("/srv/scans",))
    >>> policy.read("/srv/scans/../../etc/passwd")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileRefusedError: file '/srv/scans/../../etc/passwd' is not under files_roots ['/srv/scans']...
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import FileRefusedError

if TYPE_CHECKING:
    from .settings import InferenceSettings

T = TypeVar("T")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
# O_NONBLOCK: were the path a FIFO by the time it is opened, open() returns at once instead of
# waiting for a writer (and the fstat that follows refuses it). O_NOCTTY: a terminal stays
# nobody's controlling terminal.
_FILE_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
               | _NOFOLLOW | _CLOEXEC)
# What an open of a path swapped under us says: a symlink where none was (ELOOP), a file where a
# directory was (ENOTDIR), an entry gone (ENOENT), a device without its driver (ENXIO).
_SWAPPED = {errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.ENXIO}
# A path cell is shown in errors up to this many characters (a cell may hold anything).
_SHOWN_CHARS = 200


@dataclass(frozen=True)
class FilePolicy:
    """Which local paths may be read, and whether image URLs go on to the model server.

    ``roots`` are absolute folders with no symlink in them (:meth:`of` resolves configured
    ones); ``None`` reads any path (for a path the code itself names, such as
    ``parse_document("invoice.pdf")``), with every other check kept.
    """

    roots: tuple[str, ...] | None = ()
    allow_urls: bool = True

    @classmethod
    def of(cls, settings: InferenceSettings | None = None) -> FilePolicy:
        """The policy of ``settings`` (None: the defaults), its roots resolved now: relative
        ones, and the working directory when none is configured, are taken from where the
        process is at this moment."""
        if settings is None:
            return cls(roots=resolved_roots(()))
        return cls(roots=resolved_roots(settings.files_roots),
                   allow_urls=settings.allow_image_urls)

    @classmethod
    def any_path(cls) -> FilePolicy:
        """Every path may be read (the code names it, not a table); only regular files."""
        return cls(roots=None)

    def read(self, path: str | os.PathLike, *, max_bytes: int | None = None,
             limit_name: str = "the limit") -> bytes:
        """The bytes of the regular file ``path`` names, or :class:`FileRefusedError` saying
        why not. ``max_bytes`` bounds what is read: a larger file is refused from its size
        (``limit_name`` names the setting in the message)."""
        text = _path_text(path)
        shown = _shown(text)
        try:
            real = os.path.realpath(text)
        except (OSError, ValueError):  # a path too long to resolve, say
            raise FileRefusedError(f"file {shown} cannot be resolved to a path") from None
        root = self._root_of(real)
        if self.roots is not None and root is None:
            raise FileRefusedError(self._outside(shown))
        try:
            checked = os.stat(real)
        except FileNotFoundError:
            raise FileRefusedError(f"file {shown} does not exist") from None
        except OSError as exc:
            raise FileRefusedError(f"file {shown} cannot be read ({exc.strerror})") from None
        _check_regular(checked.st_mode, shown)
        descriptor = self._open(real, root, shown)
        try:
            opened = os.fstat(descriptor)
            if not stat.S_ISREG(opened.st_mode) or (
                    (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino)):
                raise FileRefusedError(f"file {shown} changed while it was being opened; "
                                       "it is not read")
            if max_bytes is not None and opened.st_size > max_bytes:
                raise _too_big(shown, opened.st_size, max_bytes, limit_name)
            with open(descriptor, "rb", closefd=True) as handle:
                descriptor = None  # the handle closes it now
                data = handle.read(-1 if max_bytes is None else max_bytes + 1)
        except OSError as exc:
            raise FileRefusedError(f"file {shown} cannot be read ({exc.strerror})") from None
        finally:
            if descriptor is not None:
                os.close(descriptor)
        if max_bytes is not None and len(data) > max_bytes:  # it grew, or a size of 0 lied
            raise _too_big(shown, len(data), max_bytes, limit_name)
        return data

    def _root_of(self, real: str) -> str | None:
        for root in self.roots or ():
            if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
                return root
        return None

    def _outside(self, shown: str) -> str:
        return (f"file {shown} is not under files_roots {list(self.roots or ())}: a path "
                "outside them is not read, whether or not it exists")

    def _open(self, real: str, root: str | None, shown: str) -> int:
        """``real`` opened for reading without following a symlink or waiting: from ``root``
        one component at a time where the platform can, so no directory on the way can have
        become a symlink out since the path was resolved."""
        try:
            if root is None or os.open not in os.supports_dir_fd:
                return os.open(real, _FILE_FLAGS)
            parts = os.path.relpath(real, root).split(os.sep)
            directory = os.open(root, _DIRECTORY_FLAGS & ~_NOFOLLOW)  # resolved: no symlink
            try:
                for part in parts[:-1]:
                    inner = os.open(part, _DIRECTORY_FLAGS, dir_fd=directory)
                    os.close(directory)
                    directory = inner
                return os.open(parts[-1], _FILE_FLAGS, dir_fd=directory)
            finally:
                os.close(directory)
        except OSError as exc:
            if exc.errno in _SWAPPED:
                raise FileRefusedError(f"file {shown} changed while it was being opened; it "
                                       "is not read") from None
            raise FileRefusedError(f"file {shown} cannot be read ({exc.strerror})") from None


def resolved_roots(configured: Sequence[str | os.PathLike]) -> tuple[str, ...]:
    """Configured roots as absolute folders without symlinks (empty: the working directory).
    A working directory that no longer exists allows nothing."""
    if not configured:
        try:
            configured = (os.getcwd(),)
        except OSError:
            return ()
    return tuple(dict.fromkeys(os.path.realpath(os.fspath(root)) for root in configured))


def _path_text(path: Any) -> str:
    text = os.fsdecode(os.fspath(path))
    if not text.strip():
        raise FileRefusedError("the path is empty")
    if "\x00" in text:
        raise FileRefusedError(f"the path {_shown(text)} holds a NUL character")
    return text


def _check_regular(mode: int, shown: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise FileRefusedError(f"file {shown} is a directory")
    raise FileRefusedError(f"file {shown} is not a regular file (a FIFO, a device or a socket) "
                           "and is not read")


def _too_big(shown: str, size: int, limit: int, limit_name: str) -> FileRefusedError:
    return FileRefusedError(f"file {shown} is {size} bytes, over the limit of {limit} bytes "
                            f"({limit_name})")


def _shown(text: str) -> str:
    if len(text) > _SHOWN_CHARS:
        text = text[:_SHOWN_CHARS] + "..."
    return repr(text)


# -- the policy in force while a task renders its rows -------------------------------------------
_IN_FORCE: ContextVar[FilePolicy | None] = ContextVar("dagster_batchllm_file_policy",
                                                      default=None)
_DONE = object()


def policy_in_force() -> FilePolicy:
    """The policy a path cell read now follows: the rendering task's, else the default."""
    policy = _IN_FORCE.get()
    return policy if policy is not None else FilePolicy.of()


def under_policy(policy: FilePolicy, items: Iterator[T]) -> Iterator[T]:
    """``items`` with ``policy`` in force while each one is made, and only then: a generator
    may be resumed from other threads or tasks, so it is set and reset around every step."""
    while True:
        token = _IN_FORCE.set(policy)
        try:
            item = next(items, _DONE)
        finally:
            _IN_FORCE.reset(token)
        if item is _DONE:
            return
        yield item
