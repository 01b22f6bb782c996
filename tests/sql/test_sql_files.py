"""``ai_query(endpoint, request, files => content)`` on DuckDB and SQLite, and SQLite's
``ai_parse_document``.

The simulated endpoint answers an image part with ``[image sha256:<12 hex>]`` of the bytes it
decoded, so each answer proves which image reached which row.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path

import duckdb
import pytest

from dagster_batchllm.ai_functions.documents import PAGE_SEPARATOR
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.sql import (
    AIQueryError,
    TranslationError,
    execute,
    register_ai_functions,
    sqlite_engine,
)
from dagster_batchllm.testing import png_bytes
from tests.documents.samples import encrypted_pdf, text_pdf

IMAGES = [png_bytes(2 + i, 2, (40 * i, 0, 0)) for i in range(3)]


def marker(raw: bytes) -> str:
    return f"[image sha256:{hashlib.sha256(raw).hexdigest()[:12]}]"


def images_received(sim) -> int:
    return sim.stats(log=False)["images"]["images"]


@pytest.fixture
def duck(sim, make_client, tables_in, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # path cells are read under the working directory (files_roots)
    (tmp_path / "third.png").write_bytes(IMAGES[2])
    con = tables_in(duckdb.connect(), "CREATE TABLE pages (id INTEGER, img BLOB, path VARCHAR)",
                    ("INSERT INTO pages VALUES (?, ?, ?)", [
                        [1, IMAGES[0], None], [2, IMAGES[1], str(tmp_path / "missing.png")],
                        [3, None, str(tmp_path / "third.png")]]))
    register_ai_functions(con, make_client(sim))
    return con


def test_duckdb_blob_rows_get_their_own_image_and_a_null_file_is_not_sent(sim, duck):
    rows = duck.execute("SELECT id, ai_query('sim-model', 'Describe this page', files := img) "
                        "FROM pages ORDER BY id").fetchall()

    assert rows == [(1, f"[sim] Describe this page {marker(IMAGES[0])}"),
                    (2, f"[sim] Describe this page {marker(IMAGES[1])}"), (3, None)]
    assert images_received(sim) == 2
    again = duck.execute("SELECT id, ai_query('sim-model', 'Describe this page', files := img) "
                         "FROM pages ORDER BY id").fetchall()
    assert again == rows and images_received(sim) == 2  # the rerun is served by the ledger


def test_duckdb_path_rows_read_the_file_and_a_missing_one_fails_alone(sim, duck, tmp_path):
    rows = dict(duck.execute(
        "SELECT id, ai_query('sim-model', 'Describe', files := path, failOnError := false) "
        "FROM pages").fetchall())

    assert rows[1] == {"result": None, "errorMessage": None}  # NULL path: NULL, not sent
    assert rows[2]["result"] is None
    assert rows[2]["errorMessage"] == (
        f"invalid_input: column 'files': image file '{tmp_path / 'missing.png'}' does not "
        "exist")
    assert rows[3] == {"result": f"[sim] Describe {marker(IMAGES[2])}", "errorMessage": None}
    assert images_received(sim) == 1
    with pytest.raises(duckdb.Error, match="does not exist"):  # failOnError: the query fails
        duck.execute("SELECT ai_query('sim-model', 'Describe', files := path) FROM pages"
                     ).fetchall()


def test_duckdb_runs_the_databricks_form_over_read_files_as_written(sim, duck, tmp_path):
    for i, raw in enumerate(IMAGES[:2]):
        (tmp_path / f"scan{i}.png").write_bytes(raw)
    query = f"""
        SELECT path, length, ai_query('sim-model', 'Read the invoice number', files => content,
                                      responseFormat => 'STRUCT<invoice: STRING>') AS fields
        FROM read_files('{tmp_path}/scan*.png', format => 'binaryFile') ORDER BY path"""

    rows = execute(duck, query, dialect="databricks").fetchall()

    # binaryFile's columns (from DuckDB's read_blob), a STRUCT per row, one image per file.
    assert [(Path(p).name, n) for p, n, _ in rows] == [
        ("scan0.png", len(IMAGES[0])), ("scan1.png", len(IMAGES[1]))]
    assert [set(fields) for *_, fields in rows] == [{"invoice"}, {"invoice"}]
    assert all(isinstance(fields["invoice"], str) for *_, fields in rows)
    assert images_received(sim) == 2


@pytest.mark.parametrize(("query", "reason"), [
    ("SELECT * FROM read_files('/d/*.csv', format => 'csv')",
     re.escape("only read_files(path, format => 'binaryFile') is translated")),
    ("SELECT * FROM read_files('/d', format => 'binaryFile', pathGlobFilter => '*.png')",
     r"option\(s\) \['pathGlobFilter'\] are not translated"),
])
def test_other_read_files_forms_are_refused_before_anything_runs(duck, query, reason):
    with pytest.raises(TranslationError, match=reason):
        execute(duck, query, dialect="databricks")


def test_duckdb_refuses_a_files_argument_of_another_type_before_sending(sim, duck):
    with pytest.raises(duckdb.Error, match=re.escape(
            "argument 'files' must be a BINARY or STRING (or an ARRAY of either), got INTEGER")):
        duck.execute("SELECT ai_query('sim-model', 'Describe', files := id) FROM pages"
                     ).fetchall()
    assert sim.stats(log=False)["by_status"] == {}


def test_duckdb_a_list_of_files_sends_every_page_in_order(sim, duck, tmp_path):
    rows = duck.execute(
        "SELECT ai_query('sim-model', 'Read both pages', files := [a.img, b.img]) FROM pages a, "
        "pages b WHERE a.id = 1 AND b.id = 2").fetchall()
    paths = duck.execute(
        "SELECT ai_query('sim-model', 'Read', files := [path, path], failOnError := false) "
        "FROM pages WHERE id = 3").fetchall()
    empty = duck.execute(
        "SELECT ai_query('sim-model', 'Read', files := []::BLOB[], failOnError := false)"
    ).fetchall()

    assert rows == [(f"[sim] Read both pages {marker(IMAGES[0])} {marker(IMAGES[1])}",)]
    assert paths == [({"result": f"[sim] Read {marker(IMAGES[2])} {marker(IMAGES[2])}",
                       "errorMessage": None},)]
    assert empty[0][0]["errorMessage"] == "invalid_input: column 'files' holds an empty list " \
        "of images"
    assert images_received(sim) == 4


def test_duckdb_without_files_sends_text_only(sim, duck):
    rows = duck.execute("SELECT DISTINCT ai_query('sim-model', 'Hello') FROM pages").fetchall()
    assert rows == [("[sim] Hello",)] and images_received(sim) == 0


@pytest.fixture
def lite(sim, make_client, tables_in, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # path cells are read under the working directory (files_roots)
    (tmp_path / "third.png").write_bytes(IMAGES[2])
    con = tables_in(sqlite3.connect(":memory:"), "CREATE TABLE pages (id INTEGER, img BLOB, "
                    "path TEXT)", ("INSERT INTO pages VALUES (?, ?, ?)", [
                        [1, IMAGES[0], None], [2, IMAGES[1], "no/such.png"],
                        [3, None, str(tmp_path / "third.png")]]))
    register_ai_functions(con, make_client(sim))
    return con


def test_sqlite_files_is_the_seventh_argument_blob_or_path(sim, lite):
    blobs = execute(lite, "SELECT id, ai_query('sim-model', 'Describe', NULL, NULL, NULL, "
                          "NULL, img) FROM pages ORDER BY id").fetchall()
    paths = execute(lite, "SELECT id, ai_query('sim-model', 'Describe', NULL, false, NULL, "
                          "NULL, path) ->> '$.errorMessage' FROM pages ORDER BY id").fetchall()

    assert blobs == [(1, f"[sim] Describe {marker(IMAGES[0])}"),
                     (2, f"[sim] Describe {marker(IMAGES[1])}"), (3, None)]
    assert paths[0] == (1, None) and paths[2] == (3, None)
    assert "image file 'no/such.png' does not exist" in paths[1][1]
    assert images_received(sim) == 3


def test_sqlite_runs_the_databricks_form_and_refuses_other_types(sim, lite):
    query = ("SELECT id, ai_query('sim-model', 'Describe', files => img) AS d FROM pages "
             "WHERE img IS NOT NULL ORDER BY id")
    rows = execute(lite, query, dialect="databricks").fetchall()
    assert [d for _, d in rows] == [f"[sim] Describe {marker(raw)}" for raw in IMAGES[:2]]
    with pytest.raises(InferenceConfigError, match="'files' must be a BLOB .* got int"):
        execute(lite, "SELECT ai_query('sim-model', 'Describe', NULL, NULL, NULL, NULL, id) "
                      "FROM pages")
    with pytest.raises(TranslationError, match="SQLite has no table function that reads files"):
        execute(lite, "SELECT ai_parse_document(content) FROM read_files('/d/*.pdf', "
                      "format => 'binaryFile')", dialect="databricks")


def test_sqlite_answers_collected_images_early_so_memory_stays_bounded(
        sim, lite, monkeypatch):
    monkeypatch.setattr(sqlite_engine, "_MAX_PENDING_FILE_BYTES", 1)  # after every image
    rows = execute(lite, "SELECT id, ai_query('sim-model', 'Describe', NULL, NULL, NULL, "
                         "NULL, img) FROM pages ORDER BY id").fetchall()
    assert [r[1] for r in rows] == [f"[sim] Describe {marker(IMAGES[0])}",
                                    f"[sim] Describe {marker(IMAGES[1])}", None]
    assert images_received(sim) == 2  # each image once, though answered in separate batches


def test_sqlite_ai_query_fails_the_statement_when_failOnError_is_true(lite):
    with pytest.raises(AIQueryError, match="does not exist"):
        execute(lite, "SELECT ai_query('sim-model', 'Describe', NULL, NULL, NULL, NULL, path) "
                      "FROM pages")


def test_sqlite_ai_parse_document_is_json_text_with_per_row_errors(sim, lite, tmp_path):
    pages = ["Invoice 7 from Initech", "Total: 12.50 USD"]
    (tmp_path / "a.pdf").write_bytes(text_pdf(pages))
    lite.execute("CREATE TABLE docs (id INTEGER, content BLOB)")
    lite.executemany("INSERT INTO docs VALUES (?, ?)", [
        [1, text_pdf(pages)], [2, encrypted_pdf()], [3, None], [4, str(tmp_path / "a.pdf")],
        [5, 42]])

    rows = dict(execute(lite, "SELECT id, ai_parse_document(content) FROM docs").fetchall())
    parsed = {i: None if v is None else json.loads(v) for i, v in rows.items()}

    assert parsed[1]["page_count"] == 2 and parsed[1]["error"] is None
    assert parsed[1]["text"] == PAGE_SEPARATOR.join(pages)
    assert [p["text"] for p in parsed[1]["pages"]] == pages
    assert parsed[4] == parsed[1]  # the path reads the same file
    assert "encrypted" in parsed[2]["error"] and parsed[2]["pages"] is None
    assert parsed[3] is None
    assert "must be a BLOB (the PDF) or TEXT" in parsed[5]["error"]
    [(first_page,)] = execute(lite, "SELECT ai_query('sim-model', ai_parse_document(content) "
                                    "->> '$.pages[0].text') FROM docs WHERE id = 1").fetchall()
    assert first_page == f"[sim] {pages[0]}"
