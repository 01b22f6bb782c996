"""The Batch API lifecycle on the simulated endpoint, driven by the real openai client."""

from __future__ import annotations

import json
import time

import openai
import pytest

from dagster_batchllm.testing import (
    EchoResponder,
    SimulatedEndpoint,
    openai_client,
    wait_for_batch,
)

MODEL = "sim-model"
CHAT = "/v1/chat/completions"


client_for = openai_client


def chat_line(custom_id: str, prompt: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": MODEL, "messages": [{"role": "user", "content": prompt}], **body}}


def jsonl(lines: list) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                   for line in lines).encode()


def submit(client: openai.OpenAI, lines: list, endpoint: str = CHAT):
    uploaded = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,
                                 completion_window="24h")


def read_jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def wait_for(client: openai.OpenAI, batch_id: str, timeout: float = 20.0):
    return wait_for_batch(client, batch_id, timeout=timeout)


@pytest.fixture(scope="module")
def held():
    """Batches move only when the test says so."""
    with SimulatedEndpoint(batch_stage_s=None) as endpoint:
        yield endpoint


@pytest.fixture
def sim(held):
    held.reset_stats()
    held.configure(batch_line_error_rate=0.0, batch_expire_after_fraction=None)
    return held


def test_lifecycle_step_by_step_and_answers_equal_online(sim):
    client = client_for(sim)
    schema = {"type": "object", "properties": {"label": {"enum": ["spam", "ham"]}},
              "required": ["label"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "l", "schema": schema}}
    lines = [chat_line("a", "hello  there"),
             chat_line("b", "is this spam?", response_format=fmt),
             chat_line("c", "word " * 40, max_tokens=3)]
    batch = submit(client, lines)
    assert batch.status == "validating" and batch.request_counts.total == 0
    assert batch.expires_at - batch.created_at == 24 * 3600
    (listed,) = [b for b in sim.batches() if b["id"] == batch.id]
    assert listed["status"] == "validating" and listed["lines_read"] == 0

    sim.advance_batches()
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "in_progress" and batch.request_counts.total == 3
    assert batch.model == MODEL and batch.in_progress_at is not None
    sim.advance_batches(lines=2)
    batch = client.batches.retrieve(batch.id)
    assert (batch.status, batch.request_counts.completed) == ("in_progress", 2)
    sim.advance_batches()
    assert client.batches.retrieve(batch.id).status == "finalizing"
    assert client.batches.retrieve(batch.id).output_file_id is None  # not before completed
    sim.advance_batches()
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.completed_at is not None
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    assert batch.error_file_id is None

    results = read_jsonl(client, batch.output_file_id)
    assert [r["custom_id"] for r in results] == ["a", "b", "c"]
    for line, result in zip(lines, results, strict=True):
        assert result["error"] is None and result["response"]["status_code"] == 200
        assert result["id"].startswith("batch_req_") and result["response"]["request_id"]
        online = client.chat.completions.create(**line["body"]).model_dump(exclude_unset=True)
        offline = result["response"]["body"]
        assert offline["object"] == "chat.completion"
        assert (offline["choices"], offline["usage"]) == (online["choices"], online["usage"])
    assert json.loads(results[1]["response"]["body"]["choices"][0]["message"]["content"]) == {
        "label": "spam"}
    usage = batch.usage
    assert usage.input_tokens == sum(r["response"]["body"]["usage"]["prompt_tokens"]
                                     for r in results)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    stats = sim.stats()
    batches = stats["batches"]
    assert (batches["files_uploaded"], batches["batches_created"], batches["lines_answered"],
            batches["line_duplicates"]) == (1, 1, 3, 0)
    assert stats["ok"] == 3  # the online comparisons only: lines are counted apart


def test_validation_failures_list_their_lines(sim):
    client = client_for(sim)
    lines = [chat_line("x", "fine"), "{not json", chat_line("x", "again"),
             {**chat_line("y", "wrong url"), "url": "/v1/completions"},
             {**chat_line("z", "wrong method"), "method": "GET"},
             {"custom_id": "w", "method": "POST", "url": CHAT}]
    batch = submit(client, lines)
    sim.advance_batches()
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "failed" and batch.failed_at is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [
        ("invalid_json_line", 2), ("duplicate_custom_id", 3), ("invalid_url", 4),
        ("invalid_method", 5), ("missing_required_parameter", 6)]
    assert batch.output_file_id is None and batch.request_counts.total == 0
    for bad in ([], [chat_line("a", "x"), {**chat_line("b", "y"), "body": {
            "model": "other", "messages": []}}]):
        batch = submit(client, bad)
        sim.advance_batches()
        codes = [e.code for e in client.batches.retrieve(batch.id).errors.data]
        assert codes == (["empty_file"] if not bad else ["mismatched_model"])
    assert sim.stats()["batches"]["lines_answered"] == 0


def test_blank_lines_are_skipped_and_batch_max_lines_refuses(sim):
    client = client_for(sim)
    batch = submit(client, [chat_line("a", "x"), "", "   ", chat_line("b", "y")])
    sim.complete_batches()
    assert client.batches.retrieve(batch.id).request_counts.completed == 2
    sim.configure(batch_max_lines=1)
    try:
        batch = submit(client, [chat_line("a", "x"), chat_line("b", "y")])
        sim.advance_batches()
        assert client.batches.retrieve(batch.id).errors.data[0].code == "too_many_requests"
    finally:
        sim.configure(batch_max_lines=None)


def test_line_errors_go_to_the_error_file(sim):
    client = client_for(sim)
    lines = [chat_line(f"r{i}", f"q{i}") for i in range(5)]
    lines.append({**chat_line("bad-model", "x"), "body": {"model": MODEL, "messages": "nope"}})
    sim.script_batch_lines(500, 200, 429)
    batch = submit(client, lines)
    sim.complete_batches()
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 6, "completed": 3, "failed": 3}
    ok = read_jsonl(client, batch.output_file_id)
    failed = read_jsonl(client, batch.error_file_id)
    assert [r["custom_id"] for r in ok] == ["r1", "r3", "r4"]
    assert [(r["custom_id"], r["response"]["status_code"]) for r in failed] == [
        ("r0", 500), ("r2", 429), ("bad-model", 400)]
    assert failed[0]["response"]["body"]["error"]["type"] == "InternalServerError"
    assert all(r["error"] is None for r in failed)
    stats = sim.stats()["batches"]
    assert stats["lines_by_status"] == {"500": 1, "200": 3, "429": 1, "400": 1}
    assert stats["line_script_pending"] == 0


def test_error_rate_is_seeded(sim):
    client = client_for(sim)
    lines = [chat_line(f"r{i}", f"q{i}") for i in range(400)]

    def failures() -> list[str]:
        sim.configure(batch_line_error_rate=0.05, seed=11)
        batch = submit(client, lines)
        sim.complete_batches()
        return [r["custom_id"] for r in read_jsonl(
            client, client.batches.retrieve(batch.id).error_file_id)]

    first = failures()
    assert first == failures() and 8 <= len(first) <= 35


def test_expiry_keeps_the_answered_lines(sim):
    client = client_for(sim)
    lines = [chat_line(f"r{i}", f"q{i}") for i in range(10)]
    sim.configure(batch_expire_after_fraction=0.5)
    batch = submit(client, lines)
    sim.complete_batches()
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "expired" and batch.expired_at is not None
    assert [r["custom_id"] for r in read_jsonl(client, batch.output_file_id)] == [
        f"r{i}" for i in range(5)]
    expired = read_jsonl(client, batch.error_file_id)
    assert [r["custom_id"] for r in expired] == [f"r{i}" for i in range(5, 10)]
    assert all(r["response"] is None and r["error"]["code"] == "batch_expired" for r in expired)
    assert batch.request_counts.model_dump() == {"total": 10, "completed": 5, "failed": 0}

    sim.configure(batch_expire_after_fraction=None)  # and on demand, mid-way
    batch = submit(client, lines)
    sim.advance_batches()
    sim.advance_batches(lines=3)
    (expired_now,) = sim.expire_batches(batch.id)
    assert expired_now["status"] == "expired"
    batch = client.batches.retrieve(batch.id)
    assert len(read_jsonl(client, batch.output_file_id)) == 3
    assert len(read_jsonl(client, batch.error_file_id)) == 7
    assert sim.stats()["batches"]["lines_expired"] == 12


def test_cancel_keeps_partial_output(sim):
    client = client_for(sim)
    batch = submit(client, [chat_line(f"r{i}", f"q{i}") for i in range(6)])
    sim.advance_batches()
    sim.advance_batches(lines=4)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    sim.advance_batches(lines=2)  # a cancelling batch answers nothing more
    assert client.batches.retrieve(batch.id).request_counts.completed == 4
    sim.advance_batches()
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    assert [r["custom_id"] for r in read_jsonl(client, batch.output_file_id)] == [
        "r0", "r1", "r2", "r3"]
    assert batch.error_file_id is None
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")


def test_resubmission_shows_in_line_duplicates(sim):
    client = client_for(sim)
    lines = [chat_line(f"r{i}", f"q{i}") for i in range(4)]
    submit(client, lines)
    submit(client, lines)  # a client that lost track of its first batch
    sim.complete_batches()
    batches = sim.stats()["batches"]
    assert (batches["batches_created"], batches["lines_answered"],
            batches["line_duplicates"]) == (2, 8, 4)


def test_list_is_newest_first_and_pages(sim):
    client = client_for(sim)
    ids = [submit(client, [chat_line("a", f"{i}")]).id for i in range(3)]
    newest = [b.id for b in client.batches.list(limit=100)][:3]
    assert newest == ids[::-1]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[:0:-1] and first.has_more
    second = client.batches.list(limit=2, after=first.data[-1].id)
    assert second.data[0].id == ids[0]
    assert [b.id for b in client.batches.list(limit=2)][:3] == ids[::-1]  # auto-paging
    sim.complete_batches()


@pytest.mark.slow
def test_time_driven_lifecycle():
    with SimulatedEndpoint(batch_stage_s=0.05) as sim:
        sim.configure(batch_in_progress_s=0.6)
        client = client_for(sim)
        batch = submit(client, [chat_line(f"r{i}", f"q{i}") for i in range(200)])
        seen = []
        while batch.status not in ("completed", "failed"):
            seen.append((batch.status, batch.request_counts.completed))
            time.sleep(0.02)
            batch = client.batches.retrieve(batch.id)
        statuses = [status for status, _ in seen]
        assert statuses[0] == "validating" and "in_progress" in statuses
        assert any(0 < done < 200 for status, done in seen if status == "in_progress")
        assert batch.request_counts.completed == 200
        assert batch.completed_at - batch.created_at <= 5


def test_other_endpoints_in_batches():
    with SimulatedEndpoint(embedding_models=("sim-embed",), embedding_dimensions=8) as sim:
        client = client_for(sim)
        embed = [{"custom_id": "e1", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": "sim-embed", "input": ["one", "two"]}}]
        legacy = [{"custom_id": "c1", "method": "POST", "url": "/v1/completions",
                   "body": {"model": MODEL, "prompt": "abcdefgh", "max_tokens": 2}}]
        ids = [submit(client, embed, "/v1/embeddings").id,
               submit(client, legacy, "/v1/completions").id]
        done = [wait_for(client, batch_id) for batch_id in ids]
        vectors = read_jsonl(client, done[0].output_file_id)[0]["response"]["body"]["data"]
        online = client.embeddings.create(model="sim-embed", input=["one", "two"],
                                          encoding_format="float")
        assert [v["embedding"] for v in vectors] == [d.embedding for d in online.data]
        text = read_jsonl(client, done[1].output_file_id)[0]["response"]["body"]
        assert text["choices"][0]["text"] == "[sim] ab"
        with pytest.raises(openai.BadRequestError):
            client.batches.create(input_file_id=done[0].input_file_id,
                                  endpoint="/v1/moderations", completion_window="24h")
        with pytest.raises(openai.BadRequestError):
            client.batches.create(input_file_id=done[0].input_file_id, endpoint=CHAT,
                                  completion_window="1h")


class Refusal(ValueError):
    status_code = 422
    error_type = "invalid_request_error"
    code = "unsupported_task"


class Picky(EchoResponder):
    """Refuses prompts containing "refuse"; crashes on "crash"; echoes the rest (MODEL)."""

    def respond(self, model, messages, params) -> str:
        prompt = messages[-1]["content"]
        if "refuse" in prompt:
            raise Refusal(f"cannot do {prompt!r}")
        if "crash" in prompt:
            raise KeyError("bug")
        return prompt


def test_responder_refusals_answer_their_status_online_and_in_batches():
    with SimulatedEndpoint(responder=Picky()) as sim:
        client = client_for(sim)
        with pytest.raises(openai.UnprocessableEntityError) as info:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                                   "content": "refuse me"}])
        assert info.value.body == {"message": "cannot do 'refuse me'", "param": None,
                                   "type": "invalid_request_error", "code": "unsupported_task"}
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                                   "content": "crash"}])
        assert "responder failed: KeyError" in info.value.message
        batch = submit(client, [chat_line("a", "fine"), chat_line("b", "refuse this"),
                                chat_line("c", "crash")])
        batch = wait_for(client, batch.id)
        failed = {r["custom_id"]: r["response"] for r in read_jsonl(client, batch.error_file_id)}
        assert failed["b"]["status_code"] == 422
        assert failed["b"]["body"]["error"]["code"] == "unsupported_task"
        assert failed["c"]["status_code"] == 500
        assert [r["custom_id"] for r in read_jsonl(client, batch.output_file_id)] == ["a"]
        assert sim.stats()["by_status"] == {"422": 1, "500": 1}
