"""The AI functions on DuckDB: vectorized Arrow UDFs under macros with named parameters.

Each SQL function is a macro, so Databricks' optional arguments work as DuckDB named
parameters with defaults::

    ai_query('llama-70b', request, failOnError := false, modelParameters := {'max_tokens': 64})

The macro expands to two Python functions:

* ``__batchllm_call(function, endpoint, text1, text2, options, file_blobs, file_paths)`` — an
  Arrow UDF. DuckDB hands it a whole vector (2048 rows); its distinct requests go through the
  pool concurrently in one ``infer`` call, and identical ones are sent once. It returns JSON
  text. ``ai_query``'s ``files`` argument (a BLOB, a VARCHAR path or URL, or a list of either:
  a document's pages) arrives as a list in ``file_blobs`` or ``file_paths`` by its type and
  goes with the request as image parts.
* ``__batchllm_type(function, argument types, options)`` — evaluated once while DuckDB binds the
  query, on constant arguments only. It checks every argument's type (``typeof``) and the
  options that shape the result (``returnType``, ``failOnError``, ``responseFormat``, the labels
  of ``ai_extract``), and returns the ``from_json`` structure of the result. So a result is a
  STRUCT where the call asks for one, and argument mistakes fail the query before any request is
  sent. Those options must therefore be constants, as in Databricks.

``from_json(call, type)`` joins the two. Example::

    import duckdb
    from dagster_batchllm.sql import register_ai_functions

    con = duckdb.connect()
    register_ai_functions(con, llm)
    con.sql(\"\"\"
        SELECT ai_query('sim-model', 'Classify: ' || text,
                        responseFormat := 'STRUCT<risk: STRING, score: INT>').risk
        FROM tickets\"\"\")
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from ..ai_functions import documents
from ..ai_functions.calls import BoundCall, sendable
from ..ai_functions.catalogue import (
    AI_QUERY,
    BOOLEAN,
    FILES,
    FUNCTIONS,
    INTEGER,
    LABELS,
    OBJECT,
    REQUIRED,
    TEXT,
    AIFunction,
    check_not_legacy,
)
from ..ai_functions.embeddings import embedding_result_type, literal_endpoint
from ..ai_functions.outcomes import as_json, failure, with_error
from ..core import InferenceConfigError
from .cascades import CascadeCollector
from .runtime import Row, Runtime

CALL_UDF = "__batchllm_call"
_RESULT_STRUCT = re.compile(r"STRUCT\(result [^)]*errorMessage VARCHAR\)")
TYPE_UDF = "__batchllm_type"
ENDPOINT_ALIAS = "__endpoint"  # ai_query's endpoint as written, in the type UDF's options
_NOT_CONSTANT = 'argument in function "from_json" must be a constant expression'
# ai_parse_document: one Python function per input type (a BLOB of the PDF, a path to it).
PARSE_BLOB_UDF, PARSE_PATH_UDF = "__batchllm_parse_document_blob", "__batchllm_parse_document_path"

_INTEGERS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
             "UINTEGER", "UBIGINT", "UHUGEINT"}
_ACCEPTS = {
    TEXT: lambda t: t in ("VARCHAR", "JSON") or t.startswith("ENUM("),
    INTEGER: lambda t: t in _INTEGERS,
    BOOLEAN: lambda t: t == "BOOLEAN",
    LABELS: lambda t: t in ("VARCHAR", "JSON") or re.fullmatch(r"VARCHAR(\[\d*\])", t) is not None,
    OBJECT: lambda t: t in ("VARCHAR", "JSON") or t.startswith(("STRUCT(", "MAP(")),
    FILES: lambda t: t in ("BLOB", "VARCHAR", "BLOB[]", "VARCHAR[]"),
}
# In the options JSON: the type of the call's files (a NULL literal, the default, is none).
FILES_TYPE = "__files"
_NULL_TYPE = '"NULL"'  # what typeof(NULL) says


class DuckDBFunctions:
    """Installs the functions on one DuckDB connection; answers through ``runtime``."""

    name = "duckdb"  # also the sqlglot dialect a translated query would target

    def __init__(self, connection: Any, runtime: Runtime):
        self.connection = connection
        self.runtime = runtime
        self._bind = lru_cache(maxsize=1024)(self._bind_uncached)
        self._cascades = CascadeCollector(runtime)

    def install(self) -> None:
        import duckdb

        con = self.connection
        for udf in (CALL_UDF, TYPE_UDF, PARSE_BLOB_UDF, PARSE_PATH_UDF):
            try:
                con.remove_function(udf)
            except duckdb.InvalidInputException:
                pass  # not registered yet
        embedding_models = self.runtime.client.settings.embedding_models

        def structure(function: str, types: list[str], options: str) -> str:
            return result_structure(function, types, options, embedding_models)

        con.create_function(TYPE_UDF, structure, ["VARCHAR", "VARCHAR[]", "VARCHAR"], "VARCHAR",
                            null_handling="special", side_effects=False)
        # side_effects=True: DuckDB must not evaluate a call twice (it would, for an expression
        # that a CTE's outer query refers to several times) nor fold it away.
        con.create_function(CALL_UDF, self._call, ["VARCHAR"] * 5 + ["BLOB[]", "VARCHAR[]"],
                            "VARCHAR", type="arrow", null_handling="special",
                            side_effects=True)
        for function in FUNCTIONS.values():
            con.execute(macro_sql(function, typed_by_endpoint=bool(embedding_models)))
        install_parse_document(con, self.runtime.client.settings)

    def execute(self, query: str, parameters: Any = None) -> Any:
        """Run one statement; DuckDB already batches, so this is ``connection.execute``.

        A binder error over ``ai_query(..., failOnError => false)``'s struct (the Databricks
        example's ``summary_analysis LIKE '%angry%'`` once failOnError is false) says which
        field to use.
        """
        import duckdb

        try:
            self._cascades.collect(self.connection, query, parameters)
            return self.connection.execute(query, parameters)
        except duckdb.BinderException as exc:
            if _NOT_CONSTANT in str(exc) and self.runtime.client.settings.embedding_models:
                raise duckdb.BinderException(
                    f"{exc}\nWhere the endpoints serve embedding models, ai_query's endpoint is "
                    "a string literal on DuckDB (its result type, FLOAT[] for an embedding model, "
                    "is fixed when the query is bound): write one ai_query per model, e.g. "
                    "CASE m WHEN 'a' THEN ai_query('a', t) ... END.") from exc
            if not _RESULT_STRUCT.search(str(exc)):
                raise
            raise duckdb.BinderException(
                f"{exc}\nThat STRUCT(result, errorMessage) is what ai_query(..., failOnError => "
                "false) returns, as in Databricks: compare its result field (summary.result "
                "LIKE '%angry%') and read errorMessage for the rows that failed.") from exc

    # -- the vectorized call ----------------------------------------------------------------
    def _bind_uncached(self, function: str, options: str) -> BoundCall:
        return FUNCTIONS[function].bind(json.loads(options))

    def _call(self, function, endpoint, text1, text2, options, file_blobs, file_paths):
        import pyarrow as pa

        spec = FUNCTIONS[function[0].as_py()]
        endpoints, firsts = endpoint.to_pylist(), text1.to_pylist()
        seconds, option_texts = text2.to_pylist(), options.to_pylist()
        blobs, paths = file_blobs.to_pylist(), file_paths.to_pylist()
        groups: dict[str, list[int]] = {}
        for i, option_text in enumerate(option_texts):
            groups.setdefault(option_text, []).append(i)
        models: dict[Any, str] = {}
        batches: list[tuple[BoundCall, list[Row]]] = []
        for option_text, indices in groups.items():
            call = self._bind(spec.name, option_text)
            files_type = json.loads(option_text).get(FILES_TYPE, _NULL_TYPE)
            files_given, one_file = files_type != _NULL_TYPE, not files_type.endswith("]")
            rows: list[Row] = []
            for i in indices:
                texts = (firsts[i], seconds[i])[:len(spec.text_params)]
                file = blobs[i] if blobs[i] is not None else paths[i]
                if file is not None and one_file:
                    file = file[0]  # a single file, passed as a list of one
                if not all(sendable(t) for t in texts) or (files_given and file is None):
                    rows.append(("", None))  # NULL (or blank) in, NULL out: nothing to send
                    continue
                if call.cascade is not None:
                    rows.append((self.runtime.model_for(spec.name, endpoints[i], required=False,
                                                        cascade=call.cascade),
                                 spec.render(*texts)))
                    continue
                if endpoints[i] not in models:
                    models[endpoints[i]] = self.runtime.model_for(
                        spec.name, endpoints[i], required=spec.endpoint_required)
                rows.append((models[endpoints[i]], spec.render(*texts), file))
            batches.append((call, rows))
        results = self._cascades.answer(spec.name, batches)
        out: list[str | None] = [None] * len(firsts)
        errors: list[str] = []
        for (call, _), indices, outcomes in zip(batches, groups.values(), results, strict=True):
            for i, (value, error) in zip(indices, outcomes, strict=True):
                if not call.fail_on_error:
                    out[i] = with_error(value, error)
                elif error is not None:
                    errors.append(error)
                elif value is not None:
                    out[i] = as_json(value)
        if errors:
            raise failure(spec.name, errors, len(firsts))
        return pa.array(out, type=pa.string())


def install_parse_document(con: Any, settings: Any = None) -> None:
    """``ai_parse_document(content)``: no model, so a plain scalar UDF (pdfium is serialized
    in-process anyway). The macro picks the BLOB or the path function by the argument's type;
    DuckDB evaluates only the CASE branch a row takes. Paths follow ``settings``' file policy."""
    result = documents.PARSED_DOCUMENT.duckdb_type()

    def parse(content: Any) -> Any:
        return documents.parse_document_value(content, settings)

    for name, kind in ((PARSE_BLOB_UDF, "BLOB"), (PARSE_PATH_UDF, "VARCHAR")):
        con.create_function(name, parse, [kind], result,
                            null_handling="special", side_effects=False)
    con.execute(
        f"CREATE OR REPLACE TEMP MACRO {documents.NAME}(content) AS CASE "
        f"WHEN typeof(content) = 'BLOB' THEN {PARSE_BLOB_UDF}(TRY_CAST(content AS BLOB)) "
        f"WHEN typeof(content) IN ('VARCHAR', 'NULL') "
        f"THEN {PARSE_PATH_UDF}(CAST(content AS VARCHAR)) "
        f"ELSE error('{documents.NAME}: content must be a BLOB (the PDF) or a VARCHAR (its "
        f"path), got ' || typeof(content)) END")


def result_structure(function: str, types: list[str], options: str,
                     embedding_models: frozenset[str] = frozenset()) -> str:
    """Bind time: check argument types, return the ``from_json`` structure of the result
    (``FLOAT[]`` for ``ai_query`` on an embedding model named by a literal)."""
    spec = FUNCTIONS[function]
    if spec is AI_QUERY:  # before the type check, which would blame failOnError
        shaping = json.loads(options)
        check_not_legacy(shaping)
        model = literal_endpoint(shaping.pop(ENDPOINT_ALIAS, None))
        if model in embedding_models:
            return json.dumps(embedding_result_type(shaping, model).duckdb_structure())
        options = json.dumps(shaping)
    for param, type_name in zip(spec.params, types, strict=True):
        type_name = type_name.strip('"')
        if type_name == "NULL" or _ACCEPTS[param.accepts](type_name):
            continue
        if spec is AI_QUERY and param.name == "request" and type_name.startswith("STRUCT("):
            continue  # a custom model's features: named_struct('f1', a, ...), sent as JSON
        hint = " (cast it with CAST(... AS VARCHAR))" if param.accepts == TEXT else ""
        raise InferenceConfigError(
            f"{spec.name}: argument '{param.name}' must be {_article(param.accepts)}, "
            f"got {type_name}{hint}. Signature: {spec.signature()}.")
    call_type = spec.result_type(json.loads(options))
    return json.dumps(call_type.duckdb_structure())


def _article(family: str) -> str:
    return f"an {family}" if family[0] in "AEIOU" else f"a {family}"


def macro_sql(spec: AIFunction, typed_by_endpoint: bool = False) -> str:
    """``CREATE TEMP MACRO`` for one function (named parameters carry the defaults).
    ``typed_by_endpoint``: ``ai_query``'s result type depends on the model its endpoint
    literal names (``FLOAT[]`` for an embedding model)."""
    params = ", ".join(p.name if p.default is REQUIRED else f"{p.name} := {_literal(p.default)}"
                       for p in spec.params)
    # The casts let the call bind whatever was passed, so that the type check below is what
    # reports a wrong argument type (by name) rather than DuckDB's "no function matches".
    texts = ([_as_text(spec, p.name) for p in spec.text_params]
             + ["NULL"] * (2 - len(spec.text_params)))
    options = [f"'{p.name}', {p.name}" for p in spec.option_params]
    shaping = ", ".join(f"'{p.name}', {p.name}" for p in spec.option_params if p.shapes_result)
    if spec is AI_QUERY and typed_by_endpoint:
        # alias() of a literal is the literal as written ('bge'), constant when the query is
        # bound, so the result type can follow the model it names. DuckDB cannot fold alias()
        # of a column, so the endpoint must then be a literal (execute() says so).
        shaping += f", '{ENDPOINT_ALIAS}', alias(endpoint)"
    types = ", ".join(f"typeof({p.name})" for p in spec.params)
    files = spec.file_param
    if files is None:
        file_args = "NULL, NULL"
    else:  # the files by their type, as lists; only the branch of the argument's type runs
        name = files.name
        options.append(f"'{FILES_TYPE}', typeof({name})")
        file_args = ", ".join(
            f"CASE WHEN {name} IS NULL THEN NULL WHEN typeof({name}) = '{kind}' "
            f"THEN [TRY_CAST({name} AS {kind})] WHEN typeof({name}) = '{kind}[]' "
            f"THEN TRY_CAST({name} AS {kind}[]) END" for kind in ("BLOB", "VARCHAR"))
    return (
        f"CREATE OR REPLACE TEMP MACRO {spec.name}({params}) AS from_json("
        f"{CALL_UDF}('{spec.name}', CAST(endpoint AS VARCHAR), {texts[0]}, {texts[1]}, "
        f"json_object({', '.join(options)}), {file_args}), "
        f"{TYPE_UDF}('{spec.name}', [{types}], json_object({shaping})))"
    )


def _as_text(spec: AIFunction, name: str) -> str:
    """A text argument as VARCHAR; ai_query's request may be a STRUCT (a custom model's
    features), which goes as its JSON (DuckDB's own cast would give {'f1': 1})."""
    if spec is AI_QUERY and name == "request":
        return (f"CASE WHEN starts_with(typeof({name}), 'STRUCT') THEN CAST(to_json({name}) AS "
                f"VARCHAR) ELSE CAST({name} AS VARCHAR) END")
    return f"CAST({name} AS VARCHAR)"


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(int(value))
