"""Images and documents on Spark: ``ai_query(..., files => content)`` in Spark SQL over
binaryFile rows, ``ai_query_col(..., images=...)``, and ``ai_parse_document`` in Spark SQL.

The simulated endpoint answers an image part with ``[image sha256:<12 hex>]`` of the bytes it
decoded, so each answer proves which image reached which row.
"""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from dagster_batchllm.ai_functions.documents import PAGE_SEPARATOR
from dagster_batchllm.spark import ai_query_col, register_ai_functions
from dagster_batchllm.testing import png_bytes
from tests.documents.samples import encrypted_pdf, scanned_pdf, text_pdf

pytestmark = pytest.mark.spark

IMAGES = [png_bytes(2 + i, 3, (0, 50 * i, 0)) for i in range(3)]


def marker(raw: bytes) -> str:
    return f"[image sha256:{hashlib.sha256(raw).hexdigest()[:12]}]"


@pytest.fixture
def scans(spark, tmp_path):
    """Three PNG files read by Spark's binaryFile source (path, content, ...) as view scans."""
    for i, raw in enumerate(IMAGES):
        (tmp_path / f"scan{i}.png").write_bytes(raw)
    frame = spark.read.format("binaryFile").load(str(tmp_path / "scan*.png"))
    frame.createOrReplaceTempView("scans")
    return frame


def test_spark_sql_files_sends_each_rows_image_and_a_rerun_sends_nothing(spark, ai_spark,
                                                                         scans):
    query = ("SELECT path, ai_query('llama-70b', 'Describe this page', files => content) AS d "
             "FROM scans")

    first = {r.path.rsplit("/", 1)[1]: r.d for r in spark.sql(query).collect()}
    again = {r.path.rsplit("/", 1)[1]: r.d for r in spark.sql(query).collect()}

    assert first == {f"scan{i}.png": f"[sim] Describe this page {marker(raw)}"
                     for i, raw in enumerate(IMAGES)}
    assert again == first
    stats = ai_spark.stats(log=False)["images"]
    assert (stats["requests"], stats["images"]) == (3, 3)  # the rerun came from the ledger


def test_spark_sql_path_files_null_files_and_a_missing_file_fail_alone(spark, ai_spark,
                                                                       tmp_path, make_settings):
    # Path cells are read under files_roots: here the test's folder, not the workers' cwd.
    register_ai_functions(spark, make_settings(ai_spark, files_roots=[tmp_path]))
    (tmp_path / "ok.png").write_bytes(IMAGES[0])
    rows = pd.DataFrame({"id": [1, 2, 3],
                         "path": [str(tmp_path / "ok.png"), None, str(tmp_path / "gone.png")]})
    spark.createDataFrame(rows).createOrReplaceTempView("page_paths")

    out = {r.id: r.d for r in spark.sql(
        "SELECT id, ai_query('llama-70b', 'Describe', failOnError => false, files => path) "
        "AS d FROM page_paths").collect()}

    assert out[1].result == f"[sim] Describe {marker(IMAGES[0])}" and out[1].errorMessage is None
    assert out[2].result is None and out[2].errorMessage is None  # NULL file: not sent
    assert out[3].result is None
    assert out[3].errorMessage.startswith("invalid_input: column 'files': image file ")
    assert out[3].errorMessage.endswith("gone.png' does not exist")
    assert ai_spark.stats(log=False)["images"]["requests"] == 1


def test_spark_sql_refuses_a_files_argument_of_another_type_before_any_task(spark, ai_spark):
    with pytest.raises(Exception, match="'files' must be BINARY .* got INT"):
        spark.sql("SELECT ai_query('llama-70b', 'Describe', files => 7) AS d").collect()
    assert ai_spark.stats(log=False)["by_status"] == {}


def test_files_null_literal_is_no_files(spark, ai_spark):
    [row] = spark.sql("SELECT ai_query('llama-70b', 'Hello', files => NULL) AS d").collect()
    assert row.d == "[sim] Hello"


def test_ai_query_col_images_from_a_binary_column_with_a_response_format(spark, ai_spark,
                                                                        scans):
    from pyspark.sql import functions as F

    schema = {"type": "object", "properties": {"invoice_number": {"type": "string"}},
              "required": ["invoice_number"], "additionalProperties": False}
    out = scans.withColumn("fields", ai_query_col(
        "llama-70b", F.lit("Extract the invoice number"), images="content",
        response_format=schema, fail_on_error=False)).select("path", "fields").collect()

    assert len(out) == 3
    assert all(r.fields.errorMessage is None and '"invoice_number"' in r.fields.result
               for r in out)
    assert ai_spark.stats(log=False)["images"]["images"] == 3


def test_ai_query_col_images_as_arrays_of_pages(spark, ai_spark):
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(pd.DataFrame({"id": [1], "a": [IMAGES[0]], "b": [IMAGES[1]]}))
    [row] = frame.withColumn("d", ai_query_col(
        "llama-70b", F.lit("Read both pages"), images=F.array("a", "b"))).collect()
    assert row.d == f"[sim] Read both pages {marker(IMAGES[0])} {marker(IMAGES[1])}"


def test_ai_parse_document_in_spark_sql(spark, ai_spark, tmp_path, make_settings):
    # Path cells are read under files_roots: here the test's folder, not the workers' cwd.
    register_ai_functions(spark, make_settings(ai_spark, files_roots=[tmp_path]))
    pages = ["Invoice INV-7 from Initech", "Total due: 12.50 USD"]
    (tmp_path / "a.pdf").write_bytes(text_pdf(pages))
    (tmp_path / "b.pdf").write_bytes(encrypted_pdf())
    (tmp_path / "c.pdf").write_bytes(scanned_pdf())
    spark.read.format("binaryFile").load(str(tmp_path / "*.pdf")).createOrReplaceTempView(
        "pdfs")

    rows = {r.path.rsplit("/", 1)[1]: r.doc for r in spark.sql(
        "SELECT path, ai_parse_document(content) AS doc FROM pdfs").collect()}
    [(by_path,)] = spark.sql(
        f"SELECT ai_parse_document('{tmp_path / 'a.pdf'}').pages[1].text").collect()
    [(answer,)] = spark.sql(
        "SELECT ai_query('llama-70b', ai_parse_document(content).pages[0].text) FROM pdfs "
        "WHERE path LIKE '%a.pdf'").collect()

    assert rows["a.pdf"].page_count == 2 and rows["a.pdf"].error is None
    assert [p.text for p in rows["a.pdf"].pages] == pages
    assert rows["a.pdf"].text == PAGE_SEPARATOR.join(pages)
    assert (rows["a.pdf"].pages[0].width, rows["a.pdf"].pages[0].height) == (612, 792)
    assert rows["b.pdf"].page_count is None and "encrypted" in rows["b.pdf"].error
    assert rows["c.pdf"].pages[0].text == ""  # scanned: no text layer
    assert by_path == pages[1]
    assert answer == f"[sim] {pages[0]}"


def test_ai_query_takes_at_most_seven_arguments(spark, ai_spark):
    with pytest.raises(Exception, match="at most 7 arguments"):
        spark.sql("SELECT ai_query('llama-70b', 'x', 'STRING', true, NULL, NULL, NULL, 1)"
                  ).collect()


def test_duckdb_and_spark_sql_answer_the_databricks_query_alike(spark, make_settings,
                                                                make_client, tmp_path):
    """The Databricks form on both engines: read_files on DuckDB (translated to read_blob),
    Spark's binaryFile source on Spark; each engine with its own ledger, same answers."""
    import duckdb

    from dagster_batchllm.spark import register_ai_functions as register_spark
    from dagster_batchllm.sql import execute, register_ai_functions
    from dagster_batchllm.testing import SimulatedEndpoint

    for i, raw in enumerate(IMAGES):
        (tmp_path / f"scan{i}.png").write_bytes(raw)
    select = ("SELECT path, ai_query('llama-70b', 'Describe this page', files => content, "
              "failOnError => false) AS d FROM {source}")
    with SimulatedEndpoint(models=("llama-70b",)) as sim:
        register_spark(spark, make_settings(sim, store_url=f"sqlite:///{tmp_path / 's.db'}"))
        spark.read.format("binaryFile").load(str(tmp_path / "scan*.png")) \
            .createOrReplaceTempView("scans")
        on_spark = {r.path.rsplit("/", 1)[1]: (r.d.result, r.d.errorMessage)
                    for r in spark.sql(select.format(source="scans")).collect()}
        con = duckdb.connect()
        register_ai_functions(con, make_client(sim, store_url=f"sqlite:///{tmp_path / 'd.db'}"))
        on_duckdb = {path.rsplit("/", 1)[1]: (d["result"], d["errorMessage"])
                     for path, d in execute(con, select.format(
                         source=f"read_files('{tmp_path}/scan*.png', format => 'binaryFile')"),
                         dialect="databricks").fetchall()}
        con.close()
        sent = sim.stats(log=False)["images"]["images"]

    assert on_spark == on_duckdb == {
        f"scan{i}.png": (f"[sim] Describe this page {marker(raw)}", None)
        for i, raw in enumerate(IMAGES)}
    assert sent == 6  # each engine sent each image once
