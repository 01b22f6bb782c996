"""The hand-written client the benchmarks compare against: ``asyncio.Semaphore`` around
``AsyncOpenAI().chat.completions.create`` for every row, ``asyncio.gather`` over all of them;
no ledger, no retries, no budget."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


async def chat_loop(base_url: str, messages_of: Callable[[int], list[dict]], rows: int, *,
                    model: str, concurrency: int, api_key: str = "EMPTY",
                    **params: Any) -> list[str]:
    """Row ``i``'s ``messages_of(i)`` sent with ``params``, ``concurrency`` at a time; the
    answers (only their text is kept), each checked to be there."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with semaphore:
            reply = await client.chat.completions.create(model=model, messages=messages_of(i),
                                                         **params)
        return reply.choices[0].message.content

    try:
        answers = await asyncio.gather(*(one(i) for i in range(rows)))
    finally:
        await client.close()
    assert all(a is not None for a in answers)
    return answers
