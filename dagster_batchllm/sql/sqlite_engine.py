"""The AI functions on SQLite: per-row functions, batched by a two-pass ``execute``.

SQLite calls a Python function once per row and needs its answer before the next row, so a
function alone can only send one request at a time. :meth:`SQLiteFunctions.execute` batches
instead, in passes:

1. **Collect.** Run the statement inside a savepoint that is rolled back afterwards. The
   functions answer what is already known and record every other request, returning a
   placeholder of the result's type ('' for text, 0 for numbers, '{}' for JSON).
2. **Infer.** Send all recorded requests in bulk (one ``infer`` per distinct call, so through the
   pool concurrently, deduplicated, from the ledger where already answered).
3. Repeat while a pass found new requests: a request built from another AI function's answer
   (``ai_query(m, ai_summarize(t))``), or one behind a filter on such an answer, only shows up
   once that answer is known. Then run the statement for real; every call is answered from
   memory.

The trade-off: the statement runs once per dependency level plus once more. The SQL is cheap
next to model latency, but a statement that is slow by itself pays that again, and collect
passes compute with placeholders. That is safe (a pass that meets only known answers computes
exactly what the final run will, so nothing is missed), though a branch taken only on a
placeholder (``CASE WHEN s = '' THEN ai_gen(...)``) sends a request the final run does not use,
and a constraint the placeholder breaks,
such as a CHECK on the value, stops a collect pass early: what was collected up to there is
answered and the next pass gets further, in the worst case one row per pass. Writes in collect
passes are rolled back, so ``INSERT ... SELECT ai_query(...)`` writes once. Functions called
outside ``execute`` still work, one request per distinct row (their answers are kept until the
next ``execute``).

``ai_query``'s ``files`` (Databricks' ``files => content``) is its seventh argument here: a BLOB
holding the image, or TEXT holding its path or URL; a NULL there gives NULL without a request.
A collect pass keeps the images it has collected until they are answered, so it answers them
as soon as they hold more than 64 MiB: memory stays bounded in rows.

SQLite has no structs: a structured result (``responseFormat``, ``ai_extract``, or
``failOnError`` false) is JSON text, read with ``->>`` or ``json_extract``. Optional arguments
are positional: ``ai_query(endpoint, request, returnType, failOnError, modelParameters,
responseFormat)`` with NULL for the ones to skip, and an ``endpoint`` after each AI function's
own arguments. Text that is NULL, empty or only whitespace gives NULL without a request.

SQLite reports an exception raised in a function only as "user-defined function raised
exception"; ``execute`` re-raises the real error (:attr:`SQLiteFunctions.last_error` keeps it for
statements run directly).

Example::

    import sqlite3
    from dagster_batchllm.sql import execute, register_ai_functions

    con = sqlite3.connect("calls.db")
    register_ai_functions(con, llm)
    rows = execute(con, "SELECT call_id, ai_summarize(transcript, 30) FROM calls").fetchall()
"""

from __future__ import annotations

import hashlib
from functools import lru_cache, partial
from typing import Any

from ..ai_functions import documents
from ..ai_functions.calls import BoundCall, sendable
from ..ai_functions.catalogue import FUNCTIONS, REQUIRED, AIFunction
from ..ai_functions.outcomes import as_json, failure, with_error
from ..core import InferenceConfigError
from .runtime import Outcome, Runtime

_SAVEPOINT = "batchllm_collect"
_MAX_PASSES = 16  # dependency depth of AI calls on each other; real queries use one or two
_MAX_PENDING_FILE_BYTES = 64 * 1024 * 1024  # collected images answered early past this


class SQLiteFunctions:
    """Installs the functions on one ``sqlite3`` connection; answers through ``runtime``."""

    name = "sqlite"  # also the sqlglot dialect a translated query would target

    def __init__(self, connection: Any, runtime: Runtime):
        self.connection = connection
        self.runtime = runtime
        self.last_error: BaseException | None = None
        self._collecting = False
        # call -> (model, text, file id) -> the file (None without one), in collect order
        self._pending: dict[BoundCall, dict[tuple[str, str, str | None], Any]] = {}
        self._pending_file_bytes = 0
        self._answers: dict[tuple[BoundCall, str, str, str | None], Outcome] = {}
        self._bind = lru_cache(maxsize=1024)(self._bind_uncached)

    def install(self) -> None:
        for function in FUNCTIONS.values():
            self.connection.create_function(function.name, -1, partial(self._scalar, function),
                                            deterministic=True)
        # No model, so a plain per-row function (no collect pass): JSON text, as structs here.
        self.connection.create_function(
            documents.NAME, 1, partial(parse_document_json, settings=self.runtime.client.settings),
            deterministic=True)

    # -- the two-pass execute ---------------------------------------------------------------
    def execute(self, query: str, parameters: Any = ()) -> Any:
        """Run one statement with every AI call in it batched; returns the cursor."""
        import sqlite3

        parameters = () if parameters is None else parameters
        self._answers.clear()  # answers serve one statement; the ledger keeps them for good
        for _ in range(_MAX_PASSES):
            self._pending = {}
            self._collecting = True
            self.last_error = None
            self.connection.execute(f"SAVEPOINT {_SAVEPOINT}")
            try:
                self.connection.execute(query, parameters).fetchall()
            except sqlite3.Error as exc:
                if self.last_error is not None:
                    raise self.last_error from exc
                # A constraint that a NULL placeholder broke: answer what was collected up to
                # there, and the next pass gets further. Without progress it is a real error.
                if not (isinstance(exc, sqlite3.IntegrityError) and self._pending):
                    raise
            finally:
                self._collecting = False
                self.connection.execute(f"ROLLBACK TO {_SAVEPOINT}")
                self.connection.execute(f"RELEASE {_SAVEPOINT}")
            if not self._pending:
                break
            self._answer_pending()
        self.last_error = None
        try:
            return self.connection.execute(query, parameters)
        except sqlite3.Error as exc:
            if self.last_error is not None:
                raise self.last_error from exc
            raise

    def _answer_pending(self) -> None:
        keyed = [(call, list(rows.items())) for call, rows in self._pending.items()]
        self._pending = {}
        self._pending_file_bytes = 0
        batches = [(call, [(model, text, file) for (model, text, _), file in rows])
                   for call, rows in keyed]
        for (call, rows), outcomes in zip(keyed, self.runtime.answer(batches), strict=True):
            errors = [error for _, error in outcomes if error is not None]
            if errors and call.fail_on_error:
                raise failure(call.function, errors, len(rows))
            for ((model, text, file_id), _), outcome in zip(rows, outcomes, strict=True):
                self._answers[(call, model, text, file_id)] = outcome

    # -- the per-row function ---------------------------------------------------------------
    def _scalar(self, spec: AIFunction, *args: Any) -> Any:
        try:
            return self._evaluate(spec, args)
        except Exception as exc:  # SQLite hides the message; keep the exception for execute()
            self.last_error = exc
            raise

    def _evaluate(self, spec: AIFunction, args: tuple) -> Any:
        values = _arguments(spec, args)
        call = self._bind(spec.name, tuple(values.get(p.name) for p in spec.option_params))
        texts = []
        for param in spec.text_params:
            value = values[param.name]
            if value is None:
                return None  # NULL in, NULL out: nothing to send
            if not isinstance(value, str):
                raise InferenceConfigError(
                    f"{spec.name}: argument '{param.name}' must be TEXT, got "
                    f"{type(value).__name__} {value!r:.60} (cast it with CAST(... AS TEXT)).")
            if not sendable(value):
                return None  # blank text is NULL: nothing to send
            texts.append(value)
        file = None
        files = spec.file_param
        if files is not None and files.name in values:  # given, so NULL is NULL in, NULL out
            file = values[files.name]
            if file is None:
                return None
            if not isinstance(file, bytes | str):
                raise InferenceConfigError(
                    f"{spec.name}: argument '{files.name}' must be a BLOB (the image) or TEXT "
                    f"(its path or URL), got {type(file).__name__} {file!r:.60}.")
        model = self.runtime.model_for(spec.name, values.get("endpoint"),
                                       required=spec.endpoint_required, cascade=call.cascade)
        text = spec.render(*texts)
        key = (call, model, text, _file_id(file))
        outcome = self._answers.get(key)
        if outcome is None:
            if self._collecting:
                pending = self._pending.setdefault(call, {})
                if key[1:] not in pending and isinstance(file, bytes):
                    self._pending_file_bytes += len(file)
                pending[key[1:]] = file
                if self._pending_file_bytes > _MAX_PENDING_FILE_BYTES:
                    self._answer_pending()  # images are large: answer before holding more
                    return _sql_value(call, self._answers[key])
                return _placeholder(call)
            if call.cascade is not None:
                raise InferenceConfigError(
                    f"{spec.name}: a cascade learns its thresholds over all the rows of the "
                    "call at once, so run the statement through dagster_batchllm.sql.execute("
                    "con, query), which collects them first.")
            row = (model, text) if file is None else (model, text, file)
            outcome = self.runtime.answer([(call, [row])])[0][0]
            self._answers[key] = outcome
        return _sql_value(call, outcome)

    def _bind_uncached(self, function: str, options: tuple) -> BoundCall:
        spec = FUNCTIONS[function]
        return spec.bind(dict(zip((p.name for p in spec.option_params), options, strict=True)))


def _arguments(spec: AIFunction, args: tuple) -> dict[str, Any]:
    least = sum(1 for p in spec.params if p.default is REQUIRED)
    if not least <= len(args) <= len(spec.params):
        raise InferenceConfigError(
            f"{spec.name} takes {least} to {len(spec.params)} arguments, got {len(args)}. "
            f"Signature: {spec.signature()}; pass NULL for an optional argument to skip it.")
    return {p.name: value for p, value in zip(spec.params, args, strict=False)}  # rest: defaults


def parse_document_json(content: Any, settings: Any = None) -> str | None:
    """SQLite's ``ai_parse_document(content)``: the ``PARSED_DOCUMENT`` struct as JSON text
    (read it with ``->>``: ``ai_parse_document(content) ->> '$.text'``). A BLOB is the PDF, TEXT
    its path; anything else is that row's ``error``."""
    if content is not None and not isinstance(content, bytes | str):
        return as_json({"page_count": None, "pages": None, "text": None, "error": (
            f"content must be a BLOB (the PDF) or TEXT (its path), got "
            f"{type(content).__name__}")})
    value = documents.parse_document_value(content, settings)
    return None if value is None else as_json(value)


def _file_id(file: bytes | str | None) -> str | None:
    """What tells one row's file from another's without holding its bytes: a digest of the
    bytes (a BLOB), or the path or URL itself (TEXT)."""
    if isinstance(file, bytes):
        return "blob sha256:" + hashlib.sha256(file).hexdigest()
    return None if file is None else "text:" + file


def _placeholder(call: BoundCall) -> Any:
    """A stand-in of the result's type: not NULL, so NOT NULL columns take it in a collect pass."""
    if not call.fail_on_error:
        return with_error(None, None)
    kind = call.result_type.name
    if kind in ("INT", "BIGINT", "SMALLINT", "TINYINT", "FLOAT", "DOUBLE", "DECIMAL", "BOOLEAN"):
        return 0
    return {"ARRAY": "[]", "STRUCT": "{}", "MAP": "{}", "JSON": "{}"}.get(kind, "")


def _sql_value(call: BoundCall, outcome: Outcome) -> Any:
    value, error = outcome
    if not call.fail_on_error:
        return with_error(value, error)
    if error is not None:
        raise failure(call.function, [error], 1)
    if value is None or isinstance(value, str | int | float):
        return int(value) if isinstance(value, bool) else value
    return as_json(value)


def sqlite_connection(connection: Any) -> Any:
    """The ``sqlite3.Connection`` under a SQLAlchemy connection or pooled DBAPI proxy, or None."""
    import sqlite3

    if isinstance(connection, sqlite3.Connection):
        return connection
    if type(connection).__module__.startswith("sqlalchemy."):
        import sqlalchemy as sa

        if isinstance(connection, sa.Connection):
            connection = connection.connection  # the pooled DBAPI proxy
        driver = getattr(connection, "driver_connection", None)
        if isinstance(driver, sqlite3.Connection):
            return driver
    return None
