"""The one body of every batchllm asset factory.

``build_inference_asset``, ``build_embedding_asset`` and ``build_scoring_asset`` are thin: each
says how its call is made and which call fields it takes (an :class:`AssetJob`). What they
share lives here, once:

* :class:`AssetOptions`: the keywords every factory takes (name, source, partitions, the
  checks' thresholds, ...), with their defaults and descriptions. :func:`asset_factory` gives
  a factory these keywords, and the Components read their YAML attributes from the same
  fields (:mod:`dagster_batchllm.components.attributes`).
* :func:`check_options`: the definition mistakes every factory refuses, among them
  thresholds outside ``0 <= warn_failed_rate <= error_failed_rate <= 1``.
* :func:`build_asset`: the asset's spec (key, input, deps, partitions and backfill policy,
  Dagster's attributes, kinds, code version, metadata, checks) and its run: one call per
  partition of the run, then per partition its figures and checks (:mod:`.partitions`).

Example (the factory of a new job)::

    @asset_factory()
    def build_my_asset(options: AssetOptions, *, call=None, **call_fields):
        return build_asset("build_my_asset", options,
                           lambda: MyJob(MyCall.of(call, **call_fields)))
"""

import dataclasses
import functools
import inspect
import numbers
import typing
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import dagster as dg

from ..core import InferenceConfigError, check_mode, validate_identifier
from .checks import EMPTY_PARTITION_POLICIES, inference_check_specs
from .deadlines import check_deadline, describe_deadline, run_deadlines
from .metadata import (
    answer_figures,
    batch_figures,
    column_schema,
    deadline_figures,
    run_figures,
    summary_line,
    table_figures,
)
from .partitions import Figures, LogLine, call_per_partition, partition_events


def _option(description: str, default: Any = dataclasses.MISSING, *, yaml: bool = True) -> Any:
    """A field of :class:`AssetOptions`. ``yaml=False``: a Component has no attribute of that
    name (a Python function, or one of Dagster's attributes, which YAML gives in
    ``asset_attributes``)."""
    return dataclasses.field(default=default, metadata={"description": description, "yaml": yaml})


@dataclass(frozen=True)
class AssetOptions:
    """The keywords every asset factory takes, in the order its signature shows them."""

    name: str = _option("The asset's name (also the ledger scope of its rows).")
    source: Any = _option("The upstream asset whose table is read: its definition, spec or "
                          "key (e.g. cleaned_transcripts, warehouse/calls).")
    partitions_def: dg.PartitionsDefinition | None = _option(
        "Partitions of the asset; each run calls only its partitions' rows.", None)
    partition_column: str | None = _option(
        "The input column holding each row's partition key (enables single-run backfills that "
        "still record each partition separately).", None)
    backfill_policy: dg.BackfillPolicy | None = _option(
        "How backfills run: single_run (needs partition_column) or multi_run; by default "
        "single_run with partition_column and one partition per run without.", None)
    transform: Callable[[Any], Any] | None = _option(
        "A function applied to the output table before it is written.", None, yaml=False)
    resource_key: str = _option(
        "The key of the BatchInferenceResource the asset uses (a Component that declares its "
        "resource provides it under this key; a differently configured one needs another).",
        "llm")
    resource: Any = _option(
        "The BatchInferenceResource the asset's runs use (the one under resource_key), read "
        "for the code version: with it, the version also covers what that resource fills in "
        "where the call says nothing (its default_model, default_max_tokens) and the served "
        "model version its endpoints declare, so switching the model marks the asset stale. "
        "Definitions' resources still provide it to the runs (a Component passes its own).",
        None, yaml=False)
    io_manager_key: str | None = _option("The IO manager that stores the output table.", None)
    group_name: str | None = _option("Dagster's group_name.", None, yaml=False)
    description: str | None = _option(
        "Dagster's description (by default: what the asset sends, and to which model).", None,
        yaml=False)
    kinds: set[str] | None = _option("Dagster's kinds.", None, yaml=False)
    tags: Mapping[str, str] | None = _option("Dagster's tags.", None, yaml=False)
    owners: Sequence[str] | None = _option("Dagster's owners.", None, yaml=False)
    pool: str | None = _option(
        "A Dagster concurrency pool, to cap how many of these steps run at once.", None)
    warn_failed_rate: float = _option(
        "failed_row_rate check: WARN above this share of failed rows.", 0.01)
    error_failed_rate: float = _option(
        "failed_row_rate check: ERROR above this share of failed rows.", 0.10)
    empty_partition: Literal["warn", "error", "pass"] = _option(
        "row_count_matches_input check of a partition without input rows (of an unpartitioned "
        "asset: a run over an empty table): warn, error, or pass where empty days are normal.",
        "warn")
    preview_rows: int = _option("How many rows the materialization's preview shows.", 5)
    key_columns: Sequence[str] | None = _option(
        "Input columns that identify a row (e.g. [call_id]); the metadata's table of failed "
        "rows names them by these.", None)
    asset_attributes: Mapping[str, Any] | None = _option(
        "Dagster's asset attributes: group_name, description, kinds, tags, owners, metadata, "
        "deps, code_version, automation_condition, freshness_policy.", None)


OPTION_FIELDS = tuple(dataclasses.fields(AssetOptions))
_FIRST = ("name", "source")  # every factory's, and first in its signature
_HINTS = typing.get_type_hints(AssetOptions)
# Dagster's asset attributes (a component's asset_attributes) that dg.asset takes as they are.
ASSET_ATTRIBUTES = frozenset({
    "group_name", "description", "kinds", "tags", "owners", "metadata", "deps", "code_version",
    "automation_condition", "freshness_policy",
})


def asset_factory(*, without: Collection[str] = ()) -> Callable[[Callable[..., Any]],
                                                               Callable[..., Any]]:
    """Give a job's factory the keywords of :class:`AssetOptions` (but those in ``without``).

    The decorated function takes ``options`` first, then its own keyword-only arguments (and
    may end with ``**call_fields``). The factory it makes takes keywords only: ``name`` and
    ``source``, its own, then the other options; what a caller leaves out has the option's
    default, and the function gets them as one :class:`AssetOptions`. Its signature and
    docstring list them all; ``factory.options`` are the fields it takes (what a Component
    reads for its YAML attributes).
    """
    unknown = set(without) - {f.name for f in OPTION_FIELDS if f.name not in _FIRST}
    if unknown:
        raise TypeError(f"asset_factory: no option {sorted(unknown)} a factory can go without")
    taken = tuple(f for f in OPTION_FIELDS if f.name not in without)

    def decorate(build: Callable[..., Any]) -> Callable[..., Any]:
        own = list(inspect.signature(build, eval_str=True).parameters.values())[1:]
        shared = [inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, annotation=_HINTS[f.name],
            default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
            for f in taken]
        variadic = [p for p in own if p.kind is inspect.Parameter.VAR_KEYWORD]
        own = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
        signature = inspect.Signature(
            [*(p for p in shared if p.name in _FIRST), *own,
             *(p for p in shared if p.name not in _FIRST), *variadic],
            return_annotation=inspect.signature(build, eval_str=True).return_annotation)

        @functools.wraps(build)
        def factory(*args: Any, **kwargs: Any) -> Any:
            arguments = signature.bind(*args, **kwargs)  # a TypeError as for a plain function
            arguments.apply_defaults()
            given = dict(arguments.arguments)
            extra = given.pop(variadic[0].name) if variadic else {}
            options = AssetOptions(**{f.name: given.pop(f.name) for f in taken})
            return build(options, **given, **extra)

        factory.__signature__ = signature  # type: ignore[attr-defined]
        factory.__doc__ = f"{inspect.cleandoc(build.__doc__ or '')}\n\n{_options_doc(taken)}"
        factory.options = taken  # type: ignore[attr-defined]
        return factory

    return decorate


def _options_doc(taken: Sequence[dataclasses.Field]) -> str:
    lines = [f"* ``{f.name}``: {f.metadata['description']}" for f in taken]
    return "The keywords it shares with the other asset factories:\n\n" + "\n".join(lines)


def check_options(where: str, options: AssetOptions) -> None:
    """The definition mistakes every factory refuses, each saying what to fix."""
    warn, error = options.warn_failed_rate, options.error_failed_rate
    numbers_given = all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                        for v in (warn, error))
    if not numbers_given or not 0 <= warn <= error <= 1:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: need 0 <= warn_failed_rate <= error_failed_rate <= 1, got {warn!r} and "
            f"{error!r}.")
    if options.empty_partition not in EMPTY_PARTITION_POLICIES:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: empty_partition is one of {list(EMPTY_PARTITION_POLICIES)}, got "
            f"{options.empty_partition!r}.")
    if options.partition_column is not None and options.partitions_def is None:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: partition_column is only meaningful with partitions_def.")
    policy = options.backfill_policy
    if (options.partitions_def is not None and options.partition_column is None
            and policy is not None and (policy.max_partitions_per_run or 2) > 1):
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: a backfill policy with several partitions per run needs "
            "partition_column= (the column holding each row's partition key), so each "
            "partition's rows are recorded under their own key.")


class AssetJob:
    """What one job's asset says for itself; :func:`build_asset` does the rest.

    A job makes its call (:meth:`send`) and describes what it adds to the table
    (:meth:`description`, :meth:`column_docs`). The other methods have defaults that fit a
    call the ledger records: the code version is the call's, the figures are what the run
    paid and what the table's answers cost. ``mode`` and ``wait`` say how its requests go
    (online, or through a provider's batch API at its batch price): the job's :meth:`send`
    passes them on, the metadata and prices follow them here. ``deadline`` (with
    ``mode="batch_api"``): when each partition must be answered by (:mod:`.deadlines`); the
    asset's run resolves it per partition and passes it to :meth:`send` as ``deadline=``.
    """

    #: The asset's kinds unless the user gives some.
    kinds: ClassVar[frozenset[str]] = frozenset({"batchllm", "pandas"})

    def __init__(self, call: Any, *, mode: str = "online", wait: bool = True,
                 deadline: Any = None) -> None:
        check_mode(mode, wait)
        check_deadline(deadline, mode)
        self.call, self.mode, self.wait, self.deadline = call, mode, wait, deadline

    def send(self, llm: Any, frame: Any, **run: Any) -> Any:
        """The call over one partition's rows (``run``: context, partition_key, ...)."""
        raise NotImplementedError

    def description(self) -> str:
        raise NotImplementedError

    def column_docs(self, input_columns: Sequence[str]
                    ) -> tuple[dict[str, str], dict[str, str]]:
        """Descriptions and types of the columns the call adds."""
        raise NotImplementedError

    def code_version(self, resource: Any = None) -> str:
        """The asset's code version: the call's as ``resource`` answers it
        (``resource.code_version_of``), or the call's own without a resource."""
        if resource is None:
            return self.call.code_version
        return resource.code_version_of(self.call)

    def version_covers(self) -> str:
        """What the code version is a hash of, in the description's words."""
        return f"what every request sends ({', '.join(self.call.sent_fields) or 'the call'})"

    def metadata(self) -> dict[str, Any]:
        """The asset's definition metadata."""
        return {"batchllm/output_column": self.call.output_column,
                **({"batchllm/mode": self.mode, "batchllm/wait": self.wait}
                   if self.mode != "online" else {}),
                **({"batchllm/deadline": describe_deadline(self.deadline)}
                   if self.deadline is not None else {})}

    def deps(self) -> list[Any]:
        """Upstream assets besides the source (and the user's ``deps``)."""
        return []

    def prepare(self, table: Any) -> Any:
        """The input table as the call reads it."""
        return table

    def shape(self, table: Any) -> Any:
        """The call's table as the asset writes it (before the user's ``transform``)."""
        return table

    def models_named(self, settings: Any) -> str:
        """The model(s) the call names, for a log line when no figure names one."""
        return self.call.model or "the resource's default_model"

    def price_for(self, settings: Any) -> Any:
        return settings.batch_price_for if self.mode == "batch_api" else settings.price_for

    def own_figures(self, stats: Any, rows_out: Any) -> dict[str, Any]:
        """The job's own figures of one partition."""
        return {}

    def figures(self, llm: Any, asset: str) -> tuple[Figures, LogLine]:
        """A partition's figures and its log line: what the run paid, what its answers cost."""
        settings = llm.client.settings
        price_for, answers_of = self.price_for(settings), _answers_of(llm)
        models = self.models_named(settings)

        def figures(key, result, stats, rows_out):
            return {**run_figures(stats, price_for), **batch_figures(stats),
                    **deadline_figures(stats),
                    **answer_figures(answers_of(result), price_for),
                    **self.own_figures(stats, rows_out)}

        def log_line(key, result, stats, rows_out):
            return summary_line(asset, key, stats, answers_of(result), price_for,
                                models_named=models)

        return figures, log_line


def build_asset(factory: str, options: AssetOptions,
                make_job: Callable[[], AssetJob]) -> dg.AssetsDefinition:
    """The asset of the job ``make_job()`` returns, with ``options``; ``factory`` names the
    errors' origin. A mistake in the call (an ``InferenceConfigError`` from ``make_job()``)
    raises here, as a definition error saying which asset."""
    where = f"{factory}('{options.name}')"
    try:
        validate_identifier(options.name, "name")
        job = make_job()
    except InferenceConfigError as exc:
        raise dg.DagsterInvalidDefinitionError(f"{where}: {exc}") from None
    check_options(where, options)
    backfill_policy = options.backfill_policy
    if options.partitions_def is not None and backfill_policy is None:
        backfill_policy = (dg.BackfillPolicy.single_run() if options.partition_column
                           else dg.BackfillPolicy.multi_run(1))
    asset_key = dg.AssetKey([options.name])
    with warnings.catch_warnings():
        # backfill_policy is "beta" in Dagster; it is the documented way to run single-run
        # backfills, and users of the factories did not pass it themselves.
        warnings.simplefilter("ignore", dg.BetaWarning)
        decorator = dg.asset(
            name=options.name,
            ins={"source_table": dg.AssetIn(key=asset_key_of(options.source))},
            partitions_def=options.partitions_def,
            backfill_policy=backfill_policy,
            check_specs=inference_check_specs(asset_key, options.partitions_def),
            required_resource_keys={options.resource_key},
            io_manager_key=options.io_manager_key,
            pool=options.pool,
            **_spec_attributes(where, options, job),
        )
        return decorator(_materialize(where, options, job, asset_key))


def _code_version(where: str, options: AssetOptions, job: AssetJob) -> tuple[str, bool]:
    """The asset's code version, and whether the user gave it (in asset_attributes)."""
    given = (options.asset_attributes or {}).get("code_version")
    if given:
        return given, True
    if options.resource is not None and not hasattr(options.resource, "code_version_of"):
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: resource= takes the BatchInferenceResource the asset's runs use (for its "
            f"code version), got {type(options.resource).__name__}.")
    return job.code_version(options.resource), False


def _describe_version(options: AssetOptions, job: AssetJob, version: str, given: bool) -> str:
    """The description's last paragraph: exactly what the code version covers."""
    if given:
        return f"Code version `{version}`: given with the asset's attributes."
    head = f"Code version `{version}`: a hash of {job.version_covers()}"
    resource = options.resource
    if resource is None:
        return (f"{head}; every row's request key changes with it. What the resource fills in "
                "where the call says nothing (its default_model, default_max_tokens) and the "
                "model versions its endpoints declare are no part of it: build the asset with "
                "resource= (the resource its runs use) to have them count.")
    sent = resource.as_sent(job.call)
    filled = [f"{name} `{getattr(sent, name)}`" for name in ("model", "max_tokens")
              if getattr(job.call, name, None) is None and getattr(sent, name, None) is not None]
    return (f"{head}, as the resource under `{options.resource_key}` sends it"
            + (f" (it fills in {' and '.join(filled)})" if filled else "")
            + ", and of the model version its endpoints declare, where they declare one; every "
            "row's request key changes with it.")


def _spec_attributes(where: str, options: AssetOptions, job: AssetJob) -> dict[str, Any]:
    """Dagster's attributes of the asset: the user's, else the job's."""
    given = {k: getattr(options, k) for k in ("group_name", "description", "kinds", "tags",
                                              "owners")}
    attributes = _asset_attributes(where, options.asset_attributes, **given)
    deps = [*job.deps(), *(attributes.get("deps") or [])]
    version, version_given = _code_version(where, options, job)
    return {
        **attributes,
        "deps": deps or None,
        "description": attributes.get("description") or (
            f"{job.description()}\n\n"
            f"{_describe_version(options, job, version, version_given)}"),
        # Which servers answer is the resource's to say (llm.asset_kinds()); the factory cannot
        # know it, so it does not claim "openai" for a llama.cpp or the embedded default.
        "kinds": set(attributes.get("kinds") or job.kinds),
        "tags": dict(attributes.get("tags") or {}),
        "owners": list(attributes["owners"]) if attributes.get("owners") else None,
        "metadata": {**(attributes.get("metadata") or {}), **job.metadata()},
        # Every request key changes with it: Dagster then calls the asset and its downstream
        # unsynced. An explicit code_version (e.g. from asset_attributes) is the user's call.
        "code_version": version,
    }


def _materialize(where: str, options: AssetOptions, job: AssetJob,
                 asset_key: dg.AssetKey) -> Callable[..., Any]:
    """The asset's compute function: the call per partition, then figures and checks."""
    key_columns = list(options.key_columns or [])

    def _batchllm_asset(context: dg.AssetExecutionContext, source_table):
        llm = getattr(context.resources, options.resource_key)
        _warn_if_versioned_by_another(context, options, job, llm)
        source_table = job.prepare(source_table)
        missing = [c for c in key_columns if c not in source_table.columns]
        if missing:
            raise dg.Failure(f"{where}: key_columns {missing} are not in the input table "
                             f"(columns: {list(source_table.columns)}); nothing was sent.")
        deadline_of = run_deadlines(job.deadline, context, options.partitions_def, asset_key)
        # Each call covers its whole partition, so records of requests this partition no
        # longer asks for (its input changed) are retired and stop marking it for retry.
        results, table = call_per_partition(
            context, source_table, options.partition_column,
            lambda frame, key: job.send(llm, frame, context=context, partition_key=key,
                                        supersede_stale=key is not None, **deadline_of(key)))
        table = job.shape(table)
        if options.transform is not None:
            table = options.transform(table)
        schema = column_schema(table, *job.column_docs(source_table.columns))
        job_figures, log_line = job.figures(llm, options.name)

        def figures(key, result, stats, rows_out):
            return {**job_figures(key, result, stats, rows_out),
                    **table_figures(rows_out, options.preview_rows, schema=schema)}

        yield from partition_events(
            context, asset_key, table, results, source_table,
            partition_column=options.partition_column, key_columns=key_columns,
            warn_failed_rate=options.warn_failed_rate,
            error_failed_rate=options.error_failed_rate,
            empty_partition=options.empty_partition, figures=figures, log_line=log_line)

    return _batchllm_asset


def _warn_if_versioned_by_another(context: Any, options: AssetOptions, job: AssetJob,
                                  llm: Any) -> None:
    """Say so when the asset's code version was read from a resource configured otherwise than
    the run's (another model, run config given at launch): Dagster's staleness then follows
    what the definition was built with, not what this run sends."""
    if options.resource is None or (options.asset_attributes or {}).get("code_version"):
        return
    defined, running = job.code_version(options.resource), job.code_version(llm)
    if defined != running:
        context.log.warning(
            f"{options.name}: its code version `{defined}` was read from a resource configured "
            f"otherwise than this run's `{options.resource_key}` (which gives `{running}`: "
            "another model, or run config given at launch); build the asset with resource= the "
            "resource its runs use, so that Dagster's staleness follows what is sent.")


def _asset_attributes(where: str, asset_attributes: Mapping[str, Any] | None,
                      **keywords: Any) -> dict[str, Any]:
    """``asset_attributes`` with the attributes given as keywords, each given once."""
    attributes = dict(asset_attributes or {})
    if "partitions_def" in attributes:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: set partitions_def itself, not in asset_attributes (it also decides the "
            "backfill policy and how partition_column splits a run).")
    unknown = sorted(set(attributes) - ASSET_ATTRIBUTES)
    if unknown:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: asset_attributes {unknown} do not apply to an inference asset; it takes "
            f"{sorted(ASSET_ATTRIBUTES)}.")
    given = {k: v for k, v in keywords.items() if v is not None}
    both = sorted(set(given) & set(attributes))
    if both:
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: {both} given both as keywords and in asset_attributes; give each once.")
    return {**attributes, **given}


def asset_key_of(asset: Any) -> dg.AssetKey:
    """The key of an asset definition or spec, or a key from anything a key coerces from."""
    if isinstance(asset, dg.AssetsDefinition | dg.AssetSpec):
        return asset.key
    return dg.AssetKey.from_coercible(asset)


def _answers_of(llm: Any) -> Callable[[Any], dict[str, Any]]:
    """What the answers a result's rows hold cost: its own request keys, looked up once."""
    seen: dict[int, dict[str, Any]] = {}

    def answers(result: Any) -> dict[str, Any]:
        if result is None:
            return {}
        if id(result) not in seen:
            seen[id(result)] = llm.ledger.answer_tokens(result.request_keys)
        return seen[id(result)]

    return answers
