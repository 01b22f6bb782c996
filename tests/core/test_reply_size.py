"""Replies are read no further than their bound: a server that sends 50 MB for a request that
needs a few hundred bytes fails the row with ``response_too_large``, and memory and the ledger
stay small.

The simulated server's ``huge_reply_bytes`` pads every answer (streamed, with or without a
Content-Length: ``huge_reply_declared``) to that size.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.delivery.batch_api.lines import MAX_LINE_BYTES, line_blocks
from dagster_batchllm.core.delivery.reply_size import (
    CHAT_REPLY_CAP,
    ENVELOPE_BYTES,
    reply_limit,
)
from dagster_batchllm.core.requests import RowRequest
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.factories.error_kinds import kind_of
from dagster_batchllm.testing import SimulatedEndpoint

MODEL, EMBED = "sim-model", "sim-embed"
pytestmark = pytest.mark.timeout(120)


def _request(body: dict, max_tokens: int = 0, payload=None) -> RowRequest:
    return RowRequest("k", MODEL, json.dumps(body, separators=(",", ":"), sort_keys=True
                                             ).encode(), 0, 0, max_tokens, payload)


def test_each_request_has_the_bound_of_what_it_asks_for():
    chat = "/chat/completions"
    assert reply_limit(_request({"max_tokens": 16}, 16), chat) == ENVELOPE_BYTES + 16 * 64
    assert reply_limit(_request({"max_tokens": 512, "n": 3}, 512), chat) == (
        ENVELOPE_BYTES + 3 * 512 * 64)
    scored = _request({"logprobs": True, "max_tokens": 16, "top_logprobs": 2}, 16)
    assert reply_limit(scored, chat) == ENVELOPE_BYTES + 16 * (64 + 3 * 128)
    assert reply_limit(_request({"max_tokens": 1_000_000}, 1_000_000), chat) == CHAT_REPLY_CAP
    # A user's text cannot pose as a parameter: its quotes are escaped in the body.
    sneaky = _request({"max_tokens": 16, "messages": [{"content": '"n":999'}]}, 16)
    assert reply_limit(sneaky, chat) == ENVELOPE_BYTES + 16 * 64
    embeddings = "/embeddings"
    assert reply_limit(_request({"input": ["a", "b"]}, payload=[1, 2]), embeddings) == (
        ENVELOPE_BYTES + 2 * 8192 * 24)
    assert reply_limit(_request({"dimensions": 256, "input": ["a"]}, payload=[1]),
                       embeddings) == ENVELOPE_BYTES + 256 * 24
    assert reply_limit(_request({}, payload=(["f1"], [[1], [2], [3]])), "/invocations") == (
        ENVELOPE_BYTES + 3 * 64 * 1024)
    assert reply_limit(_request({"max_tokens": 16}, 16), chat, configured=10_000) == 10_000


def test_a_setting_below_1024_bytes_is_refused():
    endpoint = EndpointSpec(name="ep0", base_url="http://127.0.0.1:9/v1", models=(MODEL,))
    with pytest.raises(ValueError, match="max_reply_bytes must be at least 1024"):
        InferenceSettings(endpoints=(endpoint,), max_reply_bytes=100)


def test_response_too_large_is_not_retried_in_a_run_but_a_rerun_may_fix_it():
    assert kind_of("response_too_large").retryable
    assert "fix the endpoint or the call" in kind_of("response_too_large").advice


# -- online, against the server ----------------------------------------------------------

@pytest.fixture(scope="module")
def server():
    with SimulatedEndpoint(models=(MODEL,), embedding_models=(EMBED,),
                           embedding_dimensions=16) as sim:
        yield sim


@pytest.fixture
def huge(server):
    server.reset_stats()
    yield server
    server.configure(huge_reply_bytes=0, huge_reply_declared=True)


def _client(sim: SimulatedEndpoint, tmp_path: Path, **overrides) -> InferenceClient:
    return InferenceClient(InferenceSettings(
        endpoints=(EndpointSpec(name="ep0", base_url=sim.base_url, models=(MODEL,),
                                embedding_models=(EMBED,)),),
        store_url=f"sqlite:///{tmp_path / 'ledger.db'}", retry_initial_backoff_s=0.01,
        **overrides))


@pytest.mark.slow
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize("http_client", ["aiohttp", "openai"])
def test_a_reply_within_its_bound_is_read_and_one_past_it_is_refused(huge, tmp_path, declared,
                                                                    http_client):
    # 100 kB: past the 64 KiB every reply may have, within max_tokens=2000's 192 KiB.
    huge.configure(huge_reply_bytes=100_000, huge_reply_declared=declared)
    df = pd.DataFrame({"text": ["a", "b"]})
    with _client(huge, tmp_path, http_client=http_client) as client:
        read = client.infer(df, prompt="{text}", model=MODEL, output_column="out",
                            max_tokens=2000)
        refused = client.infer(df, prompt="{text}", model=MODEL, output_column="out",
                               max_tokens=16)
    with _client(huge, tmp_path, http_client=http_client, max_reply_bytes=50_000) as client:
        configured = client.infer(df.assign(text=["c", "d"]), prompt="{text}", model=MODEL,
                                  output_column="out", max_tokens=2000)

    assert read.stats.succeeded == 2 and len(read.df["out"].iloc[0]) > 99_000
    for result in (refused, configured):
        assert result.error_types.tolist() == ["response_too_large"] * 2
    error = refused.df["out_error"].iloc[0]
    assert "over the bound of 66,560 bytes" in error and "max_tokens=16" in error
    assert ("declared 100,000 bytes (Content-Length)" in error) == declared
    assert "set max_reply_bytes" in error
    assert "max_reply_bytes=50,000" in configured.df["out_error"].iloc[0]
    # Not retried: one request a row (and another for each of the first call's rows).
    assert huge.stats(log=False)["requests"] == 6


def test_an_embeddings_reply_is_bound_by_its_inputs(huge, tmp_path):
    # Three inputs of unnamed dimensions may take 64 KiB + 3 x 8,192 x 24 bytes (~654 kB).
    df = pd.DataFrame({"text": ["a", "b", "c"]})
    with _client(huge, tmp_path) as client:
        huge.configure(huge_reply_bytes=400_000)
        read = client.embed(df, input_column="text", model=EMBED, output_column="v")
        huge.configure(huge_reply_bytes=2_000_000)
        refused = client.embed(df.assign(text=["d", "e", "f"]), input_column="text",
                               model=EMBED, output_column="v")
    assert read.stats.succeeded == 3
    assert refused.error_types.tolist() == ["response_too_large"] * 3
    assert "3 inputs of 8192 dimensions" in refused.df["v_error"].iloc[0]


class _LongRefusal:
    """A responder whose refusal (a 400) carries a 1 MB message."""

    def models(self) -> list[str]:
        return [MODEL]

    def respond(self, model, messages, params):
        error = ValueError("no " * 350_000)
        error.status_code = 400
        raise error


def test_an_error_reply_is_read_to_64_kib_and_cut(tmp_path):
    with (SimulatedEndpoint(models=(MODEL,), responder=_LongRefusal()) as sim,
          _client(sim, tmp_path) as client):
        result = client.infer(pd.DataFrame({"text": ["a"]}), prompt="{text}", model=MODEL,
                              output_column="out")
    error = result.df["out_error"].iloc[0]
    assert result.error_types.tolist() == ["bad_request"]
    assert error.startswith("bad_request: HTTP 400") and len(error) < 1200


# -- memory and the ledger, measured in a process of their own ----------------------------

_MEASURE = textwrap.dedent('''
    import json, os, resource, sys, urllib.request
    import pandas as pd
    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

    base_url, folder = sys.argv[1], sys.argv[2]
    root = base_url.rsplit("/v1", 1)[0]

    def configure(**settings):
        request = urllib.request.Request(root + "/_sim/configure",
                                         data=json.dumps(settings).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request).read()

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def ledger_bytes(path):  # the ledger file and whatever lies beside it (journals)
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path)
                   for f in fs)

    clients, figures = {}, {}
    configure(huge_reply_bytes=0)
    for http_client in ("aiohttp", "openai"):  # warm up: every module, a session, the ledger
        ledger = os.path.join(folder, http_client)
        os.makedirs(ledger)
        clients[http_client] = client = InferenceClient(InferenceSettings(
            endpoints=(EndpointSpec(name="ep0", base_url=base_url, models=("sim-model",)),),
            store_url=f"sqlite:///{ledger}/ledger.db", http_client=http_client))
        warm = client.infer(pd.DataFrame({"text": [f"warm {i}" for i in range(16)]}),
                            prompt="{text}", model="sim-model", max_tokens=16)
        assert warm.stats.succeeded == 16
        figures[http_client] = {}
    start = peak_mb()
    for http_client, client in clients.items():
        for declared in (True, False):
            configure(huge_reply_bytes=50_000_000, huge_reply_declared=declared)
            df = pd.DataFrame({"text": [f"{http_client} {declared} {i}" for i in range(16)]})
            result = client.infer(df, prompt="{text}", model="sim-model", max_tokens=16)
            figures[f"{http_client}, declared={declared}"] = {
                "errors": result.error_types.tolist()}
        client.close()  # (its journal folded into the ledger)
        figures[http_client]["ledger_bytes"] = ledger_bytes(os.path.join(folder, http_client))
    figures["peak_before_mb"], figures["peak_growth_mb"] = start, peak_mb() - start
    print(json.dumps(figures))
''')


@pytest.mark.slow
def test_16_rows_answered_with_50_mb_bodies_keep_memory_and_the_ledger_small(tmp_path):
    with SimulatedEndpoint(models=(MODEL,)) as sim:
        done = subprocess.run([sys.executable, "-c", _MEASURE, sim.base_url, str(tmp_path)],
                              capture_output=True, text=True, timeout=100)
        assert done.returncode == 0, done.stderr[-3000:]
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        sent = sim.stats(log=False)["ok"]
    for phase in ("aiohttp, declared=True", "aiohttp, declared=False",
                  "openai, declared=True", "openai, declared=False"):
        assert figures[phase]["errors"] == ["response_too_large"] * 16, phase
    assert sent == 2 * 16 + 4 * 16  # the warm-ups', and each 50 MB reply once (no retry)
    assert figures["peak_growth_mb"] < 100, figures
    for http_client in ("aiohttp", "openai"):
        # the whole ledger (its 16 answers of the warm-up, the 32 failed rows): no reply kept
        assert figures[http_client]["ledger_bytes"] < 1_000_000, figures


# -- batch result lines --------------------------------------------------------------------

def test_a_result_line_past_its_bound_is_dropped_while_read():
    big = b'{"id":"r1","custom_id":"k1","response":{"body":"' + b"x" * (MAX_LINE_BYTES + 10)
    data = b'{"custom_id":"k0"}\n' + big + b'"}}\n{"custom_id":"k2"}\n' + big + b'"}}'
    for size in (999, 1 << 20, 8 << 20):
        chunks = [data[i:i + size] for i in range(0, len(data), size)]
        lines = [line for block in line_blocks(chunks, 2) for line in block]
        assert [json.loads(line)["custom_id"] for line in lines] == ["k0", "k1", "k2", "k1"]
        assert json.loads(lines[1])["batchllm_oversized"] == len(big) + 3
        assert max(len(line) for line in lines) < 100


def test_a_batch_line_past_its_bound_fails_its_row(tmp_path):
    with SimulatedEndpoint(models=(MODEL,)) as sim:
        sim.configure(huge_reply_bytes=MAX_LINE_BYTES + 100_000)
        settings = InferenceSettings(
            endpoints=(EndpointSpec(name="openai", base_url=sim.base_url, models=(MODEL,),
                                    batch_api=True),),
            store_url=f"sqlite:///{tmp_path / 'ledger.db'}", batch_poll_initial_s=0.02,
            batch_poll_max_s=0.1)
        with InferenceClient(settings) as client:
            result = client.infer(pd.DataFrame({"text": ["a", "b"]}), prompt="{text}",
                                  model=MODEL, output_column="out", mode="batch_api",
                                  wait=True)
    assert result.error_types.tolist() == ["response_too_large"] * 2
    assert "not kept" in result.df["out_error"].iloc[0]
    assert (tmp_path / "ledger.db").stat().st_size < 1_000_000
