"""Image parts in chat messages on the simulated endpoint, driven by the real openai client."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from dagster_batchllm.openai_server.images import IMAGE_TOKENS
from dagster_batchllm.openai_server.protocol import tokens
from dagster_batchllm.simulator.images import data_uri, png_bytes
from dagster_batchllm.testing import SimulatedEndpoint, openai_client, post_json

MODEL = "sim-model"
# Just the leading bytes a decoder checks first: enough for the simulator, which never decodes.
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x01" * 20
GIF = b"GIF89a\x01\x00\x01\x00" + b"\x00" * 20
WEBP = b"RIFF\x1a\x00\x00\x00WEBPVP8 " + b"\x00" * 20


client_for = openai_client


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def ask(client: openai.OpenAI, *parts, role: str = "user"):
    messages = [{"role": role, "content": list(parts)}]
    return client.chat.completions.create(model=MODEL, messages=messages)


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def short_sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:12]


def raw_chat(sim: SimulatedEndpoint, body: dict) -> tuple[int, dict]:
    status, reply = post_json(sim, "chat/completions", body)
    return status, json.loads(reply)


@pytest.fixture
def fresh(sim):
    sim.reset_stats()
    sim.configure(max_image_bytes=20 * 1024 * 1024)
    return sim


def test_reply_and_usage_follow_the_image_bytes(fresh):
    client = client_for(fresh)
    red, blue = png_bytes(2, 2, (255, 0, 0)), png_bytes(2, 2, (0, 0, 255))
    reply = ask(client, text("compare"), image_part(data_uri(red)), image_part(data_uri(blue)))
    content = reply.choices[0].message.content
    markers = f"[image sha256:{short_sha(red)}] [image sha256:{short_sha(blue)}]"
    assert content == f"[sim] compare {markers}"
    # Text parts' tokens + 4 for the message + 85 per image; the markers cost nothing.
    assert reply.usage.prompt_tokens == tokens("compare") + 4 + 2 * IMAGE_TOKENS
    again = ask(client, text("compare"), image_part(data_uri(red)), image_part(data_uri(blue)))
    assert again.choices[0].message.content == content
    images = fresh.stats()["images"]
    assert (images["requests"], images["images"], images["remote"]) == (2, 4, 0)
    assert images["bytes"] == 2 * (len(red) + len(blue))
    record = images["log"][0]
    assert record["status"] == 200 and record["prompt"].startswith("compare")
    assert record["sha256"] == [hashlib.sha256(red).hexdigest(), hashlib.sha256(blue).hexdigest()]


def test_every_supported_mime_type(fresh):
    client = client_for(fresh)
    for mime, raw in (("image/jpeg", JPEG), ("image/gif", GIF), ("image/webp", WEBP),
                      ("image/png", png_bytes())):
        content = ask(client, image_part(data_uri(raw, mime))).choices[0].message.content
        assert content == f"[sim] [image sha256:{short_sha(raw)}]"


def test_bad_images_are_400s(fresh):
    client = client_for(fresh)
    good = base64.b64encode(png_bytes()).decode()
    bad_urls = {
        "data:image/png;base64,@@not base64@@": "not valid base64",
        f"data:text/plain;base64,{good}": "Invalid MIME type",
        f"data:image/bmp;base64,{good}": "Invalid MIME type",
        "data:image/png,rawbytes": "must be base64-encoded",
        f"data:image/png;base64,{base64.b64encode(b'just some text').decode()}":
            "unsupported image",
        "ftp://example.invalid/cat.png": "data: URI or an http(s) URL",
    }
    for url, message in bad_urls.items():
        with pytest.raises(openai.BadRequestError) as info:
            ask(client, text("x"), image_part(url))
        assert message in info.value.message, url
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, image_part(data_uri(png_bytes())), role="system")
    assert "only allowed for messages with role 'user'" in info.value.message
    status, _ = raw_chat(fresh, {"model": MODEL, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": "data:x"}]}]})
    assert status == 400
    fresh.configure(max_image_bytes=100)
    big = png_bytes(40, 40, (1, 2, 3))
    assert len(big) > 100
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, image_part(data_uri(big)))
    assert info.value.code == "image_too_large"
    assert ask(client, image_part(data_uri(png_bytes()))).choices[0].message.content
    images = fresh.stats()["images"]
    assert images["rejected"] == len(bad_urls) + 3 and images["requests"] == 1
    assert fresh.stats()["by_status"] == {"400": len(bad_urls) + 3, "200": 1}


def test_remote_urls_are_not_fetched(fresh):
    client = client_for(fresh, timeout=2)
    url = "https://images.example.invalid/cat.png"  # .invalid never resolves
    started = time.monotonic()
    reply = ask(client, text("what is this"), image_part(url))
    assert time.monotonic() - started < 1
    marker = hashlib.sha256(url.encode()).hexdigest()[:12]
    assert reply.choices[0].message.content == f"[sim] what is this [remote image sha256:{marker}]"
    assert reply.usage.prompt_tokens == tokens("what is this") + 4 + IMAGE_TOKENS
    images = fresh.stats()["images"]
    assert (images["images"], images["remote"], images["bytes"]) == (1, 1, 0)


def test_stats_show_which_image_reached_which_row(fresh):
    client = client_for(fresh)
    rows = {f"row {i}": png_bytes(1, 1, (i, 0, 0)) for i in range(12)}

    def send(item):
        prompt, raw = item
        return prompt, ask(client, text(prompt), image_part(data_uri(raw)))

    with ThreadPoolExecutor(6) as pool:
        replies = dict(pool.map(send, rows.items()))
    for prompt, raw in rows.items():
        assert f"[image sha256:{short_sha(raw)}]" in replies[prompt].choices[0].message.content
    seen = {record["prompt"].split(" [")[0]: record["sha256"]
            for record in fresh.stats()["images"]["log"]}
    assert seen == {prompt: [hashlib.sha256(raw).hexdigest()] for prompt, raw in rows.items()}


def test_text_only_parts_are_unchanged(fresh):
    reply = ask(client_for(fresh), text("one"), text("two"))
    assert reply.choices[0].message.content == "[sim] one two"
    assert reply.usage.prompt_tokens == tokens("one\ntwo") + 4
    assert fresh.stats()["images"]["requests"] == 0


@pytest.mark.slow
def test_process_mode_carries_max_image_bytes():
    with SimulatedEndpoint(process=True, max_image_bytes=50) as sim:
        client = client_for(sim)
        with pytest.raises(openai.BadRequestError):
            ask(client, image_part(data_uri(png_bytes(10, 10))))
        small = JPEG
        assert ask(client, image_part(data_uri(small, "image/jpeg"))).choices[0].message.content
        sim.restart()
        assert sim.stats()["images"]["log"][0]["sha256"] == [hashlib.sha256(small).hexdigest()]
