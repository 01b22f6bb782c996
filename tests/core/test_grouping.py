"""GroupingDelivery: items handed over one at a time go out as few requests, a bad item fails
alone (the group is split to find it), and a stop cancels what is gathered."""

from __future__ import annotations

import asyncio
import json

import pytest

from dagster_batchllm.core.delivery.grouping import GroupingDelivery
from dagster_batchllm.core.delivery.online import Attempts
from dagster_batchllm.core.errors import EndpointError, ErrorType, RowError
from dagster_batchllm.core.requests import Completion, RowRequest


def item(text: str, model: str = "m") -> RowRequest:
    return RowRequest(key=text, model=model, body=b"", reserve_tokens=len(text),
                      typical_prompt_tokens=len(text), max_tokens=0, payload=text)


class UpperTask:
    """Each item's answer is its text in capitals; a request's tokens are its characters."""

    def __init__(self, items_per_request: int, max_request_tokens: int | None = None):
        self.items_per_request = items_per_request
        self.max_request_tokens = max_request_tokens

    def group_request(self, items):
        body = json.dumps([i.payload for i in items]).encode()
        return RowRequest(key="", model=items[0].model, body=body,
                          reserve_tokens=sum(i.reserve_tokens for i in items),
                          typical_prompt_tokens=0, max_tokens=0)

    def split_reply(self, reply, items):
        return [Completion(content=text, prompt_tokens=len(text), completion_tokens=0,
                           usage_reported=True, finish_reason=None, latency_s=0.0)
                for text in reply.payload]


class FakeSender:
    """A delivery that answers a request at once, or refuses it when it holds 'bad'."""

    def __init__(self, capacity: int = 2):
        self._capacity = capacity
        self.bodies: list[list[str]] = []

    def capacity(self):
        return self._capacity

    def refusal(self, request):
        return None

    async def send(self, request, attempts):
        texts = json.loads(request.body)
        self.bodies.append(texts)
        attempts.count += 1
        attempts.sent += 1
        attempts.endpoint = "fake"
        await asyncio.sleep(0)
        if any("bad" in t for t in texts):
            raise EndpointError("input 'bad' is not valid text", error_type=ErrorType.BAD_REQUEST,
                                retryable=False, endpoint="fake")
        return Completion(content="", prompt_tokens=0, completion_tokens=0, usage_reported=True,
                          finish_reason=None, latency_s=0.0,
                          payload=[t.upper() for t in texts])

    async def open(self):
        pass

    async def close(self):
        pass

    def snapshot(self):
        return {}


async def send_all(delivery, texts):
    attempts = [Attempts() for _ in texts]
    sends = [delivery.send(item(t), a) for t, a in zip(texts, attempts, strict=True)]
    results = await asyncio.gather(*sends, return_exceptions=True)
    return results, attempts


def test_items_go_in_groups_of_the_task_size_and_requests_are_counted_once():
    sender = FakeSender()
    delivery = GroupingDelivery(sender, UpperTask(items_per_request=4))
    assert delivery.capacity() == 8
    texts = [f"t{i}" for i in range(10)]
    results, attempts = asyncio.run(send_all(delivery, texts))
    assert [r.content for r in results] == [t.upper() for t in texts]
    assert [len(b) for b in sender.bodies] == [4, 4, 2]  # the last 2 went after the linger
    assert sum(a.sent for a in attempts) == 3
    assert all(a.count == 1 and a.endpoint == "fake" for a in attempts)
    assert [a.spent for a in attempts] == [len(t) for t in texts]


def test_token_cap_closes_a_group_early():
    sender = FakeSender()
    delivery = GroupingDelivery(sender, UpperTask(items_per_request=10, max_request_tokens=5))
    asyncio.run(send_all(delivery, ["aaa", "bbb", "c", "dddd"]))
    assert sender.bodies == [["aaa"], ["bbb", "c"], ["dddd"]]


def test_a_bad_item_fails_alone_with_the_servers_reason():
    sender = FakeSender()
    delivery = GroupingDelivery(sender, UpperTask(items_per_request=8))
    texts = ["a", "b", "c", "bad", "e", "f", "g", "h"]
    results, attempts = asyncio.run(send_all(delivery, texts))
    errors = [r for r in results if isinstance(r, RowError)]
    assert len(errors) == 1 and results[3] is errors[0]
    assert errors[0].error_type == ErrorType.BAD_REQUEST and "not valid text" in str(errors[0])
    assert [r.content for i, r in enumerate(results) if i != 3] == list("ABCEFGH")
    # 1 request of 8, then halves down to the bad one: 8 -> 4+4 -> 2+2 -> 1+1
    assert len(sender.bodies) == 7
    assert sum(a.sent for a in attempts) == len(sender.bodies)
    # The halves are sent to find the bad item, not retried; each item was sent, so counted.
    assert sum(max(0, a.count - 1) for a in attempts) == 0
    assert all(a.count == 1 for a in attempts)


def test_a_half_retried_after_a_split_counts_that_retry_only():
    class RetriesHalves(FakeSender):
        async def send(self, request, attempts):
            if len(json.loads(request.body)) == 2:
                attempts.count += 1  # a 2-item half failed once and was retried by the loop
            return await super().send(request, attempts)

    delivery = GroupingDelivery(RetriesHalves(), UpperTask(items_per_request=4))
    results, attempts = asyncio.run(send_all(delivery, ["a", "bad", "c", "d"]))
    assert [isinstance(r, RowError) for r in results] == [False, True, False, False]
    assert sum(max(0, a.count - 1) for a in attempts) == 2  # the two halves' retries


def test_a_whole_request_failure_fails_every_item_without_splitting():
    class Down(FakeSender):
        async def send(self, request, attempts):
            self.bodies.append(json.loads(request.body))
            raise EndpointError("endpoint 'fake' did not answer within 1 s",
                                error_type=ErrorType.TIMEOUT, retryable=True, endpoint="fake")

    sender = Down()
    delivery = GroupingDelivery(sender, UpperTask(items_per_request=4))
    results, _ = asyncio.run(send_all(delivery, ["a", "b", "c", "d"]))
    assert len(sender.bodies) == 1
    assert all(isinstance(r, RowError) and r.error_type == ErrorType.TIMEOUT for r in results)


def test_close_cancels_items_still_gathering():
    async def scenario():
        delivery = GroupingDelivery(FakeSender(), UpperTask(items_per_request=4), linger_s=60)
        waiting = asyncio.ensure_future(delivery.send(item("x"), Attempts()))
        await asyncio.sleep(0.01)
        await delivery.close()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())


def test_a_retried_group_counts_its_retry_once():
    class FailsOnce(FakeSender):
        async def send(self, request, attempts):
            attempts.count += 1  # the first attempt failed and was retried, as the loop does
            return await super().send(request, attempts)

    delivery = GroupingDelivery(FailsOnce(), UpperTask(items_per_request=4))
    _, attempts = asyncio.run(send_all(delivery, ["a", "b", "c", "d"]))
    assert sum(max(0, a.count - 1) for a in attempts) == 1  # the engine's retries figure
    assert sum(a.sent for a in attempts) == 1 and all(a.count >= 1 for a in attempts)


def test_send_many_answers_each_item_in_order_across_groups():
    """A worker hands over several items at once: they fill groups as single sends do (a bad
    one fails alone), and each gets its own reply, in the order given."""
    async def scenario():
        sender = FakeSender()
        delivery = GroupingDelivery(sender, UpperTask(items_per_request=3))
        assert delivery.items_per_send == 3
        texts = ["a", "b", "bad", "d", "e"]
        attempts = [Attempts() for _ in texts]
        alone = asyncio.ensure_future(delivery.send(item("z"), Attempts()))
        await asyncio.sleep(0)  # "z" is gathering first
        results = await delivery.send_many([item(t) for t in texts], attempts)
        return sender, results, attempts, await alone

    sender, results, attempts, alone = asyncio.run(scenario())
    assert alone.content == "Z"
    assert [r.content for i, r in enumerate(results) if i != 2] == ["A", "B", "D", "E"]
    assert isinstance(results[2], RowError) and results[2].error_type == ErrorType.BAD_REQUEST
    assert sender.bodies[0] == ["z", "a", "b"]  # the single send's group, filled by the call
    assert all(a.count >= 1 and a.endpoint == "fake" for a in attempts)
    assert [a.spent for i, a in enumerate(attempts) if i != 2] == [1, 1, 1, 1]
