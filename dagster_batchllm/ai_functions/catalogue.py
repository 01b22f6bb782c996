"""The catalogue: ``ai_query`` and the Databricks AI functions, defined once for every engine.

Each :class:`AIFunction` lists its SQL parameters and binds their constant values to a
:class:`~dagster_batchllm.ai_functions.calls.BoundCall`; ``render`` turns a row's text
argument(s) into the user message. The AI functions are thin layers over ``ai_query``: a system
prompt, a JSON schema where the answer has a shape (a label, a score, extracted fields) and a
reader that takes the SQL value out of the parsed reply. The content goes in the user message,
apart from the instructions, so a transcript cannot rewrite the instructions by accident.

Every function accepts an ``endpoint`` (the served model name) after its Databricks arguments;
without one it uses the default model (``register_ai_functions(default_model=...)``, else the
resource's ``default_model``, else the only served model).

Example::

    >>> from dagster_batchllm.ai_functions.catalogue import FUNCTIONS
    >>> call = FUNCTIONS["ai_classify"].bind({"labels": ["refund", "complaint"]})
    >>> call.response_format["properties"]["label"]["enum"]
    ['refund', 'complaint']
    >>> call.reader({"label": "refund"})
    'refund'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from ..core import InferenceConfigError
from .calls import (
    BoundCall,
    as_bool,
    as_int,
    as_labels,
    as_text,
    model_parameters,
    read_outcome,
    response_format,
    result_struct,
    return_type,
)
from .cascade_options import Cascade
from .schemas import read_return_type, return_type_format
from .types import FLOAT, STRING, SQLType, struct

REQUIRED = object()
BOOLEAN_TYPE = SQLType("BOOLEAN")
T = TypeVar("T")

# Families of DuckDB types an argument accepts (checked on ``typeof(argument)``).
TEXT, INTEGER, BOOLEAN, LABELS, OBJECT = "STRING", "INTEGER", "BOOLEAN", "ARRAY<STRING>", "STRUCT"
FILES = "BINARY or STRING (or an ARRAY of either)"  # image bytes, or a path or URL


@dataclass(frozen=True)
class Param:
    name: str
    # "endpoint", "text" (one per row), "option" (constant for the call) or "files" (one image
    # per row, sent with the request: see FILES_PARAM)
    kind: str
    accepts: str = TEXT
    default: Any = REQUIRED
    shapes_result: bool = False  # the result type depends on it (so it must be a constant)


@dataclass(frozen=True)
class AIFunction:
    name: str
    params: tuple[Param, ...]
    bind_options: Callable[[Mapping[str, Any]], BoundCall]
    result_type: Callable[[Mapping[str, Any]], SQLType]
    render: Callable[..., str]
    summary: str

    @property
    def text_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kind == "text")

    @property
    def file_param(self) -> Param | None:
        return next((p for p in self.params if p.kind == "files"), None)

    @property
    def endpoint_required(self) -> bool:
        """ai_query names its model; the AI functions fall back to the default model."""
        return self.params[0].kind == "endpoint" and self.params[0].default is REQUIRED

    @property
    def option_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kind == "option")

    def bind(self, options: Mapping[str, Any]) -> BoundCall:
        """Check the constant arguments (by name; absent ones take their defaults)."""
        return self.bind_options({p.name: options.get(p.name) for p in self.option_params})

    def signature(self) -> str:
        parts = [p.name if p.default is REQUIRED else f"[{p.name}]" for p in self.params]
        return f"{self.name}({', '.join(parts)})"


def _endpoint() -> Param:
    return Param("endpoint", "endpoint", default=None)


def _only(text: str, *_: Any) -> str:
    return text


def _field(name: str, value: Any) -> Any:
    return value[name]


def _score(value: Any) -> float:
    return float(value["score"])  # JSON "1" is an integer; the SQL type is FLOAT


def _object_schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


# -- ai_query -----------------------------------------------------------------------------------
def _result_options(o: Mapping[str, Any]
                    ) -> tuple[dict[str, Any] | None, SQLType | None, SQLType | None]:
    """(the responseFormat to send, its SQL type, the returnType): checked, before any request.

    Both at once is refused: on a chat model each asks for the reply's shape, and which one
    should win is for the query to say, not for this function to guess.
    """
    check_not_legacy(o)
    if o.get("returnType") is not None and o.get("responseFormat") is not None:
        raise InferenceConfigError(
            "ai_query: pass returnType or responseFormat, not both. On a chat model "
            "returnType => 'BOOLEAN' (or 'ARRAY<STRING>', 'STRUCT<risk: STRING, score: INT>' "
            "...) asks for that type as structured output, as responseFormat does with a JSON "
            "schema; a custom (MLflow) model takes returnType only.")
    fmt, fmt_type = response_format("ai_query", o.get("responseFormat"))
    return fmt, fmt_type, return_type("ai_query", o.get("returnType"))


def _ai_query_type(o: Mapping[str, Any]) -> SQLType:
    _, fmt_type, declared = _result_options(o)
    result = fmt_type or declared or STRING
    fail = as_bool("ai_query", "failOnError", o.get("failOnError"), True)
    return result if fail else result_struct(result)


def _bind_ai_query(o: Mapping[str, Any]) -> BoundCall:
    fmt, fmt_type, declared = _result_options(o)
    typed = declared is not None and not declared.is_text
    return BoundCall(
        "ai_query",
        params=model_parameters("ai_query", o.get("modelParameters")),
        # A chat model is asked for the returnType (a STRING is its plain reply); a custom
        # model's prediction text is read as it (see schemas.read_return_type).
        response_format=return_type_format(declared) if typed else fmt,
        result_type=fmt_type or declared or STRING,
        fail_on_error=as_bool("ai_query", "failOnError", o.get("failOnError"), True),
        reader=partial(read_return_type, t=declared) if typed else None,
        format_from_return_type=typed,
    )


def legacy_options(function: AIFunction, rest: Sequence[T], key_of: Callable[[T], Any]
                   ) -> dict[str, T] | None:
    """The options of the older ``ai_query`` form, or None when ``rest`` is not written so.

    Databricks' earlier reference page documents ``ai_query(endpointName, request[, param1,
    value1] [...])``, as in ``ai_query('qa_bot', prompt, 'returnType', 'STRING')``: name/value
    pairs after the request, the names case-sensitive string literals. ``rest`` is the arguments
    after the request as written, ``key_of`` a string literal's value (None for anything else).
    The forms cannot be confused: no type string is named ``returnType``. Raises
    :class:`InferenceConfigError` for pairs that are malformed.
    """
    if function.name != "ai_query" or not rest:
        return None
    names = [p.name for p in function.option_params]
    first = key_of(rest[0])
    if not isinstance(first, str) or first.lower() not in (n.lower() for n in names):
        return None
    if len(rest) % 2:
        raise InferenceConfigError(
            f"ai_query: the name/value pairs after the request are uneven; the name "
            f"{key_of(rest[-1])!r} has no value. Write ai_query(endpoint, request, "
            "'returnType', 'STRING') or, as Databricks' current form does, returnType => "
            "'STRING'.")
    options: dict[str, T] = {}
    for key_argument, value in zip(rest[::2], rest[1::2], strict=True):
        key = key_of(key_argument)
        if key not in names:
            close = [n for n in names if isinstance(key, str) and n.lower() == key.lower()]
            raise InferenceConfigError(
                f"ai_query: {key!r} is not a parameter name for the name/value pairs after "
                + (f"the request (names are case-sensitive: write {close[0]!r})." if close else
                   f"the request; names: {names}."))
        if key in options:
            raise InferenceConfigError(f"ai_query: argument '{key}' is given twice.")
        options[key] = value
    return options


def check_not_legacy(options: Mapping[str, Any]) -> None:
    """Refuse the older name/value form where an engine reads arguments by position only.

    DuckDB and SQLite SQL pass ``ai_query``'s options by position (or by DuckDB name), so
    ``ai_query(e, r, 'returnType', 'STRING')`` would read 'returnType' as the returnType.
    """
    named = options.get("returnType")
    if isinstance(named, str) and named.lower() in {p.name.lower() for p in
                                                   AI_QUERY.option_params}:
        raise InferenceConfigError(
            f"ai_query: {named!r} in the returnType position is the older Databricks form "
            "ai_query(endpoint, request, 'returnType', 'STRING') (name/value pairs). Run the "
            "query with dialect='databricks', which reads the pairs, or write the option by "
            "name: returnType := 'STRING' in DuckDB, the type as the third argument in SQLite.")


# Databricks' ``ai_query(endpoint, request, files => content)``: ``content`` is each row's image
# (a BINARY column, as ``read_files(..., format => 'binaryFile')`` gives; here also a path or an
# http(s) URL), sent as an image part of the request's user message (see core/images.py). A
# NULL file gives NULL without a request, as a NULL request does.
FILES_PARAM = Param("files", "files", FILES, None)

AI_QUERY = AIFunction(
    "ai_query",
    (Param("endpoint", "endpoint"), Param("request", "text"),
     Param("returnType", "option", TEXT, None, shapes_result=True),
     Param("failOnError", "option", BOOLEAN, True, shapes_result=True),
     Param("modelParameters", "option", OBJECT, None),
     Param("responseFormat", "option", TEXT, None, shapes_result=True),
     FILES_PARAM),
    _bind_ai_query, _ai_query_type, _only,
    "Send each row's request to a served model; the Databricks signature.",
)


# -- the AI functions -----------------------------------------------------------------------------
def _bind_summarize(o: Mapping[str, Any]) -> BoundCall:
    words = as_int("ai_summarize", "max_words", o["max_words"], 50)
    limit = f" in at most {words} words" if words else ""
    params = {"max_tokens": 2 * words + 32} if words else {}  # ~1.3 tokens a word, and slack
    return BoundCall("ai_summarize", params=params, system=(
        f"Summarize the text the user sends{limit}. Keep who wanted what, the outcome and the "
        "customer's mood. Reply with the summary only, without a preamble."))


def _bind_classify(o: Mapping[str, Any]) -> BoundCall:
    labels = as_labels("ai_classify", "labels", o["labels"], minimum=2)
    return BoundCall(
        "ai_classify",
        cascade=Cascade.parse(o.get("cascade"), "ai_classify: argument 'cascade'"),
        system=("Classify the text the user sends into exactly one of these labels: "
                f"{json.dumps(list(labels), ensure_ascii=False)}. Answer in JSON."),
        response_format=_object_schema(label={"type": "string", "enum": list(labels)}),
        reader=partial(_field, "label"),
        null_when_unreadable=True,  # documented: NULL when the content cannot be classified
    )


def _extract_type(o: Mapping[str, Any]) -> SQLType:
    labels = as_labels("ai_extract", "labels", o.get("labels"))
    return struct(**dict.fromkeys(labels, STRING))


def _bind_extract(o: Mapping[str, Any]) -> BoundCall:
    labels = as_labels("ai_extract", "labels", o["labels"])
    return BoundCall(
        "ai_extract",
        system=("Extract these kinds of entities from the text the user sends: "
                f"{json.dumps(list(labels), ensure_ascii=False)}. For each, give the entity as "
                "written in the text, or null when the text has none. Answer in JSON."),
        response_format=_object_schema(**{label: {"type": ["string", "null"]}
                                           for label in labels}),
        result_type=_extract_type(o),
        null_when_unreadable=True,  # undocumented; NULL, apart from a STRUCT of NULL fields
    )


def _bind_filter(o: Mapping[str, Any]) -> BoundCall:
    predicate = as_text("ai_filter", "predicate", o["predicate"])
    return BoundCall(
        "ai_filter",
        system=("Decide whether the text the user sends satisfies this predicate: "
                f"{predicate.strip()}\nAnswer in JSON: answer is true or false."),
        response_format=_object_schema(answer={"type": "boolean"}),
        result_type=BOOLEAN_TYPE,
        reader=_answer,
        null_when_unreadable=True,  # as ai_classify: NULL when the reply cannot be read
        cascade=Cascade.parse(o.get("cascade"), "ai_filter: argument 'cascade'"),
    )


def _answer(value: Any) -> bool:
    answer = value["answer"]
    if not isinstance(answer, bool):
        raise TypeError(f"'answer' is {type(answer).__name__} {answer!r}, not true or false")
    return answer


_SENTIMENTS = ["positive", "negative", "neutral", "mixed"]


def _bind_sentiment(o: Mapping[str, Any]) -> BoundCall:
    return BoundCall(
        "ai_analyze_sentiment",
        system=("Judge the overall sentiment of the text the user sends: positive, negative, "
                "neutral or mixed. Answer in JSON."),
        response_format=_object_schema(sentiment={"type": "string", "enum": _SENTIMENTS}),
        reader=partial(_field, "sentiment"),
        null_when_unreadable=True,  # documented: NULL when the sentiment cannot be detected
    )


def _bind_translate(o: Mapping[str, Any]) -> BoundCall:
    language = as_text("ai_translate", "to_lang", o["to_lang"])
    return BoundCall("ai_translate", system=(
        f"Translate the text the user sends into {language}. Keep names, numbers and "
        "formatting. Reply with the translation only."))


def _bind_fix_grammar(o: Mapping[str, Any]) -> BoundCall:
    return BoundCall("ai_fix_grammar", system=(
        "Correct the grammar, spelling and punctuation of the text the user sends without "
        "changing its meaning, tone or language. Reply with the corrected text only."))


def _bind_mask(o: Mapping[str, Any]) -> BoundCall:
    labels = as_labels("ai_mask", "labels", o["labels"])
    return BoundCall("ai_mask", system=(
        "Replace every piece of the following kinds of information in the text the user sends "
        f"with [MASKED]: {json.dumps(list(labels), ensure_ascii=False)}. Keep everything else "
        "exactly as written. Reply with the masked text only."))


def _bind_gen(o: Mapping[str, Any]) -> BoundCall:
    # No system prompt: the user's prompt is the whole instruction (as ai_query with it).
    return BoundCall("ai_gen")


def _bind_similarity(o: Mapping[str, Any]) -> BoundCall:
    return BoundCall(
        "ai_similarity",
        system=("Rate how similar in meaning the two texts the user sends are, from 0 "
                "(unrelated) to 1 (the same meaning). Answer in JSON."),
        response_format=_object_schema(score={"type": "number", "minimum": 0, "maximum": 1}),
        result_type=FLOAT,
        reader=_score,
        null_when_unreadable=True,  # undocumented; as the other functions that read JSON
    )


def _pair(a: str, b: str) -> str:
    return f"Text 1:\n{a}\n\nText 2:\n{b}"


def _fixed(sql_type: SQLType) -> Callable[[Mapping[str, Any]], SQLType]:
    return lambda _options: sql_type


_CONTENT = Param("content", "text")
# A cascade (see dagster_batchllm.semantic): a STRUCT, MAP or JSON object of Cascade's fields.
_CASCADE = Param("cascade", "option", OBJECT, None)
AI_FUNCTIONS = (
    AIFunction("ai_summarize", (_CONTENT, Param("max_words", "option", INTEGER, 50),
                                _endpoint()),
               _bind_summarize, _fixed(STRING), _only, "A summary of at most max_words words."),
    AIFunction("ai_classify", (_CONTENT, Param("labels", "option", LABELS), _endpoint(),
                               _CASCADE),
               _bind_classify, _fixed(STRING), _only, "The one label that fits the content."),
    AIFunction("ai_filter", (Param("predicate", "option"), _CONTENT, _endpoint(), _CASCADE),
               _bind_filter, _fixed(BOOLEAN_TYPE), _only,
               "Whether the content satisfies the predicate; NULL when the reply is unreadable."),
    AIFunction("ai_extract", (_CONTENT, Param("labels", "option", LABELS, shapes_result=True),
                              _endpoint()),
               _bind_extract, _extract_type, _only,
               "A STRUCT with one field per label: the entity found, or NULL."),
    AIFunction("ai_analyze_sentiment", (_CONTENT, _endpoint()), _bind_sentiment,
               _fixed(STRING), _only, "positive, negative, neutral or mixed."),
    AIFunction("ai_translate", (_CONTENT, Param("to_lang", "option"), _endpoint()),
               _bind_translate, _fixed(STRING), _only, "The content in language to_lang."),
    AIFunction("ai_fix_grammar", (_CONTENT, _endpoint()), _bind_fix_grammar, _fixed(STRING),
               _only, "The content with grammar and spelling corrected."),
    AIFunction("ai_mask", (_CONTENT, Param("labels", "option", LABELS), _endpoint()),
               _bind_mask, _fixed(STRING), _only,
               "The content with the labelled kinds of information replaced by [MASKED]."),
    AIFunction("ai_gen", (Param("prompt", "text"), _endpoint()), _bind_gen, _fixed(STRING),
               _only, "The model's answer to the prompt."),
    AIFunction("ai_similarity", (Param("expr1", "text"), Param("expr2", "text"), _endpoint()),
               _bind_similarity, _fixed(FLOAT), _pair,
               "Semantic similarity of two texts, from 0 to 1."),
)

FUNCTIONS: dict[str, AIFunction] = {f.name: f for f in (AI_QUERY, *AI_FUNCTIONS)}


def read_result(call: BoundCall, output: Any, error: str | None) -> tuple[Any, str | None]:
    """One row's ``infer`` output and error -> ``(SQL value, error)``, as the engines read it.

    For engines outside this module (Spark): ``call.reader`` takes the value out of the parsed
    reply (the label, the score); a reply it cannot read becomes the row's error.

    >>> call = FUNCTIONS["ai_similarity"].bind({})
    >>> read_result(call, {"score": 1}, None)
    (1.0, None)
    """
    return read_outcome(call, (output, error))
