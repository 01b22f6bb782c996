"""``build_inference_asset``: "this table, this prompt, this model, this column" as an asset."""

import json
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from ..core import InferenceCall
from .shared import AssetJob, AssetOptions, asset_factory, build_asset


@asset_factory()
def build_inference_asset(
    options: AssetOptions,
    *,
    call: InferenceCall | None = None,
    expand_fields: bool = True,
    mode: str = "online",
    wait: bool = True,
    deadline: Any = None,
    **call_fields: Any,
) -> dg.AssetsDefinition:
    """Build a software-defined asset that runs batch inference over an upstream table.

    What to send is an :class:`~dagster_batchllm.core.tasks.chat.call.InferenceCall`: pass one as
    ``call``, or its fields as keywords (``prompt=``, ``model=``, ``output_column=``,
    ``max_tokens=``, ``response_format=``, ``generation_params=``, ``token_budget=`` ...).
    The upstream asset's value (a pandas DataFrame, loaded by its IO manager) gets
    ``output_column`` and ``<output_column>_error``; with a JSON-schema ``response_format`` the
    reply's fields also become columns. Partitioned assets infer only their partitions' rows;
    with ``partition_column`` a single run can cover many partitions (a single-run backfill) and
    each partition's rows are still recorded in the ledger under their own partition key, so the
    retry-partitions sensor can re-run exactly the partitions with failed or deferred rows.

    Each partition's materialization carries that partition's own figures, also in a
    single-run backfill: its rows (which failed, and why: ``key_columns`` name the columns that
    identify a row in that table), what this run paid for it (``batchllm/run/...``) and what
    the answers it holds cost (``batchllm/answers/...``, from the ledger); the checks are
    partitioned too (see :mod:`dagster_batchllm.factories.metadata` and
    :mod:`dagster_batchllm.factories.checks`).
    The asset's code version is the call's (:attr:`InferenceCall.code_version`), so editing the
    prompt, model or generation parameters marks it and what it feeds unsynced; with
    ``resource=`` (the resource its runs use) it is the call as that resource sends it
    (:meth:`~dagster_batchllm.resource.BatchInferenceResource.code_version_of`), so a new
    ``default_model`` does too.

    ``asset_attributes`` are Dagster's asset attributes (what a component's
    ``asset_attributes:`` resolves to): ``group_name``, ``description``, ``kinds``, ``tags``,
    ``owners``, ``metadata``, ``deps``, ``code_version``, ``automation_condition``,
    ``freshness_policy``. ``group_name=`` ... ``owners=`` are the same attributes as keywords.

    ``mode="batch_api"`` sends the rows through the provider's offline batch API (an endpoint
    with ``batch_api=True``) at its batch price; with ``wait=False`` a run returns once the
    batches are submitted, its rows deferred, and ``build_batch_collect_sensor`` launches the
    partition again when its batches end (that run collects, submitting nothing).
    ``deadline`` (with ``mode="batch_api"``) says by when each partition is answered: a
    ``timedelta`` after the end of its time window (``timedelta(hours=9)``: 09:00 the day after
    a daily partition; from the run's start without a time window), a ``datetime``, or a
    function ``(partition_key) -> datetime | timedelta``; the rows the batches have not answered
    in time go online (see :mod:`dagster_batchllm.factories.deadlines`), and each partition's
    ``batchllm/deadline/...`` figures say what went which way, at what cost.

    Example::

        import dagster as dg
        from dagster_batchllm import BatchInferenceResource, Endpoint, build_inference_asset

        summaries = build_inference_asset(
            name="transcript_summaries",
            source="cleaned_transcripts",
            prompt="Summarize this call transcript: {transcript_text}",
            model="llama-70b",
            output_column="summary",
            max_tokens=128,
        )
        defs = dg.Definitions(
            assets=[summaries],
            resources={"llm": BatchInferenceResource(endpoints=[Endpoint(
                name="gpu-a", base_url="http://127.0.0.1:8000/v1", models=["llama-70b"])])},
        )
    """

    def job() -> InferenceJob:
        chat = InferenceCall.of(call, **call_fields)
        return InferenceJob(chat, mode=mode, wait=wait, deadline=deadline,
                            expand_fields=expand_fields)

    return build_asset("build_inference_asset", options, job)


class InferenceJob(AssetJob):
    """A chat call per row: its answer in ``output_column``, a structured reply's fields as
    columns of their own, online or through the provider's batch API."""

    call: InferenceCall

    def __init__(self, call: InferenceCall, *, mode: str, wait: bool,
                 expand_fields: bool, deadline: Any = None) -> None:
        super().__init__(call, mode=mode, wait=wait, deadline=deadline)
        self.schema_fields = _schema_fields(call.response_format) if expand_fields else []

    def send(self, llm: Any, frame: Any, **run: Any) -> Any:
        return llm.infer(frame, self.call, **run, collect_keys=True, mode=self.mode,
                         wait=self.wait)

    def description(self) -> str:
        return _describe(self.call, self.schema_fields)

    def version_covers(self) -> str:
        return ("the prompt, system prompt, model, generation parameters (max_tokens among "
                "them), response format and image inputs")

    def shape(self, table: Any) -> Any:
        if not self.schema_fields:
            return table
        return _expand_fields(table, self.call.output_column, self.schema_fields)

    def column_docs(self, input_columns: Sequence[str]
                    ) -> tuple[dict[str, str], dict[str, str]]:
        return _column_docs(self.call, self.schema_fields, input_columns)

    def models_named(self, settings: Any) -> str:
        return _models_named(self.call, settings.model_when_unnamed)


def _schema_fields(response_format: Mapping[str, Any] | None) -> list[str]:
    if not response_format or response_format.get("type") != "json_schema":
        return []
    schema = response_format["json_schema"].get("schema") or {}
    properties = schema.get("properties")
    return list(properties) if schema.get("type") == "object" and properties else []


def _expand_fields(df: Any, output_column: str, fields: list[str]) -> Any:
    """Structured replies: one column per schema field, and the reply itself as JSON text."""
    out = df.copy()
    values = out[output_column]
    for field in fields:
        column = field if field not in out.columns else f"{output_column}_{field}"
        out[column] = values.map(lambda v, f=field: v.get(f) if isinstance(v, dict) else None)
    out[output_column] = values.map(lambda v: json.dumps(v) if isinstance(v, dict) else v)
    return out


def _models_named(call: InferenceCall, default_model: str | None) -> str:
    """The model(s) the call names, for a log line when no figure names one."""
    if call.model:
        return call.model
    if call.model_column:
        return f"models from column {call.model_column}"
    return default_model or "the resource's default_model"


_JSON_TYPES = {"string": "string", "integer": "int", "number": "float", "boolean": "bool",
               "array": "json", "object": "json"}


def _column_docs(call: InferenceCall, schema_fields: list[str], input_columns: Sequence[str]
                 ) -> tuple[dict[str, str], dict[str, str]]:
    """Descriptions and types of the columns the asset adds (the others are the input's)."""
    unanswered = f"null where the row failed or was deferred (see `{call.error_column}`)"
    descriptions = {
        call.output_column: (f"The model's reply as JSON text; {unanswered}." if call.structured
                             else f"The model's answer; {unanswered}."),
        call.error_column: ("Why the row has no answer, as '<error_type>: <reason>' (what each "
                            "type means: batchllm/errors_by_type); null where it succeeded."),
    }
    types = {call.output_column: "json" if call.structured else "string",
             call.error_column: "string"}
    properties = (call.schema or {}).get("properties") or {}
    for field in schema_fields:
        spec = properties.get(field) or {}
        choices = f": one of {', '.join(map(str, spec['enum']))}" if spec.get("enum") else ""
        text = f"Field `{field}` of the structured reply{choices}; {unanswered}."
        kind = spec.get("type")
        # The column _expand_fields gives the field: its name, unless an input column has it.
        column = field if field not in input_columns else f"{call.output_column}_{field}"
        descriptions[column] = text
        if isinstance(kind, str) and kind in _JSON_TYPES:
            types[column] = _JSON_TYPES[kind]
    return descriptions, types


def _describe(call: InferenceCall, schema_fields: Sequence[str] = ()) -> str:
    """What the asset sends, in the words a user looks for: model, prompts, schema."""
    if call.model:
        who = f"model `{call.model}`"
    elif call.model_column:
        who = f"per-row models from column `{call.model_column}`"
    else:
        who = "the resource's `default_model`"
    what = (f"the prompt template `{call.prompt}`" if call.prompt else
            f"prompts from column `{call.prompt_column or call.messages_column}`")
    parts = [f"Batch LLM inference with {who}: {what}; answers in `{call.output_column}`, "
             f"failed rows' reasons in `{call.error_column}`."]
    if call.system:
        parts.append(f"System prompt:\n\n```text\n{call.system}\n```")
    if call.schema is not None:
        parts.append("JSON schema of the replies"
                     + (f" (its fields become columns: {', '.join(schema_fields)})"
                        if schema_fields else "")
                     + f":\n\n```json\n{json.dumps(call.schema, indent=2)}\n```")
    params = call.request_params
    if params:
        parts.append("Generation parameters: "
                     + ", ".join(f"`{k}={v}`" for k, v in sorted(params.items())) + ".")
    return "\n\n".join(parts)
