"""Result files read in blocks: an answer read in Arrow is the one the per-line reader gives,
and every line Arrow does not read is left to it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagster_batchllm.core.delivery.batch_api.lines import chat_answer_block, line_blocks
from dagster_batchllm.core.delivery.batch_api.openai import OpenAIBatchProtocol
from dagster_batchllm.core.delivery.transport import completion_from_payload
from dagster_batchllm.core.errors import RowError
from dagster_batchllm.core.settings import EndpointSpec

PROTOCOL = OpenAIBatchProtocol(EndpointSpec(name="sim", base_url="http://127.0.0.1:9",
                                            models=("m",), batch_api=True))
texts = st.text(max_size=30)


def _bodies(odd: bool | None):
    """Reply bodies; ``odd``: with fields of types that vary between lines (a boolean or a
    float for a count, a list of parts for the text), which Arrow cannot read as one column;
    None: the usual shape only (a message with its text, or a null; counts or none)."""
    tokens = st.none() | st.integers(0, 10**6)
    content = st.none() | texts | st.just("   ")
    if odd is None:
        return st.fixed_dictionaries({"id": st.just("chatcmpl-1"), "choices": st.tuples(
            st.fixed_dictionaries({"index": st.just(0), "message": st.fixed_dictionaries(
                {"role": st.just("assistant"), "content": content}),
                "finish_reason": st.none() | st.just("stop")})).map(list)}, optional={
            "usage": st.fixed_dictionaries({"prompt_tokens": tokens,
                                            "completion_tokens": tokens})})
    if odd:
        tokens = tokens | st.booleans() | st.just(3.0)
        content = content | st.just([{"type": "text", "text": "x"}])
    usage = st.none() | st.fixed_dictionaries({}, optional={
        "prompt_tokens": tokens, "completion_tokens": tokens, "total_tokens": tokens})
    message = st.none() | st.fixed_dictionaries({"role": st.just("assistant")},
                                                optional={"content": content})
    choice = st.fixed_dictionaries({"index": st.just(0)}, optional={
        "message": message, "finish_reason": st.none() | st.sampled_from(["stop", "length"]),
        "text": texts})
    return st.fixed_dictionaries(
        {"id": st.just("chatcmpl-1"), "object": st.just("chat.completion")},
        optional={"choices": st.lists(choice, max_size=2), "usage": usage})


@st.composite
def result_lines(draw, odd: bool | None):
    key = draw(st.text("0123456789abcdef", min_size=8, max_size=8))
    kind = draw(st.sampled_from(["answered"] * 6 + ["status", "error"]))
    if kind == "error":
        return {"id": "r", "custom_id": key, "response": None,
                "error": {"code": draw(st.sampled_from(["batch_expired", "server_error"])),
                          "message": "no answer"}}
    status = 200 if kind == "answered" else draw(st.sampled_from([429, 500, 400]))
    return {"id": "r", "custom_id": key, "response": {
        "status_code": status, "request_id": "q",
        "body": draw(_bodies(odd)) if status == 200 else {
            "error": {"message": "rate limited", "type": "rate_limit"}}}, "error": None}


def _per_line(raw: bytes):
    """A line's (key, text, prompt and completion tokens, finish reason, cached tokens) as the
    per-line reader reads it; None where it is no answer."""
    result = PROTOCOL._read_line(raw)
    if result.error is not None:
        return None
    try:
        answer = completion_from_payload(result.reply, endpoint="sim", latency_s=0.0)
    except RowError:
        return None
    return (result.request_key, answer.content, answer.prompt_tokens,
            answer.completion_tokens, answer.finish_reason, answer.cached_tokens)


def chat_answers(raws: list[bytes]) -> list[tuple | None]:
    """Each line's answer as chat_answer_block reads it, in that shape; None for the lines
    it leaves to the per-line reader (every line after the block's answers are placed)."""
    block, others = chat_answer_block(raws)
    answers: list[tuple | None] = [None] * len(raws)
    if block is None:
        assert others == list(range(len(raws)))
        return answers
    rest = set(others)
    assert len(rest) == len(others) and len(others) + len(block.keys) == len(raws)
    read = iter(zip(*block, strict=True))
    for i in range(len(raws)):
        if i not in rest:
            answers[i] = next(read)
    return answers


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True)
@given(lines=st.sampled_from([None, False, True]).flatmap(
    lambda odd: st.lists(result_lines(odd), min_size=1, max_size=12)))
def test_an_answer_read_in_arrow_is_the_per_line_readers(lines):
    raws = [json.dumps(line).encode() for line in lines]
    for raw, fast in zip(raws, chat_answers(raws), strict=True):
        if fast is not None:  # else the per-line reader reads it, as before
            assert fast == _per_line(raw)


def test_the_usual_answers_are_all_read_in_arrow():
    def line(i, content):
        return json.dumps({"id": f"r{i}", "custom_id": f"key{i}", "response": {
            "status_code": 200, "request_id": "q", "body": {
                "id": "c", "object": "chat.completion", "model": "m", "choices": [{
                    "index": 0, "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 10 + i, "completion_tokens": i,
                          "total_tokens": 10 + 2 * i,
                          # a prompt cache's hits where the server reports them (vLLM, OpenAI)
                          **({"prompt_tokens_details": {"cached_tokens": i % 7}}
                             if i % 3 else {})}}}, "error": None}).encode()

    raws = [line(i, f"answer {i} \u00e9\U0001F600 \"quoted\"\n") for i in range(50)]
    raws.insert(7, json.dumps({"id": "e", "custom_id": "failed", "response": {
        "status_code": 500, "request_id": "q", "body": {"error": {"message": "boom"}}},
        "error": None}).encode())
    answers = chat_answers(raws)
    assert answers[7] is None and PROTOCOL._read_line(raws[7]).error is not None
    read = [a for a in answers if a is not None]
    assert len(read) == 50
    assert read == [_per_line(raw) for raw in raws if raw != raws[7]]
    assert sum(answer[-1] for answer in read) > 0  # the cached tokens, read in Arrow too


def test_a_block_arrow_cannot_read_is_left_to_the_per_line_reader():
    ok = {"custom_id": "a", "response": {"status_code": 200, "body": {
        "choices": [{"message": {"content": "fine"}}]}}}
    odd = {"custom_id": "b", "response": {"status_code": 200, "body": {
        "choices": [{"message": {"content": {"not": "text"}}}]}}}
    raws = [json.dumps(ok).encode(), json.dumps(odd).encode(), b"not json"]
    assert chat_answers(raws) == [None, None, None]


def test_blocks_cut_at_any_chunk_boundary_keep_every_line():
    data = b"".join(b'{"n": %d}\n' % i for i in range(25)) + b"\n  \n" + b'{"n": 25}'
    for size in (1, 7, 64, len(data)):
        chunks = [data[i:i + size] for i in range(0, len(data), size)]
        blocks = list(line_blocks(chunks, block_lines=10))
        assert [len(b) for b in blocks] == [10, 10, 6]
        assert [json.loads(x)["n"] for b in blocks for x in b] == list(range(26))
