"""The file policy of path cells (core/file_policy.py): a table's cell makes this process read
only a regular file under ``files_roots`` (by default the working directory); anything else is
that row's ``invalid_input`` error, the file never opened, nothing sent, no byte of it quoted.

The hostile working directory below holds one page image and what a table written by someone
else may name: ``..`` out of it, a symlink out, files elsewhere (existing or not), a FIFO (whose
open would wait for a writer), a device, a directory, a text file of secrets.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from dagster_batchllm.ai_functions.documents import parse_document_value
from dagster_batchllm.core.errors import FileRefusedError, InvalidInputError
from dagster_batchllm.core.file_policy import FilePolicy, policy_in_force, under_policy
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.core.tasks.chat.images import image_parts
from dagster_batchllm.documents import DocumentError, parse_document
from dagster_batchllm.testing import png_bytes
from tests.documents.samples import text_pdf

MODEL = "sim-model"
PAGE = png_bytes(3, 2, (10, 20, 30))
SECRET_IMAGE = png_bytes(2, 2, (200, 0, 0))  # an image outside the roots: never to be sent
SECRET = b"root:*:19000:0:99999:7:::SECRET-TOKEN-42\n"
# No error may hold any of these: the secret file's text and first bytes, the image's bytes.
LEAKS = ("root:", "SECRET-TOKEN", "19000", repr(SECRET[:8])[2:-1])


def _leaks(text: str | None) -> list[str]:
    return [leak for leak in LEAKS if text and leak in text]


@pytest.fixture
def hostile(tmp_path, monkeypatch) -> dict[str, Path]:
    """``tmp_path/work`` as the working directory (the default root) and what is around it."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "page.png").write_bytes(PAGE)
    (work / "notes.txt").write_bytes(SECRET)
    (work / "folder").mkdir()
    os.mkfifo(work / "pipe")
    (outside / "secret.png").write_bytes(SECRET_IMAGE)
    (outside / "secret.txt").write_bytes(SECRET)
    os.mkfifo(outside / "pipe")
    (work / "link-out.png").symlink_to(outside / "secret.png")
    (work / "link-in.png").symlink_to(work / "page.png")
    monkeypatch.chdir(work)
    return {"work": work, "outside": outside}


def refused_cells(outside: Path) -> dict[str, str]:
    """Each hostile cell and a word its error must hold."""
    return {
        "../outside/secret.png": "not under files_roots",
        str(outside / "secret.png"): "not under files_roots",
        str(outside / "missing.png"): "not under files_roots",
        "link-out.png": "not under files_roots",
        str(outside / "pipe"): "not under files_roots",
        "/etc/shadow": "not under files_roots",
        "/proc/self/environ": "not under files_roots",
        "/dev/zero": "not under files_roots",
        "pipe": "not a regular file",
        "folder": "is a directory",
        "missing.png": "does not exist",
        "notes.txt": "unsupported image format",
    }


# -- through infer(), default settings ------------------------------------------------------------
@pytest.mark.timeout(60)
def test_hostile_path_cells_fail_alone_quickly_send_nothing_and_quote_no_byte(
        sim, make_client, hostile, tmp_path):
    refused = refused_cells(hostile["outside"])
    client = make_client(sim)  # default settings: files_roots empty, the working directory
    cells = {"page": "page.png", "link_in": "link-in.png", **{f"bad{i}": c
                                                              for i, c in enumerate(refused)}}
    df = pd.DataFrame({"name": list(cells), "img": list(cells.values())})

    result = client.infer(df, prompt="Read {name}", model=MODEL, output_column="out",
                          images="img")

    marker = f"[image sha256:{hashlib.sha256(PAGE).hexdigest()[:12]}]"
    assert result.df["out"].iloc[0].endswith(marker) and result.df["out"].iloc[1].endswith(marker)
    errors = dict(zip(df["img"], result.df["out_error"], strict=True))
    for cell, reason in refused.items():
        assert errors[cell].startswith("invalid_input: ") and reason in errors[cell], (
            cell, errors[cell])
        assert not _leaks(errors[cell]), (cell, errors[cell])
    stats = sim.stats()
    sent = {digest for entry in stats["images"]["log"] for digest in entry["sha256"]}
    assert stats["requests"] == stats["images"]["requests"] == 2  # the two good rows only
    assert sent == {hashlib.sha256(PAGE).hexdigest()}
    ledger = (tmp_path / "ledger.db").read_bytes()
    assert b"SECRET-TOKEN" not in ledger and b"root:*" not in ledger


@pytest.mark.timeout(60)
def test_each_refusal_takes_well_under_a_second(sim, make_client, hostile):
    client = make_client(sim)
    took = {}
    for cell in refused_cells(hostile["outside"]):
        start = time.perf_counter()
        result = client.infer(pd.DataFrame({"name": ["x"], "img": [cell]}),
                              prompt="Read {name}", model=MODEL, output_column="out",
                              images="img")
        took[cell] = time.perf_counter() - start
        assert result.error_types.tolist() == ["invalid_input"], (cell, result.df)
    # The bound: under a second each (they take milliseconds; a FIFO is not waited on).
    assert max(took.values()) < 1.0, took
    assert sim.stats(log=False)["requests"] == 0


def test_an_outside_path_says_the_same_whether_it_exists_or_not(hostile):
    outside = hostile["outside"]
    policy = FilePolicy.of()

    def message(path: str) -> str:
        with pytest.raises(FileRefusedError) as caught:
            policy.read(path)
        return caught.value.message.replace(path, "<path>")

    assert message(str(outside / "secret.png")) == message(str(outside / "missing.png")) \
        == message(str(outside / "no-folder" / "x.png")) == message("link-out.png") \
        == message("../outside/secret.png")
    assert str(hostile["work"]) in message("/etc/shadow")  # names the roots, so one can act


def test_the_working_directory_is_taken_when_the_call_starts(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "p.png").write_bytes(PAGE)
    monkeypatch.chdir(first)
    at_first = FilePolicy.of()
    monkeypatch.chdir(second)

    assert at_first.roots == (str(first.resolve()),)
    assert at_first.read(first / "p.png") == PAGE  # the roots stay what they were
    with pytest.raises(FileRefusedError, match="not under files_roots"):
        FilePolicy.of().read(first / "p.png")
    settings = InferenceSettings(endpoints=(EndpointSpec(name="e", base_url="http://x/v1",
                                                          models=(MODEL,)),),
                                 files_roots=["../a", tmp_path / "b"])
    assert settings.files_roots == ("../a", str(tmp_path / "b"))  # a tuple of text
    assert FilePolicy.of(settings).roots == (str(first.resolve()), str(second.resolve()))
    with pytest.raises(ValueError, match="files_roots is a list of folders"):
        InferenceSettings(endpoints=settings.endpoints, files_roots="/data")


# -- what is never opened, and what changes under us ----------------------------------------------
@pytest.mark.timeout(10)
def test_fifos_devices_and_directories_are_refused_without_being_opened(hostile, monkeypatch):
    opened = []
    real_open = os.open

    def recording_open(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    cases = {"pipe": (FilePolicy.of(), "not a regular file"),
             "folder": (FilePolicy.of(), "is a directory"),
             "/dev/zero": (FilePolicy(roots=("/dev",)), "not a regular file"),
             "/dev/null": (FilePolicy.any_path(), "not a regular file")}
    for path, (policy, reason) in cases.items():
        with pytest.raises(FileRefusedError, match=reason):
            policy.read(path)
    assert opened == []
    assert FilePolicy.of().read("page.png") == PAGE and opened  # a regular file is opened


@pytest.mark.timeout(10)
@pytest.mark.parametrize("swap", ["symlink out", "fifo", "directory out"])
def test_a_path_swapped_between_its_check_and_its_open_is_not_read(hostile, monkeypatch, swap):
    """The window between ``stat`` and ``open``: whatever is put there is refused (a FIFO put
    there is not waited on), never read."""
    work, outside = hostile["work"], hostile["outside"]
    (work / "sub").mkdir()
    (work / "sub" / "page.png").write_bytes(PAGE)
    (outside / "page.png").write_bytes(SECRET_IMAGE)
    target = str((work / "sub" / "page.png").resolve())
    real_stat = os.stat

    def swapping_stat(path, *args, **kwargs):
        found = real_stat(path, *args, **kwargs)
        if os.fspath(path) == target and not args and not kwargs:
            if swap == "directory out":
                os.rename(work / "sub", work / "sub-old")
                (work / "sub").symlink_to(outside)
            else:
                os.remove(target)
                if swap == "symlink out":
                    os.symlink(outside / "secret.png", target)
                else:
                    os.mkfifo(target)
        return found

    monkeypatch.setattr(os, "stat", swapping_stat)
    with pytest.raises(FileRefusedError, match="changed while it was being opened"):
        FilePolicy.of().read("sub/page.png")


def test_a_file_over_the_limit_is_refused_from_its_size(hostile):
    with pytest.raises(FileRefusedError, match=r"is \d+ bytes, over the limit of 10 bytes "
                                               r"\(max_image_bytes\)"):
        FilePolicy.of().read("page.png", max_bytes=10, limit_name="max_image_bytes")
    with pytest.raises(FileRefusedError, match="the path is empty"):
        FilePolicy.of().read("  ")
    with pytest.raises(FileRefusedError, match="NUL character"):
        FilePolicy.of().read("page.png\x00.txt")


# -- no byte of a file in an error ----------------------------------------------------------------
def test_no_error_quotes_the_bytes_of_what_it_read(hostile):
    work = hostile["work"]
    (work / "fake.png").write_bytes(b"\x89PNG\r\n\x1a\n" + SECRET)  # a signature, then secrets
    (work / "fake.webp").write_bytes(b"RIFF\xff\x00\x00\x00WEBProot" + SECRET)
    (work / "fake.jpg").write_bytes(b"\xff\xd8\xff" + SECRET + b"\xff\xd9")
    (work / "fake.pdf").write_bytes(SECRET)
    messages = []
    for name in ("notes.txt", "fake.png", "fake.webp", "fake.jpg"):
        with pytest.raises(InvalidInputError) as caught:
            image_parts(name, "img", "auto", 1 << 20)
        messages.append(caught.value.message)
    with pytest.raises(InvalidInputError) as caught:
        image_parts(SECRET, "img", "auto", 1 << 20)  # bytes in the cell itself
    messages.append(caught.value.message)
    with pytest.raises(DocumentError) as caught:
        parse_document("fake.pdf")
    messages.append(str(caught.value))
    messages.append(parse_document_value("fake.pdf")["error"])

    assert all(not _leaks(m) for m in messages), messages
    assert "unsupported image format" in messages[0] and "not a PDF" in messages[-1]


# -- URLs, configured roots, documents -------------------------------------------------------------
def test_image_urls_are_refused_when_the_settings_say_so(sim, make_client, hostile):
    df = pd.DataFrame({"name": ["url", "file"],
                       "img": ["https://example.com/scan.png", "page.png"]})

    result = make_client(sim, allow_image_urls=False).infer(
        df, prompt="Read {name}", model=MODEL, output_column="out", images="img")

    assert result.error_types.tolist() == ["invalid_input", None]
    assert "allow_image_urls=False" in result.df["out_error"][0]
    images = sim.stats(log=False)["images"]
    assert (images["requests"], images["remote"]) == (1, 0)


def test_configured_roots_replace_the_working_directory(sim, make_client, hostile):
    outside = hostile["outside"]
    df = pd.DataFrame({"name": ["there", "here"],
                       "img": [str(outside / "secret.png"), "page.png"]})

    result = make_client(sim, files_roots=[str(outside)]).infer(
        df, prompt="Read {name}", model=MODEL, output_column="out", images="img")

    assert result.df["out_error"][0] is None
    assert result.error_types[1] == "invalid_input"
    assert f"not under files_roots ['{outside.resolve()}']" in result.df["out_error"][1]


def test_estimates_follow_the_same_policy(sim, make_client, hostile):
    df = pd.DataFrame({"name": ["a", "b"], "img": ["page.png", "/etc/shadow"]})
    estimate = make_client(sim).estimate(df, prompt="Read {name}", model=MODEL, images="img")
    assert (estimate.rows, estimate.invalid_rows, estimate.requests_to_send) == (2, 1, 1)


@pytest.mark.timeout(10)
def test_documents_read_paths_as_their_policy_says(hostile):
    work, outside = hostile["work"], hostile["outside"]
    (outside / "doc.pdf").write_bytes(text_pdf(["Invoice 7"]))
    (work / "doc.pdf").write_bytes(text_pdf(["Invoice 8"]))

    assert parse_document(outside / "doc.pdf", render=False)[0].text == "Invoice 7"  # code's path
    with pytest.raises(DocumentError, match="not a regular file"):
        parse_document("pipe")  # any path, but no FIFO waited on
    assert parse_document_value("doc.pdf")["text"] == "Invoice 8"  # a cell: under the roots
    refused = parse_document_value(str(outside / "doc.pdf"))
    assert refused["page_count"] is None and "not under files_roots" in refused["error"]
    assert "not a regular file" in parse_document_value("pipe")["error"]


def test_the_policy_is_in_force_only_while_an_item_is_made():
    policy = FilePolicy(roots=("/nowhere",), allow_urls=False)
    seen = []

    def items():
        for i in range(3):
            seen.append(policy_in_force())
            yield i

    made = under_policy(policy, items())
    assert next(made) == 0 and policy_in_force() != policy
    assert list(made) == [1, 2]
    assert seen == [policy] * 3 and policy_in_force().allow_urls
