"""Embeddings on Spark: ``embed_col`` and ``ai_query('<embedding model>', text)`` in Spark SQL
give ``ARRAY<FLOAT>`` (or the result/errorMessage struct), through the same ledger."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.spark import embed_col, register_ai_functions
from dagster_batchllm.testing import openai_client

EMBED = "sim-embed"
TEXTS = ["refund for my broken lamp", "when does the store close tonight", None, "   ",
         "refund for my broken lamp"]


@pytest.fixture
def settings(embed_sim, tmp_path):
    return InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=embed_sim.base_url, models=("sim-model",),
                                embedding_models=(EMBED,), max_concurrency=8),),
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}")


@pytest.fixture
def calls(spark):
    # One partition: the repeated text is then deduplicated within one task's call. Across
    # tasks running at once, limits='split' (the default) has no cross-run claims, so each
    # task could send it; that is what limits='shared' is for.
    frame = spark.createDataFrame(pd.DataFrame({"id": range(len(TEXTS)), "t": TEXTS}),
                                  "id long, t string").coalesce(1)
    frame.createOrReplaceTempView("calls")
    return frame


def expected(embed_sim, texts):
    reply = openai_client(embed_sim).embeddings.create(model=EMBED, input=texts)
    return [np.array(d.embedding, dtype=np.float32) for d in reply.data]


def test_embed_col_and_ai_query_give_float_arrays(spark, calls, settings, embed_sim):
    register_ai_functions(spark, settings)
    column = calls.withColumn("e", embed_col(EMBED, "t")).orderBy("id")
    assert dict(column.dtypes)["e"] == "array<float>"
    rows = column.collect()
    assert rows[2].e is None and rows[3].e is None
    assert embed_sim.stats()["embeddings"]["inputs"] == 2
    reference = expected(embed_sim, [TEXTS[0], TEXTS[1]])
    np.testing.assert_array_equal(np.array(rows[0].e, np.float32), reference[0])
    np.testing.assert_array_equal(np.array(rows[4].e, np.float32), reference[0])

    embed_sim.reset_stats()  # the same texts in SQL: from the ledger
    sql = spark.sql(f"SELECT id, ai_query('{EMBED}', t) AS e FROM calls ORDER BY id")
    assert dict(sql.dtypes)["e"] == "array<float>"
    vectors = [r.e for r in sql.collect()]
    np.testing.assert_array_equal(np.array(vectors[1], np.float32), reference[1])
    assert embed_sim.stats()["embeddings"]["requests"] == 0
    # The chat ai_query is as it was.
    [chat] = spark.sql("SELECT ai_query('sim-model', 'hello') AS s").collect()
    assert chat.s == "[sim] hello"


def test_failures_as_data_or_a_failed_query(spark, calls, settings, embed_sim):
    register_ai_functions(spark, settings)
    embed_sim.configure(max_context_tokens=7)  # the lamp: 7 tokens; the store question: 9
    checked = spark.sql(f"SELECT id, ai_query('{EMBED}', t, failOnError => false) AS r "
                        "FROM calls ORDER BY id")
    assert dict(checked.dtypes)["r"] == "struct<result:array<float>,errorMessage:string>"
    rows = checked.collect()
    assert len(rows[0].r.result) == 16 and rows[0].r.errorMessage is None
    assert rows[1].r.result is None
    assert rows[1].r.errorMessage.startswith("context_length_exceeded")
    with pytest.raises(Exception, match="ai_query failed for 1 of"):
        calls.withColumn("e", embed_col(EMBED, "t")).collect()


def test_mistakes_raise_on_the_driver(spark, calls, settings):
    ai = register_ai_functions(spark, settings)
    with pytest.raises(InferenceConfigError, match="no configured endpoint serves embedding"):
        embed_col("sim-model", "t", ai=ai)
    with pytest.raises(Exception, match="takes no returnType"):
        spark.sql(f"SELECT ai_query('{EMBED}', t, returnType => 'STRING') FROM calls")
    budgeted = register_ai_functions(spark, settings, token_budget=1000)
    with pytest.raises(InferenceConfigError, match="token_budget"):
        embed_col(EMBED, "t", ai=budgeted)
    register_ai_functions(spark, settings)  # leave the session as the other tests expect
