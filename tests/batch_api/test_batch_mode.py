"""infer(mode="batch_api") against the simulated Files and Batches API, with the real openai
client: answers, ledger records, what is submitted again and what never is."""

from __future__ import annotations

import pandas as pd
import pytest
from batch_helpers import MODEL, PROMPT, batch_stats, book_of, frame

from dagster_batchllm.core.batch.waits import waiting_for_batches, waiting_in_ledger
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.tasks.chat.call import InferenceCall
from dagster_batchllm.core.tasks.chat.rendering import iter_row_requests, row_tuples


def infer(client, df, **kwargs):
    return client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                        mode="batch_api", **kwargs)


def test_wait_true_answers_every_row_and_records_usage(quick, make_client):
    client = make_client(quick, endpoint={"max_requests_per_batch": 40})
    df = frame(100)
    online = client.infer(df.head(3), prompt=PROMPT, model=MODEL, output_column="summary")
    result = infer(client, df, wait=True)

    assert result.stats.deferred == 0 and result.stats.failed == 0
    assert result.df["summary"].notna().all()
    # The batch answers what the online route answers for the same request.
    assert result.df["summary"].head(3).tolist() == online.df["summary"].tolist()
    assert result.stats.cached == 3 and result.stats.requests == 97
    stats = batch_stats(quick)
    assert stats["batches_created"] == 3 and stats["files_uploaded"] == 3  # 40 + 40 + 17
    assert stats["lines_ok"] == 97 and stats["line_duplicates"] == 0
    records = client.ledger.records()
    assert (records["status"] == "ok").all() and len(records) == 100
    batch_rows = records[records["endpoint"] == "openai"]
    assert (batch_rows["prompt_tokens"] > 0).all() and (batch_rows["attempts"] == 1).all()
    assert result.stats.prompt_tokens == stats["line_prompt_tokens"] + 0 * 3
    assert result.stats.mode == "batch_api"

    again = infer(client, df, wait=True)  # all in the ledger now: nothing is submitted
    assert again.stats.cached == 100 and batch_stats(quick)["batches_created"] == 3


def test_wait_false_defers_rows_naming_their_batch_then_a_rerun_collects(held, make_client):
    client = make_client(held)
    df = frame(30)
    first = infer(client, df, wait=False)
    batch_id = held.batches()[0]["id"]
    assert first.stats.deferred == 30 and set(first.error_types) == {"deferred"}
    assert first.df["summary_error"].str.contains(f"waiting for batch {batch_id}").all()
    # The rows' lines in the batch book are their record: no ledger record of each deferral.
    assert waiting_for_batches(client.ledger) == {"": {batch_id: 30}}
    assert waiting_for_batches(client.settings.store_url) == {"": {batch_id: 30}}  # or its URL
    assert client.ledger.records().empty

    still = infer(client, df, wait=False)  # the batch is still running: it is waited for
    assert still.stats.deferred == 30 and batch_stats(held)["batches_created"] == 1
    assert still.df["summary_error"].str.contains(f"waiting for batch {batch_id} ").all()

    held.complete_batches()
    done = infer(client, df, wait=False)
    assert done.stats.succeeded == 30 and done.stats.requests == 0
    assert done.stats.prompt_tokens > 0  # paid for in this call's batch, counted here
    stats = batch_stats(held)
    assert stats["batches_created"] == 1 and stats["line_duplicates"] == 0
    assert waiting_for_batches(client.ledger) == {}  # delivered: nothing waits any more
    assert (client.ledger.records()["status"] == "ok").sum() == 30


def test_expired_batch_resubmits_only_the_lines_it_never_answered(held, make_client):
    client = make_client(held)
    df = frame(1000)
    infer(client, df, wait=False)
    held.advance_batches()  # validating -> in_progress
    held.advance_batches(lines=400)
    expired = held.expire_batches()[0]
    assert expired["status"] == "expired" and expired["request_counts"]["completed"] == 400

    second = infer(client, df, wait=False)  # collects 400, submits the other 600 again
    assert second.stats.succeeded == 400 and second.stats.deferred == 600
    held.advance_batches()
    newest = held.batches()[0]
    assert newest["id"] != expired["id"] and newest["request_counts"]["total"] == 600

    held.complete_batches()
    third = infer(client, df, wait=False)
    assert third.stats.succeeded == 1000 and third.stats.deferred == 0
    stats = batch_stats(held)
    assert stats["batches_created"] == 2 and stats["lines_ok"] == 1000
    assert stats["line_duplicates"] == 0
    records = client.ledger.records()
    assert sorted(records["attempts"].value_counts().items()) == [(1, 400), (2, 600)]


def test_error_lines_fail_with_their_reason_and_retryable_ones_are_submitted_once(
        quick, make_client):
    client = make_client(quick)
    df = frame(400)
    # 5% error lines: every 20th line, 429 and 500 (retryable) and 400 (not) in turn.
    outcomes = ["ok"] * 400
    statuses = [429, 500, 400]
    for n, line in enumerate(range(19, 400, 20)):
        outcomes[line] = statuses[n % 3]
    quick.script_batch_lines(*outcomes)
    result = infer(client, df, wait=True)

    failed = result.df[result.df["summary_error"].notna()]
    assert len(failed) == 6  # the 400s
    assert failed["summary_error"].str.startswith("bad_request: HTTP 400").all()
    assert failed["summary_error"].str.contains("simulated 400 error").all()
    assert result.stats.succeeded == 394 and result.stats.deferred == 0
    stats = batch_stats(quick)
    assert stats["batches_created"] == 2  # the 14 retryable lines, once, in a second batch
    assert quick.batches()[0]["request_counts"]["total"] == 14
    assert stats["line_duplicates"] == 0
    records = client.ledger.records().set_index("request_key")
    assert (records[records["status"] == "ok"]["attempts"].value_counts().to_dict()
            == {1: 380, 2: 14})
    assert (records[records["status"] == "failed"]["error_type"] == "bad_request").all()


def test_retryable_lines_stop_at_max_attempts(quick, make_client):
    client = make_client(quick, max_attempts=2)
    # The first batch's first line fails, and so does its second submission: max_attempts.
    quick.script_batch_lines(500, "ok", "ok", 500)
    result = infer(client, frame(3), wait=True)
    assert result.stats.failed == 1 and result.stats.succeeded == 2
    error = result.df["summary_error"].dropna().iloc[0]
    assert error.startswith("server_error: HTTP 500") and "after 2 batch submissions" in error
    assert batch_stats(quick)["batches_created"] == 2


def test_a_token_budget_smaller_than_the_job_submits_nothing_past_it(quick, make_client):
    client = make_client(quick)
    df = frame(100)
    call = InferenceCall(prompt=PROMPT, model=MODEL, output_column="summary")
    reserve = [r.reserve_tokens for r in iter_row_requests(
        row_tuples(df), call, default_max_tokens=client.settings.default_max_tokens)]
    budget = sum(reserve[:10]) + reserve[0] // 2
    result = infer(client, df, wait=True, token_budget=budget)

    assert result.stats.succeeded == 10 and result.stats.deferred == 90
    deferred = result.df["summary_error"].dropna()
    assert deferred.str.contains(f"the token budget \\({budget}\\)").all()
    stats = batch_stats(quick)
    assert stats["lines_answered"] == 10 and stats["batches_created"] == 1
    # The budget's rows wait in the ledger (not for a batch: a retry sensor reruns them).
    assert client.ledger.status_counts()["deferred"] == 90
    assert waiting_for_batches(client.ledger) == {}
    # They are answered by later calls, each within its own budget. Once a row's line is in
    # a batch, its budget deferral leaves the ledger (the batch book is its record now).
    later = infer(client, df, wait=False, token_budget=budget)
    assert later.stats.cached == 10 and later.stats.deferred == 90
    assert client.ledger.status_counts()["deferred"] == 80
    assert sum(waiting_for_batches(client.ledger)[""].values()) == 10
    later = infer(client, df, wait=True, token_budget=budget)  # collects 10, submits 10
    assert later.stats.succeeded == 30 and later.stats.cached == 10


def test_another_partition_waits_for_the_batch_holding_its_keys(held, make_client):
    client = make_client(held)
    df = frame(50)
    infer(client, df, wait=False, partition_key="2026-11-05")
    batch_id = held.batches()[0]["id"]
    other = infer(client, df, wait=False, partition_key="2026-11-06")
    assert other.stats.deferred == 50 and batch_stats(held)["batches_created"] == 1
    assert other.df["summary_error"].str.contains(f"waiting for batch {batch_id}").all()

    # The first day waits on its own batch (the book's record), the second on the first's
    # (a deferred ledger record naming it, which the retry sensor leaves to the batch sensor).
    assert waiting_for_batches(client.ledger) == {"2026-11-05": {batch_id: 50},
                                                  "2026-11-06": {batch_id: 50}}
    assert waiting_in_ledger(client.ledger) == {"2026-11-06": {batch_id: 50}}

    held.complete_batches()
    for day in ("2026-11-06", "2026-11-05"):
        done = infer(client, df, wait=False, partition_key=day)
        assert done.stats.succeeded == 50, day
        if day == "2026-11-06":  # it collected the first day's batch, which still waits
            assert waiting_for_batches(client.ledger) == {"2026-11-05": {batch_id: 50}}
    assert waiting_for_batches(client.ledger) == {}
    assert batch_stats(held)["lines_answered"] == 50  # paid once, for both days
    counts = client.ledger.status_counts(partition_key="2026-11-05")
    assert counts["ok"] == 50


def test_a_lost_create_reply_is_found_again_not_created_twice(quick, make_client):
    client = make_client(quick)
    quick.script_batch_api("ok", "drop")  # the upload; the create happens, its reply is lost
    result = infer(client, frame(20), wait=True)
    assert result.stats.succeeded == 20
    stats = batch_stats(quick)
    assert stats["batches_created"] == 1 and stats["line_duplicates"] == 0
    assert (client.ledger.records()["attempts"] == 1).all()


def test_a_failed_upload_is_submitted_again_in_the_next_pass(quick, make_client):
    client = make_client(quick)
    quick.script_batch_api(500)  # the first upload
    result = infer(client, frame(20), wait=True)
    assert result.stats.succeeded == 20 and result.stats.failed == 0
    stats = batch_stats(quick)
    assert stats["batches_created"] == 1 and stats["files_uploaded"] == 1
    assert (client.ledger.records()["attempts"] == 2).all()


def test_wrong_calls_raise_before_anything_is_sent(quick, make_client, store_url):
    client = make_client(quick)
    with pytest.raises(InferenceConfigError, match="mode must be one of"):
        client.infer(frame(2), prompt=PROMPT, model=MODEL, mode="offline")
    with pytest.raises(InferenceConfigError, match="wait must be True or False"):
        infer(client, frame(2), wait="yes")
    from batch_helpers import batch_settings

    from dagster_batchllm.core.client import InferenceClient

    online_only = batch_settings(quick, store_url)
    online_only = online_only.replace(endpoints=tuple(
        e.__class__(**{**e.__dict__, "batch_api": False}) for e in online_only.endpoints))
    with InferenceClient(online_only) as plain, pytest.raises(
            InferenceConfigError, match="needs an endpoint with batch_api=True"):
        plain.infer(frame(2), prompt=PROMPT, model=MODEL, mode="batch_api")
    assert batch_stats(quick)["api_requests"] == 0


def test_predictions_are_refused_in_batch_mode_saying_why(quick, store_url):
    """No MLflow server has a batch API: an MLflow endpoint marked batch_api=True must not
    upload /invocations lines to a Files API it does not have."""
    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
    from dagster_batchllm.core.tasks.predict.call import PredictCall

    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="scorer", base_url=quick.base_url, models=("risk",),
                                protocol="mlflow", batch_api=True),),
        store_url=store_url)
    features = pd.DataFrame({"f1": [0.1, 0.2], "f2": [1.0, 2.0]})
    with InferenceClient(settings) as client, pytest.raises(
            InferenceConfigError, match="neither has an offline batch API; score them online"):
        client.run_call(features, PredictCall(model="risk", input_columns=["f1", "f2"]),
                        mode="batch_api")
    stats = quick.stats(log=False)
    assert stats["requests"] == 0 and batch_stats(quick)["api_requests"] == 0


def test_bad_rows_fail_alone_before_submission(quick, make_client):
    client = make_client(quick)
    df = pd.DataFrame({"text": ["fine", None, "   ", "also fine"]})
    result = infer(client, df, wait=True)
    assert result.error_types.tolist() == [None, "invalid_input", "invalid_input", None]
    assert batch_stats(quick)["lines_answered"] == 2
    assert book_of(client).all_batches()[0]["lines"] == 2


@pytest.mark.slow
@pytest.mark.postgres
def test_the_batch_book_works_on_postgresql(quick, make_client):
    """The book's per-line statements are plain SQL: PostgreSQL's placeholders and booleans."""
    import uuid

    import sqlalchemy as sa

    url = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    try:
        sa.create_engine(url).connect().close()
    except Exception as exc:  # pragma: no cover - the project's machines run PostgreSQL
        pytest.skip(f"no PostgreSQL at {url}: {exc}")
    table = f"batch_test_{uuid.uuid4().hex[:8]}"
    client = make_client(quick, store_url=url, ledger_table=table)
    quick.script_batch_lines(*(["ok"] * 9 + [500]))
    try:
        result = infer(client, frame(30), wait=True)
        assert result.stats.succeeded == 30
        assert batch_stats(quick)["batches_created"] == 2
        again = infer(client, frame(30), wait=True)
        assert again.stats.cached == 30
    finally:
        with client.ledger.engine.begin() as conn:
            for name in (f"{table}_batch_lines", f"{table}_batches", f"{table}_claims", table):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")


def test_a_batch_the_provider_fails_fails_its_rows_with_the_reason(quick, make_client):
    quick.configure(batch_max_lines=5)  # validation refuses a 10-line file
    client = make_client(quick)
    result = infer(client, frame(10), wait=True)
    assert result.stats.failed == 10 and set(result.error_types) == {"bad_request"}
    error = result.df["summary_error"].iloc[0]
    assert "failed: too_many_requests" in error and "at most 5 are allowed" in error
    assert batch_stats(quick)["batches_created"] == 1  # not submitted again: it cannot pass


def test_a_cancelled_batch_keeps_its_answers_and_the_rest_is_submitted_again(held,
                                                                             make_client):
    from dagster_batchllm.testing import openai_client

    client = make_client(held)
    df = frame(10)
    infer(client, df, wait=False)
    batch_id = held.batches()[0]["id"]
    held.advance_batches()
    held.advance_batches(lines=3)
    openai_client(held, api_key="sk-batch").batches.cancel(batch_id)
    held.advance_batches()  # cancelling -> cancelled
    assert held.batches()[0]["status"] == "cancelled"

    again = infer(client, df, wait=False)
    assert again.stats.succeeded == 3 and again.stats.deferred == 7
    held.complete_batches()
    done = infer(client, df, wait=False)
    assert done.stats.succeeded == 10
    assert batch_stats(held)["batches_created"] == 2
    assert batch_stats(held)["line_duplicates"] == 0


def test_an_unreachable_batch_endpoint_fails_the_rows_after_max_attempts(store_url):
    import socket

    from batch_helpers import batch_settings

    from dagster_batchllm.core.client import InferenceClient

    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    class Nowhere:
        base_url = f"http://127.0.0.1:{port}/v1"
        settings = type("S", (), {"api_key": "k"})

    with InferenceClient(batch_settings(Nowhere, store_url, max_attempts=2)) as client:
        result = infer(client, frame(5), wait=True)
    assert result.stats.failed == 5 and set(result.error_types) == {"connection_error"}
    error = result.df["summary_error"].iloc[0]
    assert "cannot connect to 'openai'" in error and "after 2 batch submissions" in error


@pytest.mark.slow
def test_waiting_logs_each_batch_and_its_request_counts(make_client, caplog):
    import logging

    from dagster_batchllm.testing import SimulatedEndpoint

    with SimulatedEndpoint(models=(MODEL,), api_key="sk-batch", batch_stage_s=0.3) as sim:
        client = make_client(sim)
        with caplog.at_level(logging.INFO, logger="dagster_batchllm"):
            result = infer(client, frame(20), wait=True)
    assert result.stats.succeeded == 20
    progress = [r.getMessage() for r in caplog.records if "batches pending" in r.getMessage()]
    assert progress, [r.getMessage() for r in caplog.records]
    assert "1 batches pending: batch_sim" in progress[0]
    assert "lines answered" in progress[0] and "next poll in" in progress[0]
    assert any("collected batch batch_sim" in r.getMessage() for r in caplog.records)


def test_a_pass_in_slices_submits_a_key_of_two_slices_once_and_names_its_batch(
        held, make_client, monkeypatch):
    from dagster_batchllm.core.batch import mode as batch_mode

    monkeypatch.setattr(batch_mode, "_SLICE_ROWS", 40)  # engine runs of 40 rows, one file
    client = make_client(held)
    df = pd.concat([frame(50), frame(50)], ignore_index=True)  # rows 50.. repeat rows 0..
    first = infer(client, df, wait=False)
    batch_id = held.batches()[0]["id"]
    assert first.stats.deferred == 100 and batch_stats(held)["batches_created"] == 1
    assert first.stats.endpoints["openai"]["requests"] == 50  # counted once, not per slice
    # A repeated key in a later slice waits for the batch of its first row, named the same.
    assert (first.df["summary_error"].str.contains(f"waiting for batch {batch_id}")).all()

    held.complete_batches()
    done = infer(client, df, wait=False)
    assert done.stats.succeeded == 100 and done.stats.requests == 0
    assert done.df["summary"].tolist()[:50] == done.df["summary"].tolist()[50:]
    stats = batch_stats(held)
    assert stats["lines_ok"] == 50 and stats["line_duplicates"] == 0


@pytest.mark.parametrize("assume_new", [False, True], ids=["looked_up", "assumed_new"])
def test_keys_placed_without_a_lookup_are_decided_from_their_lines_after_all(
        held, make_client, monkeypatch, assume_new):
    """After a parcel whose keys had no line, the next are put in files without a lookup; a
    key that has a line after all (an answer collected at the pass's start, a row of the same
    key earlier in this pass) gets the outcome a looked-up key gets."""
    from dagster_batchllm.core.batch import mode as batch_mode
    from dagster_batchllm.core.delivery.batch_api import delivery as batch_delivery

    if assume_new:  # every parcel placed without a lookup, the first too
        made = batch_delivery.BatchDelivery.__init__

        def assuming(self, *args, **kwargs):
            made(self, *args, **kwargs)
            self._assume_new = True

        monkeypatch.setattr(batch_delivery.BatchDelivery, "__init__", assuming)
    monkeypatch.setattr(batch_mode, "_SLICE_ROWS", 40)
    client = make_client(held)
    infer(client, frame(50), wait=False)
    held.complete_batches()
    # 50 keys with answers in the book (not yet collected), 30 new ones, twice each.
    df = pd.concat([frame(80), frame(80)], ignore_index=True)
    second = infer(client, df, wait=False)
    assert second.stats.succeeded == 100 and second.stats.deferred == 60
    assert second.stats.endpoints["openai"]["requests"] == 30  # the new keys, once each
    assert second.df["summary"].head(50).tolist() == second.df["summary"].iloc[80:130].tolist()
    assert batch_stats(held)["batches_created"] == 2
    held.complete_batches()
    third = infer(client, df, wait=False)
    assert third.stats.succeeded == 160 and third.stats.requests == 0
    stats = batch_stats(held)
    assert stats["lines_ok"] == 80 and stats["line_duplicates"] == 0


def test_image_rows_go_through_the_batch_api_as_they_go_online(quick, make_client, store_url):
    from dagster_batchllm.testing import png_bytes

    df = pd.DataFrame({"text": ["first page", "second page", "no page"],
                       "page": [png_bytes(2, 2, (10, 0, 0)), png_bytes(3, 3, (0, 90, 0)), 7]})
    client = make_client(quick)
    batch = infer(client, df, images="page")
    assert batch.stats.mode == "batch_api" and batch_stats(quick)["batches_created"] == 1
    online = make_client(quick, store_url=store_url.replace("ledger.db", "online.db")).infer(
        df, prompt=PROMPT, model=MODEL, output_column="summary", images="page")
    assert batch.df["summary"].tolist()[:2] == online.df["summary"].tolist()[:2]
    assert all("[image sha256:" in answer for answer in batch.df["summary"][:2])
    assert batch.error_types.tolist() == [None, None, "invalid_input"]  # 7 is no image
    assert infer(client, df, images="page").stats.cached == 2  # the rerun sends nothing
