"""The file policy in SQL (core/file_policy.py): ``ai_query(..., files => path)`` and
``ai_parse_document(path)`` on DuckDB and SQLite read a path cell only when it names a regular
file under ``files_roots`` (by default the working directory); any other path is that row's
error, nothing is sent, and no byte of the file is quoted."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3

import duckdb
import pytest

from dagster_batchllm.sql import execute, register_ai_functions
from dagster_batchllm.testing import png_bytes
from tests.documents.samples import text_pdf

pytestmark = pytest.mark.timeout(60)

PAGE = png_bytes(3, 2, (10, 20, 30))
SECRET = b"root:*:19000:0:99999:7:::SECRET-TOKEN-42\n"


@pytest.fixture
def paths(tmp_path, monkeypatch) -> dict[str, str]:
    """``tmp_path/work`` as the working directory; each path cell and the word its row's error
    holds (None: it is read)."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "page.png").write_bytes(PAGE)
    (work / "doc.pdf").write_bytes(text_pdf(["Invoice 8"]))
    (work / "notes.txt").write_bytes(SECRET)
    (work / "folder").mkdir()
    os.mkfifo(work / "pipe")
    (outside / "secret.png").write_bytes(png_bytes(2, 2, (200, 0, 0)))
    (outside / "doc.pdf").write_bytes(text_pdf(["Invoice 7"]))
    (work / "link-out.png").symlink_to(outside / "secret.png")
    monkeypatch.chdir(work)
    return {"page.png": None, "../outside/secret.png": "not under files_roots",
            str(outside / "secret.png"): "not under files_roots",
            str(outside / "missing.png"): "not under files_roots",
            "link-out.png": "not under files_roots", "/etc/shadow": "not under files_roots",
            "/dev/zero": "not under files_roots", "pipe": "not a regular file",
            "folder": "is a directory", "notes.txt": "unsupported image format"}


def _check(errors: dict[str, str | None], paths: dict[str, str | None]) -> None:
    for path, reason in paths.items():
        error = errors[path]
        if reason is None:
            assert error is None, (path, error)
            continue
        assert error.startswith("invalid_input: ") and reason in error, (path, error)
        assert "root:" not in error and "SECRET" not in error, (path, error)


def _sent(sim) -> set[str]:
    return {d for entry in sim.stats()["images"]["log"] for d in entry["sha256"]}


def test_duckdb_files_reads_only_regular_files_under_the_roots(sim, make_client, paths,
                                                               tables_in):
    con = tables_in(duckdb.connect(), "CREATE TABLE cells (path VARCHAR)",
                    ("INSERT INTO cells VALUES (?)", [[p] for p in paths]))
    register_ai_functions(con, make_client(sim))

    rows = con.execute("SELECT path, ai_query('sim-model', 'Describe', files := path, "
                       "failOnError := false) FROM cells").fetchall()

    _check({path: out["errorMessage"] for path, out in rows}, paths)
    assert sim.stats(log=False)["requests"] == 1
    assert _sent(sim) == {hashlib.sha256(PAGE).hexdigest()}


def test_sqlite_files_reads_only_regular_files_under_the_roots(sim, make_client, paths,
                                                               tables_in):
    con = tables_in(sqlite3.connect(":memory:"), "CREATE TABLE cells (path TEXT)",
                    ("INSERT INTO cells VALUES (?)", [[p] for p in paths]))
    register_ai_functions(con, make_client(sim))

    rows = execute(con, "SELECT path, ai_query('sim-model', 'Describe', NULL, false, NULL, "
                        "NULL, path) ->> '$.errorMessage' FROM cells").fetchall()

    _check(dict(rows), paths)
    assert sim.stats(log=False)["requests"] == 1


@pytest.mark.parametrize("engine", ["duckdb", "sqlite"])
def test_ai_parse_document_follows_the_roots(sim, make_client, paths, tmp_path, engine):
    con = duckdb.connect() if engine == "duckdb" else sqlite3.connect(":memory:")
    register_ai_functions(con, make_client(sim))
    cells = ["doc.pdf", str(tmp_path / "outside" / "doc.pdf"), "../outside/doc.pdf", "pipe",
             "/etc/shadow", "notes.txt"]

    docs = {}
    for cell in cells:
        if engine == "duckdb":
            [(doc,)] = con.execute("SELECT ai_parse_document(?)", [cell]).fetchall()
        else:
            [(text,)] = execute(con, "SELECT ai_parse_document(?)", [cell]).fetchall()
            doc = json.loads(text)
        docs[cell] = doc

    assert docs["doc.pdf"]["text"] == "Invoice 8" and docs["doc.pdf"]["error"] is None
    for cell in cells[1:3] + ["/etc/shadow"]:
        assert docs[cell]["page_count"] is None
        assert "not under files_roots" in docs[cell]["error"], (cell, docs[cell])
    assert "not a regular file" in docs["pipe"]["error"]
    assert "not a PDF" in docs["notes.txt"]["error"] and "SECRET" not in docs["notes.txt"]["error"]


def test_configured_roots_reach_the_sql_functions(sim, make_client, paths, tmp_path):
    outside = tmp_path / "outside"
    con = duckdb.connect()
    register_ai_functions(con, make_client(sim, files_roots=[outside]))

    [(answer, doc)] = con.execute(
        "SELECT ai_query('sim-model', 'Describe', files := ?, failOnError := false), "
        "ai_parse_document(?)", [str(outside / "secret.png"), str(outside / "doc.pdf")]
    ).fetchall()
    [(here,)] = con.execute("SELECT ai_query('sim-model', 'Describe', files := 'page.png', "
                            "failOnError := false)").fetchall()

    assert answer["errorMessage"] is None and doc["text"] == "Invoice 7"
    assert "not under files_roots" in here["errorMessage"]  # the working directory is not one
