"""A server that echoes the API key in its error text: the key is kept nowhere.

The simulated server's ``echo_credentials`` quotes the request's ``Authorization`` header and
the bare key in every error message (401, 400, 429 and the rest; a batch's errored lines and
refused calls too). Each test makes rows fail that way, with default settings, and then looks
for the key in everything the run kept: the result, every byte of the ledger's directory
(the SQLite file, its journals, the batch book) and the logs at DEBUG.
"""

from __future__ import annotations

import http.client
import json
import logging
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pandas as pd
import pytest

from dagster_batchllm.core.client import InferenceClient
from dagster_batchllm.core.errors import EndpointError, ErrorType, MalformedResponseError
from dagster_batchllm.core.redaction import FORMS_ONLY, MASK, Redactor, server_error
from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings
from dagster_batchllm.testing import SimulatedEndpoint

MODEL = "sim-model"
KEY = f"sk-test-{uuid.uuid4().hex}"
pytestmark = pytest.mark.timeout(60)


def assert_nowhere(key: str, *texts: object) -> None:
    for text in texts:
        data = text if isinstance(text, bytes) else str(text).encode()
        assert key.encode() not in data
        assert key[8:24].encode() not in data  # not even a recognisable piece of it


def every_file(root: Path) -> list[tuple[Path, bytes]]:
    files = [(path, path.read_bytes()) for path in sorted(root.rglob("*")) if path.is_file()]
    assert files
    return files


def logged(caplog) -> str:
    return "\n".join([caplog.text, *(repr(r.__dict__) for r in caplog.records)])


# -- the redaction step -------------------------------------------------------------------

def test_configured_keys_and_credential_forms_become_masks():
    redact = Redactor([KEY, None, ""])
    text = (f'{{"error": {{"message": "bad key {KEY}; headers: {{\\"Authorization\\": '
            f'\\"Bearer sk-proxy-777777\\", \\"x-api-key\\": \\"k-999999\\"}} '
            f"api-key: abc123 api_key=zzz999&next=1 Proxy-Authorization: Basic dXNlcjpw\"}}}}")
    clean = redact(text)
    for secret in (KEY, "sk-proxy-777777", "k-999999", "abc123", "zzz999", "dXNlcjpw"):
        assert secret not in clean
    assert f"bad key {MASK}" in clean and f'\\"Bearer {MASK}\\"' in clean
    assert "&next=1" in clean  # the value ends where the parameter does
    assert json.loads(clean)  # JSON's escapes are kept: the body still parses
    assert redact(clean) == clean  # masking twice changes nothing
    assert redact("HTTP 429: Rate limit reached, retry after 1 s") == (
        "HTTP 429: Rate limit reached, retry after 1 s")


def test_a_key_shorter_than_four_characters_is_not_looked_for():
    assert Redactor(["abc"])("abc abd") == "abc abd"
    assert Redactor(["abcd"])("abcd abd") == f"{MASK} abd"


def test_an_error_keeps_its_type_and_fields_with_its_message_masked():
    error = EndpointError(f"HTTP 401: key {KEY}", error_type=ErrorType.AUTHENTICATION,
                          status=401, retryable=False, endpoint="ep0")
    same = Redactor([KEY]).error(error)
    assert same is error and error.status == 401 and error.endpoint == "ep0"
    assert error.as_cell() == f"authentication_error: HTTP 401: key {MASK}"


def test_a_key_at_the_cut_of_a_long_body_goes_whole():
    # The server's message is kept up to 1,000 characters: a key that straddles the cut must
    # not leave its first half behind.
    body = json.dumps({"error": {"message": "x" * 990 + " " + KEY}})
    error = server_error(Redactor([KEY]), 400, body, endpoint="ep0")
    assert_nowhere(KEY, error.message)
    # A key the body holds JSON-escaped is masked once the message is read out of it.
    escaped = "".join(f"\\u{ord(c):04x}" for c in KEY)
    body = '{"error": {"message": "key ' + escaped + '"}}'
    assert KEY not in body and KEY in json.loads(body)["error"]["message"]
    assert_nowhere(KEY, server_error(Redactor([KEY]), 401, body, endpoint="ep0").message)
    assert FORMS_ONLY.describe(RuntimeError("Error code: 401 - Bearer abcdefgh")) == (
        f"RuntimeError: Error code: 401 - Bearer {MASK}")


# -- online -------------------------------------------------------------------------------

@pytest.fixture
def echoing():
    with SimulatedEndpoint(models=(MODEL,), api_key=KEY) as sim:
        sim.configure(echo_credentials=True)
        yield sim


def test_the_simulated_server_does_echo_the_key(echoing):
    url = urlsplit(echoing.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
    connection.request("POST", url.path + "/chat/completions", body=b"{}",
                       headers={"Authorization": f"Bearer {KEY}"})
    reply = connection.getresponse()
    assert reply.status == 404  # (no model named)
    assert KEY in reply.read().decode()  # so the tests below prove something


@pytest.mark.slow
@pytest.mark.parametrize("http_client", ["aiohttp", "openai"])
def test_a_key_echoed_in_401_400_and_429_bodies_is_kept_nowhere(echoing, tmp_path, caplog,
                                                                  http_client):
    caplog.set_level(logging.DEBUG)  # every logger, this library's among them
    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="ep0", base_url=echoing.base_url, models=(MODEL,),
                                api_key=KEY, max_concurrency=1),),
        store_url=f"sqlite:///{tmp_path / 'ledger' / 'ledger.db'}", http_client=http_client,
        max_retry_after_s=0.05, retry_initial_backoff_s=0.01, retry_max_backoff_s=0.05)
    (tmp_path / "ledger").mkdir()
    with InferenceClient(settings) as client:
        echoing.script(401, 400)
        refused = client.infer(pd.DataFrame({"text": ["a", "b"]}), prompt="{text}",
                               model=MODEL, output_column="out", max_tokens=16)
        # Every attempt answered 429: the row's last error is the 429's text, and the five
        # before it went through the retry loop (and its DEBUG lines).
        echoing.configure(error_rate_429=1.0)
        limited = client.infer(pd.DataFrame({"text": ["c"]}), prompt="{text}", model=MODEL,
                               output_column="out", max_tokens=16)
        echoing.configure(error_rate_429=0.0)
        answered = client.infer(pd.DataFrame({"text": ["d"]}), prompt="{text}", model=MODEL,
                                output_column="out", max_tokens=16)
        records = client.ledger.records()

    assert sorted(refused.error_types) == ["authentication_error", "bad_request"]
    assert limited.error_types.tolist() == ["rate_limited"]
    assert echoing.stats(log=False)["by_status"]["429"] == settings.max_attempts
    assert answered.error_types.tolist() == [None]
    result = pd.concat([refused.df, limited.df, answered.df])
    errors = result["out_error"].dropna().tolist()
    assert len(errors) == 3
    assert all(f"Authorization: Bearer {MASK}" in e and f"the key received: {MASK}" in e
               for e in errors)  # the server did quote it, and it was masked
    assert_nowhere(KEY, result.to_csv(), repr(limited.stats.as_dict()), records.to_csv(),
                   logged(caplog), *(data for _, data in every_file(tmp_path / "ledger")))


def test_a_reply_that_cannot_be_read_quotes_no_key(echoing, tmp_path):
    # 200 with a body that is not JSON and quotes the key at the cut of its quoted start.
    from dagster_batchllm.core.delivery.transport import json_reply

    raw = ("x" * 110 + " " + KEY + " and more").encode()  # the key across byte 120
    with pytest.raises(MalformedResponseError) as info:
        json_reply(raw, "ep0")
    assert KEY in info.value.message  # whole, not cut in the middle: so the mask finds it
    assert_nowhere(KEY, Redactor([KEY]).error(info.value).message)


# -- batch API ----------------------------------------------------------------------------

def _batch_client(sim: SimulatedEndpoint, tmp_path: Path, **overrides) -> InferenceClient:
    (tmp_path / "ledger").mkdir(exist_ok=True)
    return InferenceClient(InferenceSettings(
        endpoints=(EndpointSpec(name="openai", base_url=sim.base_url, models=(MODEL,),
                                api_key=KEY, batch_api=True),),
        store_url=f"sqlite:///{tmp_path / 'ledger' / 'ledger.db'}", batch_poll_initial_s=0.02,
        batch_poll_max_s=0.1, ledger_flush_interval_s=0.05, **overrides))


def test_batch_line_errors_refusals_and_failed_polls_that_echo_the_key_keep_it_nowhere(
        echoing, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    # Lines: a 401, a 400 and a 429 (which fails again when sent in a second batch).
    echoing.script_batch_lines(401, 400, 429, "ok", 429)
    # Calls: the upload and create go through; the first poll is refused (logged, polled again).
    echoing.script_batch_api("ok", "ok", 500)
    with _batch_client(echoing, tmp_path, max_attempts=2) as client:
        df = pd.DataFrame({"text": ["a", "b", "c", "d"]})
        lines = client.infer(df, prompt="{text}", model=MODEL, output_column="out",
                             mode="batch_api", wait=True)
        # A create refused with a 401 that quotes the key: every row of the file fails.
        echoing.script_batch_api("ok", 401)
        refused = client.infer(pd.DataFrame({"text": ["e", "f"]}), prompt="{text}",
                               model=MODEL, output_column="out", mode="batch_api", wait=True)
        records = client.ledger.records()

    assert lines.error_types.tolist() == ["authentication_error", "bad_request",
                                          "rate_limited", None]
    assert refused.error_types.tolist() == ["authentication_error"] * 2
    errors = [*lines.df["out_error"].dropna(), *refused.df["out_error"].dropna()]
    assert all(f"the key received: {MASK}" in e for e in errors)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("checked again at the next poll" in w and MASK in w for w in warnings)
    assert_nowhere(KEY, lines.df.to_csv(), refused.df.to_csv(), records.to_csv(),
                   logged(caplog), *(data for _, data in every_file(tmp_path / "ledger")))
