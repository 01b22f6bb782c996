"""A SQLite MLflow registry's first setup, once, whoever asks for it first.

MLflow creates and migrates a SQLite tracking store (and registry) the first time a client
opens it, with no lock of its own: two Dagster steps opening a fresh registry at once (one
training and registering a model, one observing its alias) both run the migrations, and one
fails with ``sqlite3.OperationalError: duplicate column name: step`` or ``table runs already
exists``. :func:`ready_registry` opens it under a lock file beside the database, so the first
process creates it and the others find it made. A server database (PostgreSQL, MySQL) or an
MLflow tracking server is set up by whoever runs it, not here.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

_ready: set[str] = set()  # registries this process has opened under the lock
_ready_guard = threading.Lock()


def ready_registry(uri: str | None) -> None:
    """Make sure the SQLite registry at ``uri`` exists and is migrated before MLflow opens it
    elsewhere in this process; a no-op for other URIs and after the first time. None: the
    registry MLflow's environment variables name, as MLflow would open it."""
    uri = uri or os.environ.get("MLFLOW_REGISTRY_URI") or os.environ.get("MLFLOW_TRACKING_URI")
    path = sqlite_path(uri)
    if path is None or uri in _ready:
        return
    with _ready_guard:
        if uri in _ready:
            return
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with _file_lock(os.path.abspath(path) + ".setup-lock"):
            os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri=uri, registry_uri=uri)
            # Each store creates (or migrates) the tables as it opens: one query apiece.
            client.search_experiments(max_results=1)
            client.search_registered_models(max_results=1)
        _ready.add(uri)


def sqlite_path(uri: str | None) -> str | None:
    """The database file of a ``sqlite:///`` URI (None for any other URI or an in-memory one).
    ``sqlite:////abs/path`` is absolute, ``sqlite:///rel/path`` relative, as SQLAlchemy reads
    them."""
    if not uri or not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else path


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    """An exclusive lock between processes (and their threads), released when the block ends
    or the process dies."""
    try:
        import fcntl
    except ImportError:  # Windows: filelock (which dagster already requires)
        from filelock import FileLock

        with FileLock(path):
            yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
