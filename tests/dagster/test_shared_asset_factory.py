"""The three asset factories share one body: every one refuses the same definition mistakes
(failed-rate thresholds outside 0 <= warn <= error <= 1 among them), takes the shared keywords
with the same defaults, and the Components' attributes are those keywords."""

from __future__ import annotations

import dataclasses
import inspect

import dagster as dg
import pytest

from dagster_batchllm import (
    BatchInferenceComponent,
    ModelScoringComponent,
    build_embedding_asset,
    build_inference_asset,
    build_scoring_asset,
)
from dagster_batchllm.factories.shared import AssetOptions

pytestmark = pytest.mark.timeout(60)

DAYS = dg.StaticPartitionsDefinition(["a", "b"])

# Each factory with the arguments of a valid asset (thresholds left to the test).
FACTORIES = {
    "build_inference_asset": lambda **kw: build_inference_asset(
        name="answers", source="questions", prompt="Answer: {q}", **kw),
    "build_embedding_asset": lambda **kw: build_embedding_asset(
        name="vectors", source="questions", input_column="q", **kw),
    "build_scoring_asset": lambda **kw: build_scoring_asset(
        name="scores", source="features", input_columns=["f1", "f2"], model="risk", **kw),
}


@pytest.mark.parametrize("factory", sorted(FACTORIES))
@pytest.mark.parametrize(("warn", "error"), [
    (0.2, 0.1),  # warn above error: the check could never warn
    (-0.1, 0.1),
    (0.1, 1.5),
    (1.2, 1.5),
    (float("nan"), 0.1),
    ("0.1", 0.2),  # not a number
])
def test_every_factory_refuses_thresholds_outside_0_warn_error_1(factory, warn, error):
    with pytest.raises(dg.DagsterInvalidDefinitionError) as info:
        FACTORIES[factory](warn_failed_rate=warn, error_failed_rate=error)
    message = str(info.value)
    assert message.startswith(f"{factory}('")  # which factory, which asset
    assert "need 0 <= warn_failed_rate <= error_failed_rate <= 1" in message
    assert f"got {warn!r} and {error!r}" in message


@pytest.mark.parametrize("factory", sorted(FACTORIES))
@pytest.mark.parametrize(("warn", "error"), [(0.0, 0.0), (0.1, 0.1), (0, 1), (0.01, 0.1)])
def test_every_factory_takes_thresholds_inside_0_warn_error_1(factory, warn, error):
    asset = FACTORIES[factory](warn_failed_rate=warn, error_failed_rate=error)
    assert {k.name for k in asset.check_keys} >= {"failed_row_rate"}


@pytest.mark.parametrize("factory", sorted(FACTORIES))
def test_every_factory_refuses_a_partition_column_without_partitions(factory):
    with pytest.raises(dg.DagsterInvalidDefinitionError,
                       match="partition_column is only meaningful with partitions_def"):
        FACTORIES[factory](partition_column="day")
    asset = FACTORIES[factory](partitions_def=DAYS, partition_column="day")
    assert asset.backfill_policy == dg.BackfillPolicy.single_run()


def test_the_scoring_component_refuses_the_thresholds_as_the_factory_does():
    component = ModelScoringComponent(
        name="scores", source=dg.AssetKey("features"), input_columns=["f1"], model_name="risk",
        warn_failed_rate=0.5, error_failed_rate=0.2)
    with pytest.raises(dg.DagsterInvalidDefinitionError,
                       match=r"build_scoring_asset\('scores'\): need 0 <= warn_failed_rate"):
        component.build_defs(None)


def test_the_shared_keywords_are_declared_once():
    shared = {f.name: f for f in dataclasses.fields(AssetOptions)}
    for factory in (build_inference_asset, build_embedding_asset, build_scoring_asset):
        parameters = inspect.signature(factory).parameters
        taken = {f.name for f in factory.options}
        assert taken <= set(parameters), factory.__name__
        for name in taken:
            default = shared[name].default
            expected = inspect.Parameter.empty if default is dataclasses.MISSING else default
            assert parameters[name].default == expected, (factory.__name__, name)
            assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert shared["warn_failed_rate"].metadata["description"] in factory.__doc__
    # The scoring asset has no transform, IO manager, pool or backfill policy of its own.
    assert {f.name for f in build_scoring_asset.options} == set(shared) - {
        "backfill_policy", "transform", "io_manager_key", "kinds", "tags", "owners", "pool"}

    for component, factory in ((BatchInferenceComponent, build_inference_asset),
                               (ModelScoringComponent, build_scoring_asset)):
        attributes = {f.name: f for f in dataclasses.fields(component)}
        properties = component.model().model_json_schema()["properties"]
        for option in factory.options:
            if not option.metadata["yaml"]:  # Dagster's attributes: asset_attributes
                if option.name == "resource":  # the component's own resource: is passed on
                    assert attributes["resource"].default is None
                    continue
                assert option.name not in attributes, (component.__name__, option.name)
                continue
            assert option.name in attributes, (component.__name__, option.name)
            if option.default is not dataclasses.MISSING:
                assert attributes[option.name].default == option.default
            if option.name != "source":  # Dagster's asset key has a description of its own
                assert option.metadata["description"] in properties[option.name][
                    "description"], option.name


def test_a_factory_refuses_what_it_does_not_take_as_python_does():
    with pytest.raises(TypeError, match="transform"):
        build_scoring_asset(name="s", source="f", input_columns=["a"], model="m",
                            transform=lambda t: t)
    with pytest.raises(TypeError, match="source"):
        build_inference_asset(name="a", prompt="{x}")
    with pytest.raises(TypeError):
        build_inference_asset("a", "b", prompt="{x}")  # keywords only
