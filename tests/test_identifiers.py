"""Names from configuration that end up in SQL text are validated or quoted.

For every path that builds SQL from a configured name (the ledger table and the tables derived
from it, output column names, the example warehouse's tables, asset and sensor names), a name
such as ``x; DROP TABLE y`` is refused with a clear error before anything runs, and a table
``y`` created beforehand is still there afterwards. Column names that come from data (schema
fields of structured output) are quoted instead, so they cannot break out either.
"""

from __future__ import annotations

import uuid

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from dagster_batchllm import InferenceConfigError
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.ledger.stores import validate_identifier
from dagster_batchllm.core.ledger.table import Ledger
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
VICTIM = "y"
EVIL = [
    f"x; DROP TABLE {VICTIM}",
    f'x"; DROP TABLE {VICTIM}; --',
    f"x'; DROP TABLE {VICTIM}; --",
    f"x`; DROP TABLE {VICTIM}",
    f"x]; DROP TABLE {VICTIM}",
    f"{VICTIM}--",
    f"{VICTIM} /* c */",
    f"main.x; DROP TABLE {VICTIM}",
    f"x;DROP/**/TABLE/**/{VICTIM}",
    "x\x00",
    "x\n",
    "",
    "1abc",
    "a.b.c",
    ".x",
    "x.",
    "ｘ",  # a fullwidth letter that some databases fold to "x"
    "x" * 64,
]
GOOD = ["batchllm_requests", "_x", "A1", "s.t", "x" * 43]


@pytest.fixture
def sqlite_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    _create_victim(url)
    return url


@pytest.fixture
def pg_url(postgres_url):
    """A PostgreSQL schema of its own, holding the victim table ``y``."""
    schema = f"ident_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    engine.dispose()
    url = f"{postgres_url}?options=-csearch_path%3D{schema}"
    _create_victim(url)
    yield url
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    engine.dispose()


def _create_victim(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {VICTIM} (id INTEGER)")
        conn.exec_driver_sql(f"INSERT INTO {VICTIM} VALUES (42)")
    engine.dispose()


def assert_victim_intact(url: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT id FROM {VICTIM}").scalar_one() == 42
    finally:
        engine.dispose()


@pytest.mark.parametrize("name", EVIL)
def test_validate_identifier_refuses_anything_but_plain_names(name):
    with pytest.raises(InferenceConfigError, match="not a plain SQL identifier"):
        validate_identifier(name, "ledger_table")


@pytest.mark.parametrize("name", [None, 5, b"x", ["x"]])
def test_validate_identifier_refuses_non_strings(name):
    with pytest.raises(InferenceConfigError):
        validate_identifier(name, "table")


@pytest.mark.parametrize("name", GOOD)
def test_plain_names_pass(name):
    assert validate_identifier(name) == name


@pytest.mark.parametrize("name", EVIL)
def test_ledger_table_is_refused_and_nothing_is_dropped_sqlite(sqlite_url, name):
    with pytest.raises(InferenceConfigError, match="ledger_table"):
        Ledger(sqlite_url, name)
    assert_victim_intact(sqlite_url)


@pytest.mark.postgres
@pytest.mark.parametrize("name", EVIL[:9])
def test_ledger_table_is_refused_and_nothing_is_dropped_postgres(pg_url, name):
    with pytest.raises(InferenceConfigError, match="ledger_table"):
        Ledger(pg_url, name)
    assert_victim_intact(pg_url)


@pytest.mark.postgres
def test_longest_accepted_ledger_table_works_on_postgres_and_longer_is_refused(pg_url):
    """The ledger derives index and table names from its own; they must fit 63 characters."""
    ledger = Ledger(pg_url, "l" * 43)
    try:
        from dagster_batchllm.core.run.coordination import RunCoordinator

        coordinator = RunCoordinator(ledger.engine, ledger.table, ["ep0"])
        assert coordinator.heartbeat() == {"ep0": 1}
        coordinator.leave()
        assert ledger.status_counts()["ok"] == 0
    finally:
        ledger.dispose()
    with pytest.raises(InferenceConfigError, match="too long"):
        Ledger(pg_url, "l" * 44)
    assert_victim_intact(pg_url)


@pytest.fixture(scope="module")
def sim():
    with SimulatedEndpoint(models=(MODEL,)) as endpoint:
        yield endpoint


def _client(sim, store_url, **overrides) -> InferenceClient:
    return InferenceClient(InferenceSettings(
        endpoints=(EndpointSpec(name="ep0", base_url=sim.base_url, models=(MODEL,)),),
        store_url=store_url, progress_interval_s=3600.0, **overrides))


@pytest.mark.parametrize("name", EVIL[:9])
def test_infer_with_a_bad_ledger_table_sends_nothing_and_drops_nothing(sim, sqlite_url, name):
    sim.reset_stats()
    with _client(sim, sqlite_url, ledger_table=name) as client, \
            pytest.raises(InferenceConfigError, match="ledger_table"):
        client.infer(pd.DataFrame({"text": ["a", "b"]}), prompt="{text}", model=MODEL)
    assert sim.stats(log=False)["requests"] == 0
    assert_victim_intact(sqlite_url)


@pytest.mark.parametrize("argument", ["output_column", "error_column"])
@pytest.mark.parametrize("name", EVIL[:9])
def test_bad_output_column_names_are_refused_before_sending(sim, sqlite_url, argument, name):
    sim.reset_stats()
    kwargs = {"output_column": "out", argument: name}
    with _client(sim, sqlite_url) as client, \
            pytest.raises(InferenceConfigError, match="output column"):
        client.infer(pd.DataFrame({"text": ["a"]}), prompt="{text}", model=MODEL, **kwargs)
    assert sim.stats(log=False)["requests"] == 0
    assert_victim_intact(sqlite_url)


def test_resource_with_a_bad_ledger_table_refuses_at_setup(sim, sqlite_url):
    from dagster_batchllm import BatchInferenceResource, Endpoint

    resource = BatchInferenceResource(
        endpoints=[Endpoint(name="ep0", base_url=sim.base_url, models=[MODEL])],
        store_url=sqlite_url, ledger_table=EVIL[0],
    )
    with pytest.raises(InferenceConfigError, match="ledger_table"):
        resource.setup_for_execution(dg.build_init_resource_context())
    resource.close()
    assert_victim_intact(sqlite_url)


# -- the example warehouse ---------------------------------------------------------------------

@pytest.fixture
def warehouse(sqlite_url):
    from resources.warehouse import WarehouseResource

    resource = WarehouseResource(url=sqlite_url, seed_source=False)
    yield resource
    if resource._engine is not None:
        resource._engine.dispose()


def _rows() -> pd.DataFrame:
    return pd.DataFrame({"call_date": ["2024-01-01"], "text": ["hello"]})


WAREHOUSE_CALLS = {
    "table_exists": lambda w, t: w.table_exists(t),
    "append_rows": lambda w, t: w.append_rows(t, _rows()),
    "read_partition": lambda w, t: w.read_partition(t, "2024-01-01"),
    "read_table": lambda w, t: w.read_table(t),
    "write_partition": lambda w, t: w.write_partition(t, _rows(), "2024-01-01"),
    "write_table": lambda w, t: w.write_table(t, _rows()),
}


@pytest.mark.parametrize("call", sorted(WAREHOUSE_CALLS))
@pytest.mark.parametrize("name", EVIL[:9])
def test_warehouse_refuses_bad_table_names_and_drops_nothing(warehouse, sqlite_url, call, name):
    with pytest.raises(InferenceConfigError, match="not a plain SQL identifier"):
        WAREHOUSE_CALLS[call](warehouse, name)
    assert_victim_intact(sqlite_url)


def test_warehouse_io_manager_refuses_an_asset_key_that_is_not_an_identifier(warehouse,
                                                                              sqlite_url):
    from resources.warehouse import WarehouseIOManager

    manager = WarehouseIOManager(warehouse=warehouse)
    context = dg.build_output_context(asset_key=dg.AssetKey([EVIL[0]]))
    with pytest.raises(InferenceConfigError, match="not a plain SQL identifier"):
        manager.handle_output(context, _rows())
    assert_victim_intact(sqlite_url)


def test_column_names_from_data_are_quoted_not_executed(warehouse, sqlite_url):
    """Structured-output fields become columns; their names are data, so they are quoted."""
    evil_column = f'z"; DROP TABLE {VICTIM}; --'
    df = _rows().assign(**{evil_column: ["v"], "x; DROP TABLE y": ["w"]})
    warehouse.write_partition("answers", df, "2024-01-01")
    warehouse.write_partition("answers", df, "2024-01-01")  # replaces the partition: DELETE
    back = warehouse.read_partition("answers", "2024-01-01")
    assert back[evil_column].tolist() == ["v"]
    assert back["x; DROP TABLE y"].tolist() == ["w"]
    assert_victim_intact(sqlite_url)


# -- Dagster definitions -----------------------------------------------------------------------

@pytest.mark.parametrize("argument", ["name", "output_column"])
def test_inference_asset_refuses_bad_names(argument):
    from dagster_batchllm import build_inference_asset

    kwargs = {"name": "summaries", "output_column": "summary", argument: EVIL[0]}
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="plain SQL identifier"):
        build_inference_asset(source=dg.AssetKey("calls"), prompt="{text}", model=MODEL,
                              **kwargs)


def test_retry_sensor_refuses_a_bad_ledger_table(sqlite_url):
    from dagster_batchllm import build_inference_asset
    from dagster_batchllm.sensors import build_retry_partitions_sensor

    asset = build_inference_asset(
        name="summaries", source=dg.AssetKey("calls"), output_column="summary",
        prompt="{text}", model=MODEL,
        partitions_def=dg.StaticPartitionsDefinition(["a", "b"]),
    )
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="plain SQL identifier"):
        build_retry_partitions_sensor(asset, store_url=sqlite_url, ledger_table=EVIL[0])
    assert_victim_intact(sqlite_url)


@pytest.mark.parametrize("argument", ["table", "cursor_column", "partition_column"])
def test_new_data_sensor_refuses_bad_table_and_column_names(sqlite_url, argument):
    from dagster_batchllm import build_inference_asset
    from dagster_batchllm.sensors import build_new_data_sensor

    asset = build_inference_asset(
        name="summaries", source=dg.AssetKey("calls"), output_column="summary",
        prompt="{text}", model=MODEL,
        partitions_def=dg.StaticPartitionsDefinition(["a", "b"]),
    )
    kwargs = {"table": "calls", "cursor_column": "ingest_id", "partition_column": "call_date",
              argument: EVIL[0]}
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="plain SQL identifier"):
        build_new_data_sensor(asset, url=sqlite_url, **kwargs)
    assert_victim_intact(sqlite_url)


def test_spark_budget_table_derives_from_a_validated_name():
    budget = pytest.importorskip("dagster_batchllm.spark.budget")
    with pytest.raises(InferenceConfigError, match="not a plain SQL identifier"):
        budget._budget_table(EVIL[0])
    assert budget._budget_table("s.ledger").name == "ledger_budgets"
