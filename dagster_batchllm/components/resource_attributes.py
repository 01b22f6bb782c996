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


# The resources the Components resolved, one per configuration. Dagster merges the Components'
# definitions only where a key holds the same object (an equal one is "different resources
# with same key"), so two defs.yaml declaring the same resource share one.
_RESOLVED: list[BatchInferenceResource] = []


def resolve_resource(context: dg.ResolutionContext,
                     attributes: BaseModel | None) -> BatchInferenceResource | None:
    if attributes is None:
        return None
    resource = BatchInferenceResource(**_config_values(context, attributes))
    for resolved in _RESOLVED:
        if resolved == resource:
            return resolved
    _RESOLVED.append(resource)
    return resource


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
