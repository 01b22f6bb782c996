"""The library against a real vLLM (see conftest): what the simulator stands in for elsewhere,
here answered by vLLM's own engine, scheduler, OpenAI server and structured decoding."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import textwrap

import jsonschema
import pandas as pd
import pytest

from dagster_batchllm.core import InferenceClient
from dagster_batchllm.semantic import Cascade
from dagster_batchllm.testing import RISK_LEVEL_SCHEMA, wait_until

from .conftest import MAX_MODEL_LEN, ORACLE, PRICES, PROXY

pytestmark = pytest.mark.timeout(900)

COMPLAINTS = [
    "The parcel arrived two weeks late and the box was crushed.",
    "I was charged twice for the same order and nobody answers my e-mails.",
    "Thanks, the replacement phone works perfectly.",
    "The store closed early and I could not pick up my order.",
    "Your app logs me out every time I open the basket.",
    "Great service at the Fairview store, the staff were kind.",
    "I want a refund for the broken lamp, order 4411.",
    "The delivery driver left the fridge in the rain.",
]


def _rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({"text": [f"{COMPLAINTS[i % len(COMPLAINTS)]} (ticket {i})"
                                  for i in range(n)]})


def test_rows_are_answered_and_the_server_reports_usage(vllm_resource):
    result = vllm_resource.infer(_rows(16), prompt="Reply to the customer: {text}", model=PROXY,
                                 output_column="reply", max_tokens=24, temperature=0.0)
    assert result.df["reply_error"].isna().all(), result.df["reply_error"].dropna().tolist()
    assert result.df["reply"].str.len().gt(0).all()
    records = vllm_resource.ledger.records()
    assert (records["status"] == "ok").sum() == 16
    assert (records["prompt_tokens"] > 0).all() and (records["completion_tokens"] > 0).all()
    assert (records["completion_tokens"] <= 24).all()
    assert result.stats.tokens_by_model[PROXY]["prompt_tokens"] == records["prompt_tokens"].sum()


def test_json_schema_output_through_vllms_structured_decoding_is_valid_for_every_row(
        vllm_settings):
    with InferenceClient(vllm_settings()) as client:
        result = client.infer(_rows(20), system="Rate the customer's risk of leaving.",
                              prompt="{text}", model=PROXY, output_column="rating",
                              response_format=RISK_LEVEL_SCHEMA, max_tokens=96,
                              temperature=0.0)
        assert result.df["rating_error"].isna().all(), result.df["rating_error"].dropna()
        for value in result.df["rating"]:
            jsonschema.validate(value, RISK_LEVEL_SCHEMA)
        for raw in client.ledger.records()["response"]:
            jsonschema.validate(json.loads(raw), RISK_LEVEL_SCHEMA)


def test_a_cascade_reads_the_proxys_confidence_from_vllms_logprobs(vllm_settings):
    # 60 rows, a sample of 20 (at most a third of them): with exact bounds at the default
    # delta, 20 agreeing labels vouch for the proxy on every row at a target of 0.8
    rows = _rows(60)
    cascade = Cascade(proxy=PROXY, oracle=ORACLE, sample=20, target_precision=0.8,
                      target_recall=0.8)
    with InferenceClient(vllm_settings()) as client:
        labelled = client.classify(rows, labels=["refund", "delivery", "other"], column="text",
                                   cascade=cascade)
        report = labelled.cascade
        assert report.rows == 60 and report.sample_size == 20 and report.warning is None
        records = client.ledger.records()
        proxied = records[records["model"] == PROXY]
        assert len(proxied) == 60
        assert (proxied["status"] == "ok").all(), proxied["error"].dropna().tolist()
        for raw in proxied["response"]:
            stored = json.loads(raw)
            # Each reply keeps vLLM's tokens and their logprobs: the proxy's confidence.
            assert stored["logprobs"], stored
            assert all(logprob <= 0.0 for _, logprob in stored["logprobs"])
        # One model under two names answers the sample alike: the threshold trusts the proxy,
        # so the oracle (10x the price) answers fewer rows than all.
        assert report.sample_precision == 1.0, report
        assert report.oracle_rows < report.rows, report
        assert 0 < report.proxy_cost_usd < report.oracle_only_cost_usd


def test_a_shared_prefix_is_cached_by_vllm_and_priced_as_cached(vllm_settings):
    policy = " ".join(f"Rule {i}: answer politely, name the order, never promise a date."
                      for i in range(60))  # about 1,000 tokens, the same for every row
    with InferenceClient(vllm_settings()) as client:
        result = client.infer(_rows(12), system=policy, prompt="{text}", model=PROXY,
                              output_column="reply", max_tokens=8, temperature=0.0)
        assert result.df["reply_error"].isna().all()
        records = client.ledger.records()
    assert result.stats.cached_tokens > 0.5 * records["prompt_tokens"].sum(), result.stats
    price = PRICES[PROXY]
    for record in records.itertuples():
        assert record.cached_tokens <= record.prompt_tokens
        assert record.cost_usd == pytest.approx(price.cost(
            int(record.prompt_tokens), int(record.completion_tokens),
            int(record.cached_tokens)))
    uncached = sum(price.cost(int(r.prompt_tokens), int(r.completion_tokens))
                   for r in records.itertuples())
    assert result.stats.cost_usd < 0.6 * uncached


def test_a_row_longer_than_the_context_fails_alone(vllm_settings):
    rows = _rows(6)
    rows.loc[3, "text"] = " ".join(["refund"] * 3000)  # about 3,000 tokens > 2,048
    with InferenceClient(vllm_settings()) as client:
        result = client.infer(rows, prompt="{text}", model=PROXY, output_column="reply",
                              max_tokens=8, temperature=0.0)
    errors = result.df["reply_error"]
    assert errors.drop(index=3).isna().all(), errors.tolist()
    assert result.error_types[3] in ("context_length_exceeded", "invalid_input"), errors[3]
    assert str(MAX_MODEL_LEN) in errors[3] or "context" in errors[3]


def _exact_prompt_tokens(endpoint, messages: list[dict]) -> int:
    """vLLM's own count of a chat request's prompt (its /tokenize route)."""
    host, port = endpoint.base_url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/tokenize", json.dumps({"model": PROXY, "messages": messages}),
                       {"Content-Type": "application/json"})
    reply = json.loads(connection.getresponse().read())
    connection.close()
    return reply["count"]


def test_the_plan_counts_prompts_at_vllms_tokenize_beside_its_calibrated_estimate(
        vllm_settings, vllm_endpoint):
    """A managed vLLM offers /tokenize (tokenize_route): plan() has it count the prompts with
    Gemma's own tokenizer and chat template, and keeps its calibrated figure beside; both
    are measured against the server's count of the same requests, asked here directly."""
    assert vllm_endpoint.tokenize_route
    system = "Classify the customer's message."
    seen, new = _rows(24), _rows(48).iloc[24:]
    with InferenceClient(vllm_settings()) as client:
        client.infer(seen, system=system, prompt="{text}", model=PROXY, output_column="c",
                     max_tokens=4, temperature=0.0, scope="triage")
        plan = client.plan(new, system=system, prompt="{text}", model=PROXY,
                           output_column="c", max_tokens=4, temperature=0.0, scope="triage")
        paid = client.infer(new, system=system, prompt="{text}", model=PROXY,
                            output_column="c", max_tokens=4, temperature=0.0,
                            scope="triage").stats
    exact = sum(_exact_prompt_tokens(vllm_endpoint, [
        {"role": "system", "content": system}, {"role": "user", "content": text}])
        for text in new["text"])
    forecast = plan.by_model[PROXY]
    assert forecast["calibrated"] and forecast["server_counted"] == len(new), forecast["basis"]
    print(f"plan: {plan.input_tokens} prompt tokens counted by vLLM's /tokenize, "
          f"{forecast['calibrated_input_tokens']} calibrated, {exact} asked directly, "
          f"{paid.prompt_tokens} billed ({forecast['basis']})")
    assert plan.input_tokens == exact == paid.prompt_tokens
    assert forecast["calibrated_input_tokens"] == pytest.approx(exact, rel=0.15)


STOPPED_CHILD = textwrap.dedent("""
    import sys
    import pandas as pd
    from dagster_batchllm.core import EndpointSpec, InferenceClient, InferenceSettings

    url, store_url, model = sys.argv[1:4]
    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="vllm", base_url=url, models=(model,), max_concurrency=4),),
        store_url=store_url, progress_interval_s=3600.0, request_timeout_s=300.0)
    rows = pd.DataFrame({"text": [f"Write a long story about ticket {i}." for i in range(40)]})
    InferenceClient(settings).infer(rows, prompt="{text}", model=model, output_column="o",
                                    max_tokens=48, temperature=0.0)
""")


def _served(endpoint) -> float:
    """Requests vLLM finished since it started (its Prometheus counter)."""
    host, port = endpoint.base_url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_a_stopped_run_then_a_rerun_pay_for_no_row_twice(vllm_settings, vllm_endpoint,
                                                         tmp_path):
    store_url = f"sqlite:///{tmp_path / 'stopped.db'}"
    served_before = _served(vllm_endpoint)
    child = subprocess.Popen([sys.executable, "-c", STOPPED_CHILD, vllm_endpoint.base_url,
                              store_url, PROXY], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    settings = vllm_settings(store_url=store_url)
    with InferenceClient(settings) as watcher:
        def answered() -> int:
            records = watcher.ledger.records()
            return int((records["status"] == "ok").sum()) if len(records) else 0

        wait_until(lambda: answered() >= 8 or child.poll() is not None, 600, "8 answers")
        assert child.poll() is None, child.communicate()[0].decode()[-3000:]
        child.send_signal(signal.SIGINT)
        child.wait(timeout=120)
        before = answered()
    rows = pd.DataFrame({"text": [f"Write a long story about ticket {i}." for i in range(40)]})
    with InferenceClient(settings) as client:
        rerun = client.infer(rows, prompt="{text}", model=PROXY, output_column="o",
                             max_tokens=48, temperature=0.0)
    assert rerun.df["o_error"].isna().all()
    assert rerun.stats.cached == before  # the ledger answered what the stopped run paid for
    assert rerun.stats.requests == 40 - before
    # At the server: every row once, and at most the 4 in flight at the signal again.
    assert 40 <= _served(vllm_endpoint) - served_before <= 40 + 4
