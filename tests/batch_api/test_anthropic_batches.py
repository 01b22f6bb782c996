"""Anthropic's Message Batches as the batch protocol (batch_protocol="anthropic"), against the
simulated server's /v1/messages/batches routes, through the real ``anthropic`` client: the
ledger's guarantees hold as with OpenAI's (every row once, resume after a SIGKILL, nothing paid
twice, per-row errors as data).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anthropic
import pytest
from batch_helpers import MODEL, PROMPT, batch_stats, book_of, frame

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.delivery.batch_api.anthropic import (
    AnthropicBatchProtocol,
    BatchNotYetKnown,
    CannotExpress,
    key_of,
    messages_params,
)
from dagster_batchllm.core.errors import InferenceConfigError
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint, sigkill_when

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "Answer in one line."

CHILD = """
import sys
import pandas as pd
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

url, store_url, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = InferenceSettings(
    endpoints=(EndpointSpec(name="claude", base_url=url, models=("sim-model",),
                            api_key="sk-batch", batch_api=True, batch_protocol="anthropic",
                            max_requests_per_batch=1000),),
    store_url=store_url, progress_interval_s=3600.0, batch_poll_initial_s=0.05)
df = pd.DataFrame({"text": [f"call number {i}" for i in range(rows)]})
InferenceClient(settings).infer(df, prompt="Summarize: {text}", model="sim-model",
                                output_column="summary", mode="batch_api", wait=True)
print("finished", flush=True)
"""


def claude(sim: SimulatedEndpoint, **fields) -> EndpointSpec:
    return EndpointSpec(name="claude", base_url=sim.base_url, models=(MODEL,),
                        api_key=sim.settings.api_key, batch_api=True,
                        batch_protocol="anthropic", **fields)


@pytest.fixture
def make_claude(store_url):
    clients = []

    def build(sim: SimulatedEndpoint, store: str = store_url, endpoint: EndpointSpec | None
              = None, **overrides) -> InferenceClient:
        client = InferenceClient(InferenceSettings(
            endpoints=(endpoint or claude(sim),), store_url=store, batch_poll_initial_s=0.02,
            batch_poll_max_s=0.2, ledger_flush_interval_s=0.05, progress_interval_s=60.0,
            **overrides))
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


def sdk(sim: SimulatedEndpoint) -> anthropic.Anthropic:
    # Used in a with block: an unreferenced client is closed by the garbage collector whenever
    # it runs, and that can be in the middle of reading a streamed results file (EBADF).
    return anthropic.Anthropic(base_url=sim.base_url.removesuffix("/v1"),
                               api_key=sim.settings.api_key, max_retries=0)


def infer(client: InferenceClient, df, *, wait: bool = True, **fields):
    return client.infer(df, prompt=PROMPT, system=SYSTEM, model=MODEL,
                        output_column="summary", mode="batch_api", wait=wait, **fields)


def test_rows_answered_through_message_batches_match_the_same_rows_online(
        quick, make_claude, tmp_path):
    df = frame(40)
    batch = infer(make_claude(quick), df, temperature=0.5, stop=["\n\n"])
    online = make_claude(quick, f"sqlite:///{tmp_path / 'online.db'}").infer(
        df, prompt=PROMPT, system=SYSTEM, model=MODEL, output_column="summary",
        temperature=0.5, stop=["\n\n"])
    assert batch.stats.succeeded == 40 and batch.stats.failed == 0
    assert batch.df["summary"].tolist() == online.df["summary"].tolist()
    assert batch.df["summary"].notna().all()
    assert (batch.stats.prompt_tokens, batch.stats.completion_tokens) == (
        online.stats.prompt_tokens, online.stats.completion_tokens) != (0, 0)
    stats = batch_stats(quick)
    assert stats["batches_created"] == 1 and stats["files_uploaded"] == 0  # inline requests
    with sdk(quick) as api:
        (sent,) = api.messages.batches.list().data
        results = list(api.messages.batches.results(sent.id))
    assert sent.id.startswith("msgbatch_") and sent.request_counts.succeeded == 40
    # Each custom id fits Anthropic's pattern and carries the row's request key.
    assert {r.result.type for r in results} == {"succeeded"}
    assert all(len(r.custom_id) <= 64 and r.custom_id.replace("-", "").replace("_", "")
               .isalnum() for r in results)
    decoded = [key_of(r.custom_id)[0] for r in results]
    found = book_of(make_claude(quick)).latest_lines(decoded)
    assert len(found) == 40 and {line.batch_name for line in found.values()} == {sent.id}


def test_a_rerun_sends_nothing(quick, make_claude):
    client = make_claude(quick)
    first = infer(client, frame(25))
    assert first.stats.succeeded == 25
    calls = batch_stats(quick)["api_requests"]
    again = infer(client, frame(25))
    assert again.stats.succeeded == 25 and again.stats.cached == 25
    assert again.stats.requests == 0
    assert batch_stats(quick)["api_requests"] == calls  # not even a poll
    assert batch_stats(quick)["batches_created"] == 1


@pytest.mark.slow
def test_sigkill_between_submit_and_collect_then_the_rerun_collects(
        tmp_path, held, make_claude, store_url):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    held.configure(batch_validating_s=0.0)  # taken at once, then held in progress
    client = make_claude(held)
    book = book_of(client)
    proc = subprocess.Popen([sys.executable, str(script), held.base_url, store_url, "2500"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)

    def submitted() -> bool:
        batches = book.all_batches()
        return len(batches) == 3 and all(b["batch_id"] for b in batches)

    sigkill_when(proc, submitted, 120, "three message batches")
    assert proc.returncode == -signal.SIGKILL
    assert batch_stats(held)["batches_created"] == 3
    assert all(b["provider"] == "anthropic" for b in book.all_batches())

    held.complete_batches()
    result = client.infer(frame(2500), prompt=PROMPT, model=MODEL, output_column="summary",
                          mode="batch_api", wait=True)
    assert result.stats.succeeded == 2500 and result.stats.deferred == 0
    after = batch_stats(held)
    assert after["batches_created"] == 3  # none new
    assert after["lines_ok"] == 2500 and after["line_duplicates"] == 0
    assert result.stats.prompt_tokens == after["line_prompt_tokens"]  # paid once, counted here


def test_wait_false_returns_deferred_rows_and_a_later_call_collects(held, make_claude):
    client = make_claude(held)
    df = frame(12)
    later = infer(client, df, wait=False)
    assert later.stats.deferred == 12
    assert all("waiting for batch msgbatch_" in cell for cell in later.df["summary_error"])
    held.complete_batches()
    collected = infer(client, df, wait=False)
    assert collected.stats.succeeded == 12 and collected.stats.requests == 0
    assert batch_stats(held)["batches_created"] == 1


def test_errored_and_expired_requests_become_row_errors_with_their_reasons(held, make_claude):
    client = make_claude(held, max_attempts=1)  # an expired request is not sent again
    df = frame(10)
    infer(client, df, wait=False)
    held.script_batch_lines(400)  # the first request answered errors
    held.configure(batch_expire_after_fraction=0.5)  # the batch expires after half of them
    held.complete_batches()
    result = infer(client, df, wait=False)
    errors = [e for e in result.df["summary_error"] if e]
    assert result.stats.succeeded == 4 and result.stats.failed == 6
    assert sum("HTTP 400" in e and "simulated 400 error" in e for e in errors) == 1
    assert sum("expired before this line was answered" in e for e in errors) == 5
    assert result.stats.errors_by_type == {"bad_request": 1, "timeout": 5}
    with sdk(held) as api:
        (sent,) = api.messages.batches.list().data
        kinds = sorted(r.result.type for r in api.messages.batches.results(sent.id))
    assert kinds == ["errored"] + ["expired"] * 5 + ["succeeded"] * 4


def test_a_canceled_batch_sends_its_unprocessed_rows_again(held, make_claude):
    client = make_claude(held)
    df = frame(6)
    infer(client, df, wait=False)
    with sdk(held) as api:
        (sent,) = api.messages.batches.list().data
        assert api.messages.batches.cancel(sent.id).processing_status == "canceling"
        held.complete_batches()
        assert api.messages.batches.retrieve(sent.id).request_counts.canceled == 6
    held.configure(batch_validating_s=0.0, batch_in_progress_s=0.0, batch_finalizing_s=0.0)
    result = infer(client, df)
    assert result.stats.succeeded == 6 and batch_stats(held)["batches_created"] == 2


def test_a_create_whose_reply_was_lost_is_found_not_paid_twice(quick, make_claude):
    quick.configure(batch_validating_s=None)  # still processing when it is looked for
    quick.script_batch_api("drop")  # the create takes effect, its reply never comes
    client = make_claude(quick)
    df = frame(8)
    later = infer(client, df, wait=False)
    assert later.stats.deferred == 8 and later.stats.failed == 0
    # The create (dropped) and the list that found its batch: no second create.
    assert batch_stats(quick)["api_requests"] == 2
    assert batch_stats(quick)["batches_created"] == 1
    quick.complete_batches()
    result = infer(client, df, wait=False)
    assert result.stats.succeeded == 8 and batch_stats(quick)["batches_created"] == 1


def test_find_tells_a_submission_by_its_custom_ids_once_the_batch_ended(held, tmp_path):
    spec = claude(held)
    maker = AnthropicBatchProtocol(spec)
    path = tmp_path / "lines.jsonl"
    body = json.dumps({"model": MODEL, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    path.write_bytes(maker.line("ab" * 32, "/chat/completions", body))
    batch_id, file_id = maker.submit(path, route="/chat/completions",
                                     submission_id="bllm-one", metadata={})
    assert file_id is None
    maker.close()
    fresh = AnthropicBatchProtocol(spec)  # another process: it made no create call itself
    with pytest.raises(BatchNotYetKnown, match="still processing"):
        fresh.find("bllm-one")  # in progress: its custom ids do not show yet
    held.complete_batches()
    assert fresh.find("bllm-one") == batch_id
    assert fresh.find("bllm-other") is None
    (line,) = fresh.results(fresh.poll(batch_id), "/chat/completions")
    assert line.keys == ["ab" * 32] and line.contents == ["[sim] hello"]
    fresh.close()


def test_a_request_the_messages_api_cannot_express_fails_its_row_and_is_not_sent(
        quick, make_claude):
    result = infer(make_claude(quick), frame(3), seed=7)
    assert result.stats.failed == 3
    assert all("'seed' has no Messages API counterpart" in e
               for e in result.df["summary_error"])
    assert set(result.error_types) == {"bad_request"}
    assert batch_stats(quick)["batches_created"] == 0
    assert batch_stats(quick)["api_requests"] == 0


def test_a_misconfiguration_raises_before_anything_is_sent(quick, make_claude):
    with pytest.raises(ValueError, match=r"batch_protocol must be one of \['openai', "
                                         r"'anthropic'\], got 'bedrock'"):
        EndpointSpec(name="x", base_url=quick.base_url, models=(MODEL,),
                     batch_protocol="bedrock")
    embedder = make_claude(quick, endpoint=EndpointSpec(
        name="claude", base_url=quick.base_url, embedding_models=("sim-embed",),
        api_key="sk", batch_api=True, batch_protocol="anthropic"))
    with pytest.raises(InferenceConfigError, match="Message Batches answer chat messages "
                                                   "only.*no embeddings"):
        embedder.embed(frame(2), input_column="text", model="sim-embed", output_column="vector",
                       mode="batch_api")
    too_big = make_claude(quick, endpoint=claude(quick, max_requests_per_batch=200_000))
    with pytest.raises(InferenceConfigError, match="above Anthropic's 100,000 requests"):
        infer(too_big, frame(2))
    assert batch_stats(quick)["api_requests"] == 0 and quick.stats()["requests"] == 0


def test_chat_bodies_become_messages_params_or_say_why_not():
    png = "data:image/png;base64,iVBORw0KGgo="
    params = messages_params({
        "model": "claude", "max_tokens": 32, "temperature": 0.2, "stop": "END",
        "messages": [{"role": "system", "content": "Be terse."},
                     {"role": "user", "content": [
                         {"type": "text", "text": "What is this?"},
                         {"type": "image_url", "image_url": {"url": png, "detail": "auto"}}]}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "a", "schema": {"type": "object"}, "strict": True}}})
    assert params == {
        "model": "claude", "max_tokens": 32, "system": "Be terse.", "temperature": 0.2,
        "stop_sequences": ["END"],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}]}],
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}
    user = [{"role": "user", "content": "hi"}]
    for body, reason in (
            ({"model": "m", "messages": user}, "needs max_tokens"),
            ({"model": "m", "max_tokens": 5, "messages": user, "temperature": 1.5},
             "Anthropic takes 0 to 1"),
            ({"model": "m", "max_tokens": 5, "messages": user,
              "response_format": {"type": "json_object"}}, "not JSON mode"),
            ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": png, "detail": "low"}}]}]},
             "detail='low' has no Anthropic counterpart"),
            ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,AA"}}]}]},
             "an image of type 'image/bmp'"),
            ({"model": "m", "max_tokens": 5, "messages": [*user, {"role": "system",
                                                                   "content": "late"}]},
             "system message after the conversation began"),
            ({"model": "m", "max_tokens": 5, "messages": [
                {"role": "tool", "content": "x", "tool_call_id": "1"}]}, "'tool_call_id'")):
        with pytest.raises(CannotExpress, match=reason):
            messages_params(body)
