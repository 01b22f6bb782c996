"""The crash journal is private: its answers are served as paid for, so no other user may
write one. The directory is the user's own and 0700 (refused when another user's, a symbolic
link or not a directory); a journal file is folded only when it is a regular file of this
user that no one else can write, and only its records that have the form of a paid-for
answer. Other users are real ones where the tests run as root (a file is chowned to
``nobody``); elsewhere those tests are skipped (no one else's file can be made)."""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile

import pandas as pd
import pytest

from dagster_batchllm.core.errors import JournalUnsafeError
from dagster_batchllm.core.ledger.journal import (
    AnswerJournal,
    JournalDirectory,
    fold_abandoned,
    journal_dir_for,
)
from dagster_batchllm.core.ledger.table import Ledger

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0,
                             reason="a file of another user can only be made as root (chown)")


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _key_of(make_client, sim, text: str, tmp_path) -> tuple[str, str]:
    """The request key of ``Echo {text}`` and its real answer, from a ledger of their own."""
    client = make_client(sim, store_url=f"sqlite:///{tmp_path / 'keys.db'}")
    client.infer(pd.DataFrame({"text": [text]}), prompt="Echo {text}", model="sim-model",
                 output_column="out")
    record = client.ledger.records().iloc[0]
    return record["request_key"], record["response"]


def _planted(directory, key: str, name: str = "4242-planted.jsonl", *, owner: int | None = None,
             mode: int = 0o600, response: str = "FORGED ANSWER", **fields) -> str:
    """A journal with one ``ok`` record for ``key``, as another user (``owner``) could write."""
    directory.mkdir(mode=0o700, exist_ok=True)
    record = {"request_key": key, "scope": "", "partition_key": "", "model": "sim-model",
              "status": "ok", "response": response, "error": None, "error_type": None,
              "prompt_tokens": 3, "completion_tokens": 3, "attempts": 1, "endpoint": "ep0",
              "latency_ms": 1.0, "run_id": None, **fields}
    path = directory / name
    path.write_text(json.dumps(record) + "\n")
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return str(path)


def test_a_run_keeps_its_journal_in_a_0700_directory_in_a_0600_file(make_client, sim,
                                                                     tmp_path):
    client = make_client(sim)
    directory = journal_dir_for(client.ledger)
    assert directory == tmp_path / ".ledger.db.journal"
    journal = AnswerJournal(directory)
    try:
        assert _mode(directory) == 0o700 and _mode(journal.path) == 0o600
    finally:
        journal.close(remove=True)
    result = client.infer(pd.DataFrame({"text": ["a", "b"]}), prompt="Echo {text}",
                          model="sim-model", output_column="out")
    assert result.stats.succeeded == 2
    assert _mode(directory) == 0o700 and not list(directory.iterdir())


def test_for_a_database_server_the_journal_is_in_a_private_directory_of_the_user(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    top = tmp_path / f"batchllm-journal-{os.geteuid()}"
    journals = JournalDirectory(top / "0123456789abcdef", logging.getLogger("test"),
                                private_parent=True)
    try:
        assert _mode(top) == 0o700 and _mode(journals.path) == 0o700
    finally:
        journals.close()


@pytest.mark.postgres
def test_a_postgresql_ledgers_journal_is_under_the_users_own_temp_directory(
    postgres_url, tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ledger = Ledger(postgres_url)
    try:
        directory = journal_dir_for(ledger)
        assert directory.parent == tmp_path / f"batchllm-journal-{os.geteuid()}"
        assert postgres_url not in str(directory)  # a hash of the URL, never the URL
        journals = JournalDirectory.for_ledger(ledger, logging.getLogger("test"))
        try:
            assert _mode(directory.parent) == _mode(directory) == 0o700
        finally:
            journals.close()
    finally:
        ledger.dispose()


@as_root
def test_a_journal_directory_of_another_user_is_refused_before_anything_is_sent(
    make_client, sim, tmp_path
):
    directory = tmp_path / ".ledger.db.journal"
    directory.mkdir(mode=0o755)
    os.chown(directory, NOBODY, NOBODY)
    client = make_client(sim)
    with pytest.raises(JournalUnsafeError) as raised:
        client.infer(pd.DataFrame({"text": ["a"]}), prompt="Echo {text}", model="sim-model")
    message = str(raised.value)
    assert str(directory) in message and f"uid {NOBODY}" in message
    assert "cannot keep a crash journal safely" in message and "Remove" in message
    assert sim.stats(log=False)["requests"] == 0


def test_a_symbolic_link_for_the_journal_directory_is_refused(make_client, sim, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / ".ledger.db.journal").symlink_to(elsewhere)
    client = make_client(sim)
    with pytest.raises(JournalUnsafeError, match="symbolic link"):
        client.infer(pd.DataFrame({"text": ["a"]}), prompt="Echo {text}", model="sim-model")
    assert sim.stats(log=False)["requests"] == 0


def test_a_directory_of_the_users_own_open_to_others_is_made_private(tmp_path, caplog):
    directory = tmp_path / ".ledger.db.journal"
    directory.mkdir()
    os.chmod(directory, 0o777)  # as an older version (or a careless umask) left it
    with caplog.at_level(logging.WARNING):
        JournalDirectory(directory, logging.getLogger("test")).close()
    assert _mode(directory) == 0o700
    assert "made it private (0700)" in caplog.text and "0777" in caplog.text


@as_root
def test_an_answer_planted_by_another_user_is_not_served(make_client, sim, tmp_path, caplog):
    key, real = _key_of(make_client, sim, "secret question", tmp_path)
    client = make_client(sim)
    directory = journal_dir_for(client.ledger)
    planted = _planted(directory, key, owner=NOBODY)
    sent_before = sim.stats(log=False)["requests"]
    with caplog.at_level(logging.WARNING):
        result = client.infer(pd.DataFrame({"text": ["secret question"]}),
                              prompt="Echo {text}", model="sim-model", output_column="out")
    assert result.df["out"].tolist() == [real] and real != "FORGED ANSWER"
    assert result.stats.cached == 0 and sim.stats(log=False)["requests"] == sent_before + 1
    assert planted in caplog.text and f"belongs to another user (uid {NOBODY}" in caplog.text
    assert os.path.exists(planted)  # left for whoever looks into it, warned about once


@pytest.mark.parametrize("what", ["writable by others", "symbolic link", "not an answer"])
def test_journal_files_that_are_not_this_runs_kind_are_not_folded(what, make_client, sim,
                                                                  tmp_path, caplog):
    key, real = _key_of(make_client, sim, "question", tmp_path)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    directory = tmp_path / ".ledger.db.journal"
    if what == "writable by others":
        planted = _planted(directory, key, mode=0o666)
        reason = "other users may write it"
    elif what == "symbolic link":
        target = _planted(tmp_path / "outside", key, name="target.jsonl")
        directory.mkdir(mode=0o700)
        planted = str(directory / "4242-link.jsonl")
        os.symlink(target, planted)
        reason = "without following a link"
    else:  # forms a run never journals: a key that is no SHA-256, a failed status, no attempt
        directory.mkdir(mode=0o700)
        for i, fields in enumerate([{"request_key": "not-a-key"}, {"status": "failed"},
                                    {"attempts": 0}, {"prompt_tokens": -5},
                                    {"response": {"nested": 1}}]):
            planted = _planted(directory, key, name=f"{i}.jsonl", **fields)
        reason = "not answers this library wrote"
    try:
        with caplog.at_level(logging.WARNING):
            assert fold_abandoned(directory, ledger, logging.getLogger("test")) == 0
        assert ledger.lookup_ok([key]) == {}
        assert planted in caplog.text and reason in caplog.text, caplog.text
    finally:
        ledger.dispose()
    # A run on that ledger sends the request and gets the real answer.
    result = make_client(sim).infer(pd.DataFrame({"text": ["question"]}), prompt="Echo {text}",
                                    model="sim-model", output_column="out")
    assert result.df["out"].tolist() == [real] and result.stats.cached == 0


def test_a_journal_of_the_users_own_with_answers_in_form_is_folded(make_client, sim, tmp_path):
    """The checks keep what a run wrote: an answer journaled and left by a killed run (here
    written by hand, as the user's own 0600 file) is served from the ledger."""
    key, real = _key_of(make_client, sim, "question", tmp_path)
    _planted(tmp_path / ".ledger.db.journal", key, response=real)
    sent_before = sim.stats(log=False)["requests"]
    result = make_client(sim).infer(pd.DataFrame({"text": ["question"]}), prompt="Echo {text}",
                                    model="sim-model", output_column="out")
    assert result.df["out"].tolist() == [real] and result.stats.cached == 1
    assert sim.stats(log=False)["requests"] == sent_before
