"""Request bodies and keys: the skeleton a call's rows are spliced into gives the same bytes
(so the same keys) as encoding each whole request canonically."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagster_batchllm.core.errors import InvalidInputError
from dagster_batchllm.core.tasks.chat.call import InferenceCall
from dagster_batchllm.core.tasks.chat.rendering import _Skeleton, iter_row_requests, make_request

# Any code point, lone surrogates included (they cannot be UTF-8: both ways must refuse them).
texts = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()),
                max_size=40)
params = st.fixed_dictionaries({"max_tokens": st.integers(1, 4096)}, optional={
    "temperature": st.floats(0, 2, allow_nan=False),
    "stop": st.lists(texts, max_size=2),
    "response_format": st.just({"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}),
})


def _whole(model, params, text, system):
    messages = [{"role": "user", "content": text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return make_request(model, messages, params, params["max_tokens"])


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True)
@given(model=texts, params=params, text=texts, system=st.none() | texts)
def test_a_spliced_body_is_the_canonical_encoding_of_the_whole_request(model, params, text,
                                                                         system):
    skeleton = _Skeleton.of(model, params, "a system template" if system is not None else None)
    assert skeleton is not None
    try:
        expected = _whole(model, params, text, system)
    except InvalidInputError as exc:
        with pytest.raises(InvalidInputError, match="not valid Unicode"):
            skeleton.request(text, system, params["max_tokens"])
        assert "not valid Unicode" in str(exc)
        return
    assert skeleton.request(text, system, params["max_tokens"]) == expected


def test_parameters_that_hold_the_placeholder_take_the_whole_encoding():
    from dagster_batchllm.core.tasks.chat.rendering import _PLACEHOLDER

    assert _Skeleton.of("m", {"max_tokens": 5, "stop": [_PLACEHOLDER]}, None) is None
    call = InferenceCall(prompt="Q: {q}", model="m", output_column="a",
                         generation_params={"stop": [_PLACEHOLDER]})
    [request] = iter_row_requests(iter([("why",)]), call, default_max_tokens=7)
    assert request == make_request("m", [{"role": "user", "content": "Q: why"}],
                                   {"stop": [_PLACEHOLDER], "max_tokens": 7}, 7)


def test_rows_of_a_call_get_the_keys_of_their_whole_requests():
    call = InferenceCall(prompt="Q: {q}", system="Answer as {who}", model_column="m",
                         output_column="a", temperature=0.0)
    rows = [("why \"now\"", "a bot", "model-a"), ("ünïcode \u2028 \x01", "a cat", "model-b"),
            ("why \"now\"", "a bot", "model-b")]
    got = list(iter_row_requests(iter(rows), call, default_max_tokens=64))
    for (q, who, model), request in zip(rows, got, strict=True):
        assert request == make_request(model, [
            {"role": "system", "content": f"Answer as {who}"},
            {"role": "user", "content": f"Q: {q}"}], {"temperature": 0.0, "max_tokens": 64}, 64)
    assert len({r.key for r in got}) == 3


# Cells as a table may hold them: text (blank, non-ASCII, surrogates), numbers, None, bytes.
cells = st.one_of(texts, st.sampled_from(["", "  ", "\n", "x"]), st.none(),
                  st.integers(-5, 5), st.floats(allow_nan=True), st.binary(max_size=4))
plain = texts.filter(lambda t: t and not t.isspace())  # the usual cell (surrogates included)
templates = st.sampled_from([
    "{a}", "Summarize: {a}", "{a} and {b}, {a} again", "{{literal}} {b}: {a}.", "Q: {a}\n{b}",
    "{a!r}", "{a:>5}", "no field at all", "ünï {b} \u2028"])


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True)
@given(template=templates, system=st.sampled_from([None, "You are terse.", "{{braces}}", " "]),
       as_text=st.booleans(), rows=st.one_of(st.lists(st.tuples(plain, plain), min_size=1,
                                                       max_size=6),
                                              st.lists(st.tuples(cells, cells), min_size=1,
                                                       max_size=6)))
def test_rows_rendered_a_block_at_a_time_are_the_rows_rendered_one_by_one(
        template, system, as_text, rows):
    """TextBlocks (the usual call's path) against the general path, row by row: the same
    requests, or the same errors where a row is off the usual case."""
    from dagster_batchllm.core.tasks.chat.rendering import _row_by_row

    call = InferenceCall(prompt=template, system=system, model="m", output_column="out",
                         cells_as_text=as_text, temperature=0.5)
    columns = call.input_columns()
    table = [tuple(row[["a", "b"].index(c)] for c in columns) for row in rows]
    got = list(iter_row_requests(iter(table), call, default_max_tokens=99))
    expected = list(_row_by_row(iter(table), call, default_max_tokens=99))
    assert [type(x) for x in got] == [type(x) for x in expected]
    assert [x if not isinstance(x, Exception) else str(x) for x in got] == [
        x if not isinstance(x, Exception) else str(x) for x in expected]


def test_a_block_with_one_row_off_the_usual_case_keeps_the_requests_of_the_others():
    from dagster_batchllm.core.tasks.chat.rendering import _BLOCK_ROWS, TextBlocks

    call = InferenceCall(prompt="Summarize: {text}", model="m", output_column="out")
    assert TextBlocks.of(call, 64) is not None  # the usual case takes the block path
    rows = [(f"call {i}",) for i in range(_BLOCK_ROWS + 10)]
    rows[5] = (None,)
    got = list(iter_row_requests(iter(rows), call, default_max_tokens=64))
    assert len(got) == len(rows)
    assert isinstance(got[5], InvalidInputError) and "null" in str(got[5])
    assert got[6] == make_request("m", [{"role": "user", "content": "Summarize: call 6"}],
                                  {"max_tokens": 64}, 64)
    assert got[-1] == make_request(
        "m", [{"role": "user", "content": f"Summarize: call {len(rows) - 1}"}],
        {"max_tokens": 64}, 64)
