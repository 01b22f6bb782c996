"""``register_ai_functions`` and ``execute``: the two calls SQL users need.

Example::

    import duckdb
    from dagster_batchllm.sql import register_ai_functions

    con = duckdb.connect()
    with register_ai_functions(con, llm) as ai:  # llm: a BatchInferenceResource
        df = con.sql("SELECT ai_summarize(transcript, 30) AS summary FROM calls").df()
        print(ai.stats.summary())
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..core import InferenceClient, InferenceConfigError, InferenceSettings, InferenceStats
from ..factories.context import read_context
from . import aggregates
from .dialects import translate
from .duckdb_engine import DuckDBFunctions
from .runtime import Runtime
from .sqlite_engine import SQLiteFunctions, sqlite_connection

# id(engine connection) -> weak reference to its engine. The connection keeps its engine alive
# (its registered functions are the engine's methods), and the engine its AIFunctions.
_ENGINES: dict[int, weakref.ref] = {}
_ENGINES_LOCK = threading.Lock()


class AIFunctions:
    """The AI functions installed on one connection: run queries, read figures, close.

    ``stats`` sums the ``infer`` figures of every query run through these functions (requests
    sent, rows answered from the ledger, tokens, failures by type).
    """

    def __init__(self, connection: Any, engine: DuckDBFunctions | SQLiteFunctions,
                 runtime: Runtime):
        self.connection = connection
        self.engine = engine
        self.runtime = runtime
        engine.handle = self

    @property
    def dialect(self) -> str:
        """The SQL dialect queries must be written in: ``duckdb`` or ``sqlite``."""
        return self.engine.name

    @property
    def stats(self) -> InferenceStats:
        return self.runtime.stats

    def execute(self, query: str, parameters: Any = None, *, dialect: str | None = None) -> Any:
        """Run one statement with its AI calls batched; returns the engine's cursor.

        On DuckDB this is ``connection.execute`` (``.df()``, ``.fetchall()`` on the result); on
        SQLite it is the two-pass plan of :mod:`dagster_batchllm.sql.sqlite_engine`.
        ``dialect="databricks"`` (or ``"spark"``) translates the query first (see
        :mod:`dagster_batchllm.sql.dialects`); a query that cannot be translated faithfully
        raises :class:`~dagster_batchllm.sql.dialects.TranslationError` and nothing is sent.
        Parameters keep their markers: Databricks ``:name`` becomes DuckDB's ``$name``.
        """
        if dialect is not None and dialect != self.dialect:
            query = translate(query, read=dialect, write=self.dialect)
        return self.engine.execute(query, parameters)

    def close(self) -> None:
        """Stop the background loop (functions called later start it again)."""
        self.runtime.close()

    def __enter__(self) -> AIFunctions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def register_ai_functions(
    connection: Any,
    llm: Any,
    *,
    default_model: str | None = None,
    context: Any = None,
    partition_key: str | None = None,
    run_id: str | None = None,
    scope: str | None = None,
) -> AIFunctions:
    """Install ``ai_query`` and the AI functions on a DuckDB or SQLite connection.

    ``connection``: a ``duckdb`` connection, a ``sqlite3`` connection, or a SQLAlchemy
    connection / raw connection over sqlite3. ``llm``: a ``BatchInferenceResource``, an
    ``InferenceClient`` or ``InferenceSettings``. ``default_model`` is what the AI functions use
    without an ``endpoint`` argument (default: the resource's ``default_model``). ``context`` (a
    Dagster asset context) records its run id, partition key and asset key (the ledger scope) in
    the ledger, as ``llm.infer(context=...)`` does, so the retry-partitions sensor finds the
    asset's failed rows; ``partition_key`` / ``run_id`` / ``scope`` set them directly.

    Registering again on the same connection replaces the functions.
    """
    client, owned = _client_of(llm)
    if default_model is not None and default_model not in client.settings.models:
        raise InferenceConfigError(
            f"register_ai_functions: argument 'default_model' names '{default_model}', which no "
            f"configured endpoint serves; served models: {sorted(client.settings.models)}.")
    seen = read_context(context)
    if scope is None and seen.scope is None and len(seen.asset_keys) > 1:
        raise InferenceConfigError(
            "register_ai_functions: this op materializes several assets "
            f"({', '.join(seen.asset_keys)}); pass scope= naming the one whose rows the AI "
            "functions answer, so its retry-partitions sensor finds their failures.")
    runtime = Runtime(client, default_model=default_model,
                      partition_key=partition_key if partition_key is not None
                      else seen.partition_key,
                      run_id=run_id or seen.run_id, logger=seen.logger,
                      scope=scope if scope is not None else seen.scope, owns_client=owned)
    engine_connection, engine = _engine_for(connection, runtime)
    engine.install()
    aggregates.install(engine)  # ai_agg, ai_summarize_agg
    handle = AIFunctions(connection, engine, runtime)
    key = id(engine_connection)
    with _ENGINES_LOCK:
        previous = _ENGINES.get(key)
        _ENGINES[key] = weakref.ref(engine, lambda ref, key=key: _forget(key, ref))
    previous_engine = previous() if previous is not None else None
    if previous_engine is not None and previous_engine is not engine:
        previous_engine.handle.close()
    return handle


def execute(connection: Any, query: str, parameters: Any = None, *,
            dialect: str | None = None) -> Any:
    """Run one statement on a connection that has the AI functions, AI calls batched.

    Needed on SQLite (see :mod:`dagster_batchllm.sql.sqlite_engine`); on DuckDB it equals
    ``connection.execute``. Returns the engine's cursor. ``dialect="databricks"`` runs
    Databricks SQL as written (see :meth:`AIFunctions.execute`)::

        execute(con, "SELECT ai_query('llama-70b', t, failOnError => false) AS r FROM calls",
                dialect="databricks")
    """
    return handle_for(connection).execute(query, parameters, dialect=dialect)


def handle_for(connection: Any) -> AIFunctions:
    """The :class:`AIFunctions` registered on ``connection``."""
    underlying = sqlite_connection(connection) or connection
    with _ENGINES_LOCK:
        ref = _ENGINES.get(id(underlying))
    engine = ref() if ref is not None else None
    if engine is None or engine.connection is not underlying:
        raise InferenceConfigError(
            "This connection has no AI functions; call "
            "dagster_batchllm.sql.register_ai_functions(connection, llm) first.")
    return engine.handle


def _forget(key: int, ref: weakref.ref) -> None:
    with _ENGINES_LOCK:
        if _ENGINES.get(key) is ref:
            del _ENGINES[key]


def _client_of(llm: Any) -> tuple[InferenceClient, bool]:
    if isinstance(llm, InferenceClient):
        return llm, False
    if isinstance(llm, InferenceSettings):
        return InferenceClient(llm), True
    client = getattr(llm, "client", None)  # BatchInferenceResource, without importing dagster
    if isinstance(client, InferenceClient):
        return client, False
    raise InferenceConfigError(
        "register_ai_functions: argument 'llm' must be a BatchInferenceResource, an "
        f"InferenceClient or InferenceSettings, got {type(llm).__name__}.")


def _engine_for(connection: Any, runtime: Runtime):
    if type(connection).__module__.split(".")[0] in ("duckdb", "_duckdb"):
        return connection, DuckDBFunctions(connection, runtime)
    raw = sqlite_connection(connection)
    if raw is not None:
        return raw, SQLiteFunctions(raw, runtime)
    raise InferenceConfigError(
        "register_ai_functions: argument 'connection' must be a DuckDB connection, a sqlite3 "
        f"connection or a SQLAlchemy connection over sqlite3, got {type(connection).__name__}.")
