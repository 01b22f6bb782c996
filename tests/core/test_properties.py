"""Property tests: whatever the prompt template and whatever the cells hold, ``infer`` returns.

Cells: unicode, emoji, NUL bytes, lone surrogates, braces, very long text, None/NaN/NaT, numbers,
bytes (UTF-8 or not), odd objects. Templates: literal text with escaped braces around column
fields, with conversions, format specs, attribute and index lookups. For every generated table
the call either raises ``InferenceConfigError`` before sending anything (a template mistake), or
returns one row per input row, same index and order, each row answered with exactly what the
server said for *that* row or given a clear ``<error_type>: <reason>``.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dagster_batchllm import ErrorType, InferenceConfigError
from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
MAX_TOKENS = 64
CODES = {e.value for e in ErrorType} | {"internal_error"}
COLUMNS = ("a", "b", "c")
PROPERTY_SETTINGS = settings(
    max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def client():
    with SimulatedEndpoint(models=(MODEL,)) as sim:
        settings_ = InferenceSettings(
            endpoints=(EndpointSpec(name="sim", base_url=sim.base_url, models=(MODEL,),
                                    max_concurrency=16),),
            store_url=None, request_timeout_s=10.0, retry_initial_backoff_s=0.01,
            retry_max_backoff_s=0.05, progress_interval_s=3600.0,
        )
        with InferenceClient(settings_) as client_:
            yield client_


# -- what can be in a cell ---------------------------------------------------------------------

texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=40),  # any valid code point
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
            min_size=1, max_size=3),  # lone surrogates
    st.sampled_from(["😀👍🏽", "\x00", "a\x00b", "{}", "{a}", "{{b}}", "}{", "{0}", "%s",
                     "   ", "\t\n", "", "ﬁ", "e\u0301", "\u202e RTL", "\ufeff", "null", "NaN"]),
    st.builds(lambda ch, n: ch * n, st.sampled_from(["x", "é", "😀", "{", " y"]),
              st.integers(1000, 20_000)),  # very long cells
)
cells = st.one_of(
    texts,
    st.none(),
    st.just(float("nan")),
    st.just(pd.NaT),
    st.just(np.nan),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.binary(max_size=20),  # UTF-8 or not
    st.builds(lambda t: t.encode("utf-8", "surrogatepass"), texts),
    st.sampled_from([np.int64(7), np.float32(1.5), np.bool_(True), pd.Timestamp("2024-01-01"),
                     [1, 2], {"k": "v"}, (1,), Exception("boom"), object(), b"\xff\xfe"]),
)

# -- what can be in a template -------------------------------------------------------------------

literal = st.text(max_size=12).map(lambda t: t.replace("{", "{{").replace("}", "}}"))
field = st.tuples(
    st.sampled_from(COLUMNS),
    st.sampled_from(["", "!r", "!s", "!a", ":>5", ":.3", ":d", ":x", ":^{w}", ".upper",
                     "[0]", "[1]", "[k]", "!z", ":{a}"]),
).map(lambda t: "{" + t[0] + t[1] + "}")
templates = st.one_of(
    st.lists(st.one_of(literal, field), min_size=1, max_size=5).map("".join),
    st.sampled_from(["{a}", "Summarize: {a}", "{a} vs {b} ({c})", "{{a}} is literal: {a}",
                     "{", "}", "{}", "{0}", "{a", "a}", "{ a }", "{a.b.c}", "{missing}"]),
)


def frames(min_rows=1, max_rows=6):
    def build(rows):
        df = pd.DataFrame(rows, columns=list(COLUMNS), dtype=object)
        df.index = pd.Index([f"k{i * 7 % 11}-{i}" for i in range(len(df))], name="key")
        return df

    return st.lists(st.tuples(cells, cells, cells), min_size=min_rows,
                    max_size=max_rows).map(build)


# -- the property ------------------------------------------------------------------------------

def expected_answer(prompt: str) -> str:
    """What the simulated echo server answers for one user message (see EchoResponder)."""
    reply = "[sim] " + re.sub(r"\s+", " ", prompt).strip()
    if (len(reply) + 3) // 4 > MAX_TOKENS:
        reply = reply[: MAX_TOKENS * 4]
    return reply


def rendered(template: str, row: pd.Series) -> str | None:
    """The prompt a row should produce when every cell it uses is plain non-blank text."""
    values = {}
    for column in COLUMNS:
        value = row[column]
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if isinstance(value, bool | int | float | np.generic) and not (
                isinstance(value, float) and math.isnan(value)):
            value = str(value)
        values[column] = value
    try:
        text = template.format_map(values)
    except Exception:
        return None
    return text


def check_result(df: pd.DataFrame, template: str, result) -> None:
    out = result.df
    assert len(out) == len(df)
    assert out.index.equals(df.index)
    assert list(out.columns[: len(COLUMNS)]) == list(COLUMNS)
    answered = failed = 0
    for (_, row), value, error in zip(df.iterrows(), out["out"], out["out_error"], strict=True):
        if error is None:
            answered += 1
            assert isinstance(value, str) and value.startswith("[sim]"), (value, error)
            prompt = rendered(template, row)
            if prompt is not None:  # the reply is this row's, not another's
                assert value == expected_answer(prompt)
        else:
            failed += 1
            assert value is None
            code, sep, reason = error.partition(": ")
            assert sep and code in CODES and reason.strip(), error
            assert not error.startswith("internal_error"), error
    assert result.stats.succeeded == answered and result.stats.failed == failed
    assert result.stats.deferred == 0


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(df=frames(), template=templates)
def test_any_template_over_any_cells_answers_or_explains_every_row(client, df, template):
    try:
        result = client.infer(df, prompt=template, model=MODEL, output_column="out",
                              max_tokens=MAX_TOKENS)
    except InferenceConfigError as exc:
        assert str(exc)  # a template mistake, said before any request
        return
    check_result(df, template, result)


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(df=frames())
def test_any_cell_as_the_whole_prompt_is_answered_or_explained(client, df):
    result = client.infer(df, prompt_column="a", model=MODEL, output_column="out",
                          max_tokens=MAX_TOKENS)
    check_result(df, "{a}", result)


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(df=frames(), system=templates)
def test_any_system_template_is_answered_explained_or_refused(client, df, system):
    try:
        result = client.infer(df, prompt="Q: {a}", system=system, model=MODEL,
                              output_column="out", max_tokens=MAX_TOKENS)
    except InferenceConfigError as exc:
        assert str(exc)
        return
    # The echo answers the user message; the system prompt only has to render or fail cleanly.
    check_result(df, "Q: {a}", result)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(values=st.lists(cells, min_size=1, max_size=4))
def test_cells_in_a_messages_column_are_answered_or_explained(client, values):
    df = pd.DataFrame({"m": [[{"role": "user", "content": v}] for v in values]
                       + [v for v in values]}, dtype=object)
    assume(len(df) > 0)
    result = client.infer(df, messages_column="m", model=MODEL, output_column="out",
                          max_tokens=MAX_TOKENS)
    out = result.df
    assert len(out) == len(df) and out.index.equals(df.index)
    for value, error in zip(out["out"], out["out_error"], strict=True):
        assert (error is None and isinstance(value, str)) or (
            value is None and error.split(": ", 1)[0] in CODES), (value, error)
