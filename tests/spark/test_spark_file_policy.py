"""The file policy on Spark (core/file_policy.py): ``ai_query(..., files => path)``,
``ai_query_col(images=)`` and ``ai_parse_document(path)`` read a path cell only when it names a
regular file under ``files_roots`` (by default the working directory of the Python worker); any
other path is that row's error, nothing is sent and no byte of the file is quoted."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from dagster_batchllm.spark import ai_query_col, register_ai_functions
from dagster_batchllm.testing import png_bytes
from tests.documents.samples import text_pdf

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]

SECRET = b"root:*:19000:0:99999:7:::SECRET-TOKEN-42\n"


@pytest.fixture
def hostile(tmp_path):
    """Paths a hostile table names, none under the workers' working directory."""
    (tmp_path / "secret.png").write_bytes(png_bytes(2, 2, (200, 0, 0)))
    (tmp_path / "secret.txt").write_bytes(SECRET)
    (tmp_path / "doc.pdf").write_bytes(text_pdf(["Invoice 7"]))
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    return {
        str(tmp_path / "secret.png"): "not under files_roots",
        str(tmp_path / "missing.png"): "not under files_roots",
        str(tmp_path / "pipe"): "not under files_roots",
        "../" * 12 + "etc/shadow": "not under files_roots",
        "/dev/zero": "not under files_roots",
        "/proc/self/environ": "not under files_roots",
    }


def test_spark_sql_files_refuses_paths_outside_the_roots_and_sends_nothing(
        spark, ai_spark, hostile):
    from pyspark.sql import functions as F

    spark.createDataFrame(pd.DataFrame({"path": list(hostile)})).createOrReplaceTempView(
        "hostile_paths")

    out = {r.path: r.d for r in spark.sql(
        "SELECT path, ai_query('llama-70b', 'Describe', failOnError => false, files => path) "
        "AS d FROM hostile_paths").collect()}
    by_column = spark.createDataFrame(pd.DataFrame({"path": list(hostile)})).select(
        "path", ai_query_col("llama-70b", F.lit("Describe"), images="path", fail_on_error=False)
        .alias("d")).collect()

    for path, reason in hostile.items():
        error = out[path].errorMessage
        assert out[path].result is None and error.startswith("invalid_input: ") and reason in error
        assert "root:" not in error and "SECRET" not in error
    assert all(r.d.errorMessage.startswith("invalid_input: ") for r in by_column)
    assert ai_spark.stats(log=False)["requests"] == 0


def test_spark_roots_are_configured_with_the_settings(spark, ai_spark, hostile, tmp_path,
                                                      make_settings):
    register_ai_functions(spark, make_settings(ai_spark, files_roots=[tmp_path]))
    paths = [str(tmp_path / "secret.png"), str(tmp_path / "pipe"), str(tmp_path / "folder"),
             str(tmp_path / "secret.txt"), str(tmp_path / "doc.pdf")]
    spark.createDataFrame(pd.DataFrame({"path": paths})).createOrReplaceTempView("root_paths")

    out = {r.path: r for r in spark.sql(
        "SELECT path, ai_query('llama-70b', 'Describe', failOnError => false, files => path) "
        "AS d, ai_parse_document(path) AS doc FROM root_paths").collect()}

    png, pipe, folder, text, pdf = (out[p] for p in paths)
    assert png.d.result.startswith("[sim] Describe [image sha256:") and png.d.errorMessage is None
    assert "not a regular file" in pipe.d.errorMessage  # a FIFO is not waited on
    assert "not a regular file" in pipe.doc.error
    assert "is a directory" in folder.d.errorMessage
    assert "unsupported image format" in text.d.errorMessage
    assert "SECRET" not in text.d.errorMessage and "SECRET" not in text.doc.error
    assert pdf.doc.text == "Invoice 7" and pdf.doc.error is None
    assert ai_spark.stats(log=False)["requests"] == 1


def test_spark_ai_parse_document_refuses_paths_outside_the_roots(spark, ai_spark, hostile,
                                                                 tmp_path):
    [(doc,)] = spark.sql(
        f"SELECT ai_parse_document('{tmp_path / 'doc.pdf'}') AS doc").collect()
    assert doc.page_count is None and "not under files_roots" in doc.error
