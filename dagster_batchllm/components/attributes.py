"""The YAML attributes the Components share, read from where each concept is declared.

A Component's attributes are not listed again here: the asset factory's keywords come from
:class:`~dagster_batchllm.factories.shared.AssetOptions` (those the factory takes, see
``factory.options``), a call's from its dataclass (``InferenceCall``'s fields), each with its
default and description. :func:`with_attributes` adds them to a Component class; where the
YAML form of a value is not its Python type (a partitions definition, an asset key, Dagster's
asset attributes), :data:`YAML_FORMS` says how it resolves. :func:`values` reads them back
for the factory or the call.
"""

import dataclasses
import datetime as dt
import re
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Annotated, Any, Literal, NamedTuple

import dagster as dg
from dagster.components.resolved.core_models import (
    AssetsDefUpdateKwargs,
    DailyPartitionsDefinitionModel,
    HourlyPartitionsDefinitionModel,
    MultiRunBackfillPolicyModel,
    SingleRunBackfillPolicyModel,
    StaticPartitionsDefinitionModel,
    TimeWindowPartitionsDefinitionModel,
    WeeklyPartitionsDefinitionModel,
    resolve_assets_def_update_kwargs_to_mapping,
    resolve_backfill_policy,
    resolve_partitions_def,
)

from ..factories.shared import AssetOptions


class Attribute(NamedTuple):
    """One Component attribute, from the dataclass field ``field``."""

    field: str
    name: str  # the field's name but where ATTRIBUTE_NAMES says otherwise
    annotation: Any
    default: Any  # dataclasses.MISSING: required


# Attributes that cannot have their field's name (Resolvable owns a model() classmethod); the
# YAML still says `model:`.
ATTRIBUTE_NAMES = {"model": "model_name"}


def as_resolved(_context: dg.ResolutionContext, value: Any) -> Any:
    return value  # the Resolver rendered a template in it already (inject_before_resolve)


def _resolve_asset_attributes(context: dg.ResolutionContext,
                              model: Any) -> Mapping[str, Any] | None:
    if model is None:
        return None
    # Only the attributes the YAML sets, so the factory's defaults (kinds, description) stay.
    attributes = dict(resolve_assets_def_update_kwargs_to_mapping(context, model))
    if "code_version" in attributes:  # templating reads code_version: "3" as the number 3
        attributes["code_version"] = str(attributes["code_version"])
    return attributes


# How the options whose YAML is not their Python type resolve, given the option's description.
YAML_FORMS: dict[str, Callable[[str], Any]] = {
    "source": lambda _description: dg.ResolvedAssetKey,
    "partitions_def": lambda description: Annotated[dg.PartitionsDefinition | None, dg.Resolver(
        resolve_partitions_def,
        model_field_type=DailyPartitionsDefinitionModel | HourlyPartitionsDefinitionModel
        | WeeklyPartitionsDefinitionModel | TimeWindowPartitionsDefinitionModel
        | StaticPartitionsDefinitionModel,
        description=f"{description} In YAML: {{type: daily, start_date: '2026-01-01'}}.")],
    "backfill_policy": lambda description: Annotated[dg.BackfillPolicy | None, dg.Resolver(
        resolve_backfill_policy,
        model_field_type=SingleRunBackfillPolicyModel | MultiRunBackfillPolicyModel,
        description=f"{description} In YAML: {{type: single_run}} or "
        "{type: multi_run, max_partitions_per_run: 1}.")],
    "asset_attributes": lambda description: Annotated[Mapping[str, Any] | None, dg.Resolver(
        _resolve_asset_attributes, model_field_type=AssetsDefUpdateKwargs.model() | None,
        description=description)],
    "key_columns": lambda description: Annotated[list[str] | None, dg.Resolver.default(
        description=description)],
}


def field_attributes(fields: Iterable[dataclasses.Field], hints: Mapping[str, Any]
                     ) -> list[Attribute]:
    """One attribute per dataclass field, with the field's type (or YAML form), default and
    ``metadata["description"]``."""
    attributes = []
    for field in fields:
        description = field.metadata["description"]
        name = ATTRIBUTE_NAMES.get(field.name, field.name)
        if field.name in YAML_FORMS:
            annotation = YAML_FORMS[field.name](description)
        elif name == field.name:
            annotation = Annotated[hints[field.name], dg.Resolver.default(
                description=description)]
        else:
            # Not Resolver.default: Dagster 1.13 drops model_field_name from default resolvers
            # of optionals.
            annotation = Annotated[hints[field.name], dg.Resolver(
                as_resolved, model_field_name=field.name, model_field_type=hints[field.name],
                description=description)]
        if field.default_factory is not dataclasses.MISSING:
            default = dataclasses.field(default_factory=field.default_factory)
        else:
            default = field.default
        attributes.append(Attribute(field.name, name, annotation, default))
    return attributes


def factory_option_attributes(factory: Any) -> list[Attribute]:
    """The attributes of an asset factory's shared keywords (``factory.options``) that YAML
    can say: not a Python ``transform``, nor Dagster's ``group_name`` ... ``owners``, which
    are ``asset_attributes``."""
    return field_attributes([f for f in factory.options if f.metadata["yaml"]],
                            typing.get_type_hints(AssetOptions))


def call_field_attributes(call_class: type, set_per_run: Collection[str] = ()) -> list[Attribute]:
    """The attributes of a call dataclass's fields, but those each run sets."""
    fields = [f for f in dataclasses.fields(call_class) if f.name not in set_per_run]
    return field_attributes(fields, typing.get_type_hints(call_class))


def with_attributes(*groups: list[Attribute]) -> Callable[[type], type]:
    """Give a Component class (before ``@dataclass``) the attributes of ``groups``: the
    required ones first (the schema reads name, source, ...), the class's own required ones,
    then the others in the groups' order, then the class's own."""

    def decorate(cls: type) -> type:
        own = dict(cls.__annotations__)
        own_required = {name: own.pop(name) for name in list(own) if name not in vars(cls)}
        added = [a for group in groups for a in group]
        required = {a.name: a.annotation for a in added if a.default is dataclasses.MISSING}
        optional = {}
        for a in added:
            if a.default is not dataclasses.MISSING:
                optional[a.name] = a.annotation
                setattr(cls, a.name, a.default)
        cls.__annotations__ = {**required, **own_required, **optional, **own}
        return cls

    return decorate


# How a Component's asset sends its requests (the factories' mode= and wait=).
BatchMode = Annotated[Literal["online", "batch_api"], dg.Resolver.default(
    description="'online' (each row a request now) or 'batch_api' (the provider's offline "
    "batch API, about half the price; an endpoint with batch_api: true).")]
BatchWait = Annotated[bool, dg.Resolver.default(
    description="With mode batch_api: poll until the batches are answered (true), or end the "
    "run once they are submitted, the rows deferred (false; see batch_collect).")]

# A Component's `deadline` (the factories' deadline=, as a timedelta): days, hours, minutes
# and seconds, each a whole number, in that order, each at most once.
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
Deadline = Annotated[str | None, dg.Resolver.default(
    description="With mode batch_api: by when each partition is answered, as a duration after "
    "the end of its time window (from the run's start without one): whole numbers with d, h, "
    "m, s in that order, e.g. 9h (09:00 the day after a daily partition), 90m, 1d2h30m. The "
    "rows the batches have not answered in time go online.")]


def parse_duration(where: str, text: str | None) -> dt.timedelta | None:
    """A ``deadline`` attribute (``9h``, ``90m``, ``1d2h30m``, ``45s``) as a timedelta."""
    if text is None:
        return None
    found = _DURATION.fullmatch(str(text).strip().lower())
    if not found or not any(found.groups()):
        raise dg.DagsterInvalidDefinitionError(
            f"{where}: deadline {text!r} is not a duration; write whole numbers with d, h, m, "
            "s in that order, e.g. deadline: 9h (09:00 the day after a daily partition), "
            "90m or 1d2h30m.")
    days, hours, minutes, seconds = (int(g or 0) for g in found.groups())
    return dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


# A Component's `external_source` attribute (every Component has it).
ExternalSource = Annotated[bool, dg.Resolver.default(
    description="The source is a table this project does not materialize (a warehouse table, "
    "another code location's asset): declare it as an external asset (an AssetSpec of that "
    "key, read by its IO manager) so the definitions load. Leave it false where the project "
    "defines the source: the same key declared twice does not load.")]


def external_source_specs(component: Any) -> list[dg.AssetSpec]:
    """The external asset of a Component's source where its YAML says ``external_source``:
    without a definition of the source key, Dagster refuses the asset that reads it ("Input
    asset ... is not produced by any of the provided asset ops")."""
    if not component.external_source:
        return []
    return [dg.AssetSpec(
        component.source, group_name=(component.asset_attributes or {}).get("group_name"),
        description=f"The table {component.name} reads, from outside this project (declared "
        "by its component's external_source).")]


def values(component: Any, group: list[Attribute]) -> dict[str, Any]:
    """The component's values of ``group``'s attributes, by their fields' names (what the
    factory or the call takes)."""
    return {a.field: getattr(component, a.name) for a in group}
