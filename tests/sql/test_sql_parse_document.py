"""ai_parse_document on DuckDB: a PDF's text layer from a BLOB or a path, no model, per-row
errors for documents that cannot be read."""

from __future__ import annotations

import duckdb
import pytest

from dagster_batchllm.ai_functions.documents import PAGE_SEPARATOR
from dagster_batchllm.sql import register_ai_functions
from tests.documents.samples import encrypted_pdf, scanned_pdf, text_pdf

PAGES = ["Invoice 7 from Initech", "Amount: 12.50 USD"]


@pytest.fixture
def con(sim, make_client):
    connection = duckdb.connect()
    register_ai_functions(connection, make_client(sim))
    yield connection
    connection.close()


def test_blob_rows_give_pages_text_and_count_or_their_own_error(sim, con):
    con.execute("CREATE TABLE docs (id INTEGER, content BLOB)")
    con.executemany("INSERT INTO docs VALUES (?, ?)", [
        [1, text_pdf(PAGES)], [2, encrypted_pdf()], [3, scanned_pdf()], [4, None],
        [5, b"%PDF-1.4 cut"]])

    rows = con.execute("SELECT id, ai_parse_document(content) AS doc FROM docs ORDER BY id"
                       ).fetchall()

    parsed = dict(rows)
    assert parsed[1]["page_count"] == 2 and parsed[1]["error"] is None
    assert [p["text"] for p in parsed[1]["pages"]] == PAGES
    assert parsed[1]["pages"][0] == {"page": 1, "text": PAGES[0], "width": 612, "height": 792}
    assert parsed[1]["text"] == PAGE_SEPARATOR.join(PAGES)
    assert parsed[2]["page_count"] is None and "encrypted" in parsed[2]["error"]
    assert parsed[3]["page_count"] == 1 and parsed[3]["pages"][0]["text"] == ""
    assert parsed[4] is None
    assert "corrupt" in parsed[5]["error"]
    assert sim.stats(log=False)["by_status"] == {}  # no model was asked


def test_path_rows_and_read_blob(con, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # path cells are read under the working directory (files_roots)
    (tmp_path / "a.pdf").write_bytes(text_pdf(PAGES))
    con.execute("CREATE TABLE files AS SELECT * FROM (VALUES (?), (?)) t(path)",
                [str(tmp_path / "a.pdf"), str(tmp_path / "missing.pdf")])

    by_path = con.execute("SELECT ai_parse_document(path).page_count, "
                          "ai_parse_document(path).error FROM files ORDER BY path").fetchall()
    via_read_blob = con.execute(
        "SELECT ai_parse_document(content).pages[2].text FROM read_blob(?)",
        [str(tmp_path / "*.pdf")]).fetchall()

    assert by_path[0] == (2, None)
    assert by_path[1][0] is None and "does not exist" in by_path[1][1]
    assert via_read_blob == [(PAGES[1],)]


def test_the_text_layer_feeds_an_ai_function(sim, con):
    con.execute("CREATE TABLE docs AS SELECT ?::BLOB AS content", [text_pdf(PAGES)])
    [(answer,)] = con.execute(
        "SELECT ai_query('sim-model', ai_parse_document(content).pages[1].text) FROM docs"
    ).fetchall()
    assert answer == f"[sim] {PAGES[0]}"


def test_other_argument_types_fail_the_query_by_name(con):
    with pytest.raises(duckdb.Error, match="ai_parse_document: content must be a BLOB"):
        con.execute("SELECT ai_parse_document(42)").fetchall()
