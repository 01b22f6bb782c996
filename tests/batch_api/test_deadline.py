"""infer(mode="batch_api", deadline=...): the batch API first, online for the rows it has not
answered in time; against the simulated Files and Batches API, with the default margins.

Each test first answers a few rows online in another scope, as a past partition would have:
the online rate then comes from the ledger's measured latency, not from the conservative
bound for endpoints never measured."""

from __future__ import annotations

import datetime as dt
import logging
import time

import numpy as np
import pandas as pd
import pytest
from batch_helpers import MODEL, PROMPT, batch_stats, book_of, calibrated, frame

from dagster_batchllm.core.batch.deadline import MARGIN_S, deadline_at, duplicates
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint

ROWS = 60


def infer(client, df, **kwargs):
    return client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                        mode="batch_api", **kwargs)


def online_requests(sim) -> int:
    return sim.stats(log=False)["requests"]


def test_a_batch_that_finishes_in_time_sends_nothing_online_at_half_the_price(
        quick, make_client):
    client = calibrated(make_client, quick)
    result = infer(client, frame(ROWS), wait=True, deadline=dt.timedelta(minutes=10))

    assert result.stats.succeeded == ROWS and online_requests(quick) == 0
    figures = result.stats.deadline
    assert figures["met"] and figures["rows_by_batch"] == ROWS and figures["rows_online"] == 0
    assert figures["switched_online_at"] is None and figures["duplicate_rows"] == 0
    assert result.stats.cost_usd == pytest.approx(result.stats.online_cost_usd * 0.5)


@pytest.mark.slow
def test_a_stalled_batch_is_cancelled_and_its_rows_answered_online_by_the_deadline(
        held, make_client):
    client = calibrated(make_client, held)
    held.configure(batch_cancelling_s=0.0)  # the rest stay put: a batch stalled for good
    deadline = time.time() + MARGIN_S + 6
    result = infer(client, frame(ROWS), wait=True, deadline=deadline)
    finished = time.time()

    assert finished <= deadline
    assert result.stats.succeeded == ROWS and result.stats.deferred == 0
    assert online_requests(held) == ROWS  # each row once
    figures = result.stats.deadline
    assert figures["met"] and figures["rows_online"] == ROWS and figures["rows_by_batch"] == 0
    assert figures["switched_online_at"] is not None
    assert batch_stats(held)["batches_created"] == 1
    book = book_of(client)
    (row,) = book.all_batches(scope="", partition_key="")
    assert row["status"] == "collected" and row["overtaken_at"] is None  # ended in the wait
    records = client.ledger.records()
    mine = records[records["scope"] == ""]
    assert len(mine) == ROWS and (mine["status"] == "ok").all()
    # All online: the online price.
    assert result.stats.cost_usd == pytest.approx(result.stats.online_cost_usd)


@pytest.mark.slow
def test_lines_a_slow_batch_answered_are_used_and_only_the_rest_goes_online(
        quick, make_client):
    client = calibrated(make_client, quick)
    # Lines answered at an even pace over 60 s: by the switch (about 6 s in) a tenth or so.
    quick.configure(batch_in_progress_s=60.0)
    result = infer(client, frame(ROWS), wait=True, deadline=time.time() + MARGIN_S + 6)

    figures = result.stats.deadline
    assert result.stats.succeeded == ROWS and figures["met"]
    assert 0 < figures["rows_by_batch"] < ROWS
    assert figures["rows_online"] == ROWS - figures["rows_by_batch"] == online_requests(quick)
    assert figures["duplicate_rows"] == 0
    # Each row paid once: the batch's at the batch price, the rest online.
    paid = client.ledger.records()
    assert paid[paid["scope"] == ""]["cost_usd"].sum() == pytest.approx(result.stats.cost_usd)
    assert result.stats.online_cost_usd * 0.5 < result.stats.cost_usd < (
        result.stats.online_cost_usd)


@pytest.mark.slow
def test_a_cancel_that_comes_too_late_is_counted_as_duplicates_and_the_ledger_keeps_one(
        held, make_client):
    client = calibrated(make_client, held)
    first = infer(client, frame(ROWS), wait=False, deadline=time.time() + 300)
    assert first.stats.deferred == ROWS
    # Each stage by hand (the simulator's own tick could still be validating the batch when
    # lines are asked for, and lines are answered only in progress): in progress, then held
    # there, and in cancelling.
    held.advance_batches()
    held.advance_batches(lines=ROWS - 1)  # answered, but not yet to be seen: still in progress
    assert held.batches()[0]["lines_read"] == ROWS - 1
    # The switch: its cancel does not end the batch within the wait; every row goes online.
    switched = infer(client, frame(ROWS), wait=False, deadline=time.time() + 60)
    assert switched.stats.succeeded == ROWS and online_requests(held) == ROWS
    (row,) = book_of(client).all_batches(scope="", partition_key="")
    assert row["overtaken_at"] is not None and row["delivered_at"] is not None

    held.advance_batches()  # cancelled now, with the lines it had answered: answered twice
    rerun = infer(client, frame(ROWS), wait=True, deadline=dt.timedelta(minutes=10))
    assert rerun.stats.cached == ROWS and online_requests(held) == ROWS  # nothing sent
    count, cost = duplicates(book_of(client), client.settings, "", "")
    assert count == ROWS - 1 and cost > 0
    assert rerun.stats.deadline["duplicate_rows"] == count  # the partition's, reported
    assert rerun.stats.deadline["duplicate_cost_usd"] == pytest.approx(cost)
    records = client.ledger.records()
    mine = records[records["scope"] == ""]
    assert len(mine) == ROWS and (mine["status"] == "ok").all()
    # The ledger kept the online answers and their cost, not the batch's.
    assert mine["cost_usd"].sum() == pytest.approx(switched.stats.cost_usd)
    assert switched.stats.cost_usd == pytest.approx(switched.stats.online_cost_usd)


def test_a_deadline_out_of_reach_is_said_at_the_start_and_every_row_goes_online(
        quick, make_client, caplog):
    client = make_client(quick)  # nothing measured: the conservative bound
    with caplog.at_level(logging.WARNING, logger="dagster_batchllm"):
        result = infer(client, frame(ROWS), wait=True, deadline=dt.timedelta(seconds=1))
    assert "cannot be met even online" in caplog.text and "requests/s" in caplog.text
    assert result.stats.succeeded == ROWS and online_requests(quick) == ROWS
    assert batch_stats(quick)["batches_created"] == 0
    assert result.stats.deadline["rows_online"] == ROWS


@pytest.mark.slow
def test_with_wait_false_the_switch_time_is_recorded_and_a_run_then_sends_the_rest(
        held, make_client):
    client = calibrated(make_client, held)
    held.configure(batch_cancelling_s=0.0)
    deadline = time.time() + 200  # the switch: about 200 - 10 - 90 (WAKE_S) s from now
    first = infer(client, frame(ROWS), wait=False, deadline=deadline, partition_key="p1")
    assert first.stats.deferred == ROWS and online_requests(held) == 0
    assert first.stats.deadline["status"] == "pending" and not first.stats.deadline["met"]
    switch = book_of(client).switch_times("")
    assert set(switch) == {"p1"} and deadline - 105 < switch["p1"] < deadline - 99

    # A run of the partition before then waits on; after it, it switches.
    again = infer(client, frame(ROWS), wait=False, deadline=deadline, partition_key="p1")
    assert again.stats.deferred == ROWS and online_requests(held) == 0
    late = infer(client, frame(ROWS), wait=False, deadline=time.time() + 60,
                 partition_key="p1")
    assert late.stats.succeeded == ROWS and online_requests(held) == ROWS
    assert late.stats.deadline["status"] == "met"
    assert book_of(client).switch_times("") == {}  # the partition waits for nothing


def test_a_deadline_needs_batch_mode_and_a_time(quick, make_client):
    client = make_client(quick)
    with pytest.raises(InferenceConfigError, match="mode='batch_api'"):
        client.infer(frame(3), prompt=PROMPT, model=MODEL, output_column="s",
                     deadline=dt.timedelta(hours=1))
    with pytest.raises(InferenceConfigError, match="datetime"):
        infer(client, frame(3), deadline="09:00")
    assert online_requests(quick) == 0
    naive = dt.datetime(2030, 1, 1, 9, 0)
    assert deadline_at(naive) == naive.astimezone().timestamp()


@pytest.mark.slow
def test_embeddings_keep_a_deadline_too(tmp_path):
    with SimulatedEndpoint(embedding_models=("bge",), embedding_dimensions=8,
                           batch_stage_s=None) as sim:
        sim.configure(batch_validating_s=0.0, batch_cancelling_s=0.0)  # then stalled
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="sim", base_url=sim.base_url, embedding_models=("bge",),
                                    batch_api=True),),
            store_url=f"sqlite:///{tmp_path / 'ledger.db'}", batch_poll_initial_s=0.02,
            batch_poll_max_s=0.2, ledger_flush_interval_s=0.05)
        texts = pd.DataFrame({"text": [f"text {i}" for i in range(40)]})
        with InferenceClient(settings) as client:
            client.embed(texts.assign(text="past " + texts["text"]), input_column="text",
                         scope="past")  # measured online
            deadline = time.time() + MARGIN_S + 5
            result = client.embed(texts, input_column="text", mode="batch_api",
                                  deadline=deadline)
            assert time.time() <= deadline and result.stats.succeeded == 40
            assert result.stats.deadline["rows_online"] == 40 and result.stats.deadline["met"]
            assert all(v.dtype == np.float32 for v in result.df["embedding"])
            assert sim.stats(log=False)["batches"]["batches_created"] == 1


def test_a_run_that_finds_its_batches_ended_collects_them_even_close_to_the_deadline(
        held, make_client):
    client = calibrated(make_client, held)
    first = infer(client, frame(ROWS), wait=False, deadline=time.time() + 300)
    assert first.stats.deferred == ROWS
    held.complete_batches()
    # For all its rows this deadline would be due now (WAKE_S alone is 90 s); but the batch
    # has ended and answers every row: nothing goes online.
    collected = infer(client, frame(ROWS), wait=False, deadline=time.time() + 95)
    assert collected.stats.succeeded == ROWS and online_requests(held) == 0
    assert collected.stats.deadline["rows_by_batch"] == ROWS
    assert collected.stats.deadline["switched_online_at"] is None
