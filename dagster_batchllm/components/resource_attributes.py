"""The ``resource:`` attribute of a ``BatchInferenceComponent``: the resource in ``defs.yaml``.

Its YAML model is derived from the resource's own config classes (``BatchInferenceResource``,
``Endpoint``, ``ManagedEndpoint``, ``ModelPrice``), so every resource field is an attribute with
the resource's default and description. A text field may also be written ``{env: NAME}``: it
becomes a ``dg.EnvVar``, read when a run starts, so an ``api_key`` or a password in the
``store_url`` stays out of the definitions and the UI (``"{{ env.NAME }}"`` would put the value
itself there when the definitions load).
"""

from __future__ import annotations

import functools
import types
from typing import Annotated, Any, Union, get_args, get_origin

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from ..resource import BatchInferenceResource


class EnvVarAttribute(BaseModel):
    """``{env: NAME}``: the value of an environment variable, read when the run starts."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field(description="The environment variable to read when the run starts.")


@functools.cache
def attributes_model(config_class: type[BaseModel]) -> type[BaseModel]:
    """The YAML model of a config class: its fields, defaults and descriptions, with nested
    config classes as their own YAML models and text fields open to ``{env: NAME}``."""
    fields = {name: (_yaml_type(info.annotation), _yaml_field(info))
              for name, info in config_class.model_fields.items()}
    return create_model(f"{config_class.__name__}Attributes",
                        __config__=ConfigDict(extra="forbid"), **fields)


def _yaml_type(annotation: Any) -> Any:
    if annotation is str:
        return str | EnvVarAttribute
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return attributes_model(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list:
        return list[_yaml_type(args[0])]
    if origin in (Union, types.UnionType):
        return Union[tuple(_yaml_type(arg) for arg in args)]  # noqa: UP007 - built from a tuple
    return annotation


def _yaml_field(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return Field(default_factory=info.default_factory, description=info.description)
    return Field(default=info.default, description=info.description)


def resolve_resource(context: dg.ResolutionContext,
                     attributes: BaseModel | None) -> BatchInferenceResource | None:
    if attributes is None:
        return None
    return BatchInferenceResource(**_config_values(context, attributes))


class DeclaresResource:
    """A Component that may declare the resource its asset uses: its attributes ``name``,
    ``resource`` (None: the project provides it) and ``resource_key``.
    :func:`provided_resources` finds the others of the project by this class (a marker: no
    annotations here, so the Component's YAML model stays its own)."""


def provided_resources(component: Any, context: dg.ComponentLoadContext | None
                       ) -> dict[str, BatchInferenceResource]:
    """The resources ``component`` provides: its resource under its key, as the same object as
    every other Component of the project that declares an equal one under that key.

    Dagster merges the Components' definitions only where a key holds the same object (an
    equal one is "different resources with same key"), so the first such Component in the
    project's order provides the object; one that declares another configuration under the same
    key is refused, naming both and the way out (another ``resource_key``)."""
    resource, key = component.resource, component.resource_key
    if resource is None:
        return {}
    if context is None:  # built on its own (build_defs(None)): no project to share with
        return {key: resource}
    for other in context.component_tree.get_all_components(DeclaresResource):
        if other is component:
            break
        if other.resource is None or other.resource_key != key:
            continue
        if other.resource != resource:
            raise dg.DagsterInvalidDefinitionError(
                f"{_named(component)} and {_named(other)} both declare a resource under the key "
                f"'{key}', configured differently (one key holds one resource). Give one of "
                f"them another key: resource_key: {component.name}_llm (its asset then uses "
                "that resource), or declare the same resource in both.")
        return {key: other.resource}
    return {key: resource}


def _named(component: Any) -> str:
    return f"{type(component).__name__} '{component.name}'"


def _config_values(context: dg.ResolutionContext, value: Any) -> Any:
    """The values the YAML gave (unset fields keep the resource's defaults), templates resolved
    and ``{env: NAME}`` as ``dg.EnvVar``."""
    if isinstance(value, EnvVarAttribute):
        return dg.EnvVar(value.env)
    if isinstance(value, BaseModel):
        return {name: _config_values(context.at_path(name), getattr(value, name))
                for name in value.model_fields_set}
    if isinstance(value, list):
        return [_config_values(context.at_path(i), item) for i, item in enumerate(value)]
    return context.resolve_value(value)


ResolvedResource = Annotated[
    BatchInferenceResource | None,
    dg.Resolver(
        resolve_resource,
        model_field_type=attributes_model(BatchInferenceResource) | None,
        description="The BatchInferenceResource itself (its fields: endpoints, store_url, "
        "default_model, ...), provided under resource_key; without it, the project's "
        "definitions provide the resource. Text fields may be {env: NAME}.",
    ),
]
