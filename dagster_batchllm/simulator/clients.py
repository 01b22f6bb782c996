"""Clients for talking to a simulated endpoint in tests: the official ``openai`` client, and raw
HTTP for what a client library would hide (exact status codes, bodies it would refuse)."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any


def openai_client(sim: Any, **kwargs: Any) -> Any:
    """``openai.OpenAI`` on ``sim`` without the client's own retries (tests count requests)."""
    import openai

    return openai.OpenAI(base_url=sim.base_url, api_key=kwargs.pop("api_key", "x"),
                         max_retries=kwargs.pop("max_retries", 0), **kwargs)


def post_json(sim: Any, path: str, body: Any, *, timeout: float = 5.0) -> tuple[int, bytes]:
    """POST ``body`` as JSON to ``/v1/<path>``; the status and the raw reply."""
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=timeout)
    try:
        conn.request("POST", f"/v1/{path.lstrip('/')}", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


BATCH_ENDED = ("completed", "failed", "expired", "cancelled")


def wait_for_batch(client: Any, batch_id: str, *, timeout: float = 60.0,
                   poll_s: float = 0.02) -> Any:
    """Poll ``client.batches.retrieve`` until the batch has ended; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in BATCH_ENDED:
            return batch
        if time.monotonic() >= deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status} after {timeout} s")
        time.sleep(poll_s)


def wait_until(predicate: Any, timeout_s: float, what: str, *, poll_s: float = 0.01) -> None:
    """Poll ``predicate()`` until it is true; an AssertionError naming ``what`` after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll_s)
