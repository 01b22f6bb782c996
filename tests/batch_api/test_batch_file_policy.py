"""The file policy through a batch API (core/file_policy.py): a batch call renders its rows
through the same chat task as an online one, so a path cell outside ``files_roots`` (by default
the working directory), a FIFO or a directory is that row's error and never a line of the
uploaded batch file."""

from __future__ import annotations

import base64
import os

import pandas as pd
import pytest
from batch_helpers import MODEL, PROMPT, batch_stats

from dagster_batchllm.testing import png_bytes

pytestmark = pytest.mark.timeout(60)

PAGE = png_bytes(3, 2, (10, 20, 30))
SECRET_IMAGE = png_bytes(2, 2, (200, 0, 0))


def test_batch_lines_are_rendered_under_the_file_policy(quick, make_client, tmp_path,
                                                        monkeypatch):
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "page.png").write_bytes(PAGE)
    (work / "folder").mkdir()
    os.mkfifo(work / "pipe")
    (outside / "secret.png").write_bytes(SECRET_IMAGE)
    (work / "link-out.png").symlink_to(outside / "secret.png")
    monkeypatch.chdir(work)
    cells = {"page.png": None, "../outside/secret.png": "not under files_roots",
             "link-out.png": "not under files_roots", "/dev/zero": "not under files_roots",
             "pipe": "not a regular file", "folder": "is a directory"}
    df = pd.DataFrame({"text": [f"row {i}" for i in range(len(cells))], "page": list(cells)})
    client = make_client(quick)

    result = client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                          mode="batch_api", wait=True, images="page")

    assert result.stats.mode == "batch_api"
    for cell, error in zip(cells.values(), result.df["summary_error"], strict=True):
        assert (error is None) if cell is None else (
            error.startswith("invalid_input: ") and cell in error), error
    assert "[image sha256:" in result.df["summary"][0]
    stats = batch_stats(quick)
    assert stats["batches_created"] == 1 and stats["lines_ok"] == 1
    uploaded = b"".join(_content(quick, f["id"]) for f in quick.files()
                        if f.get("purpose") == "batch")
    assert base64.b64encode(PAGE) in uploaded
    assert base64.b64encode(SECRET_IMAGE) not in uploaded


def _content(sim, file_id: str) -> bytes:
    import httpx

    reply = httpx.get(f"{sim.base_url}/files/{file_id}/content",
                      headers={"Authorization": f"Bearer {sim.settings.api_key}"})
    reply.raise_for_status()
    return reply.content
