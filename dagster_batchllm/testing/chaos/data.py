"""The chaos suite's rows, and the answer the simulated endpoint gives each."""

from __future__ import annotations

import random
import re

MODEL = "sim-model"
PROMPT = "Summarize ticket {ticket}: {text}"
MAX_TOKENS = 48
SCHEMA = {
    "type": "object",
    "properties": {"topic": {"type": "string"}, "words": {"type": "integer"}},
    "required": ["topic", "words"],
    "additionalProperties": False,
}
_WORDS = ["refund", "order", "invoice", "delivery", "late", "broken", "screen", "battery",
          "password", "reset", "account", "billing", "upgrade", "cancel", "plan", "router",
          "signal", "outage", "technician", "appointment", "warranty", "replacement", "courier",
          "address", "charge", "twice", "discount", "loyalty", "voucher", "complaint", "manager",
          "callback", "survey"]


def make_frame(n: int, *, offset: int = 0, seed: int = 7, dup_every: int = 20):
    """``n`` ticket rows with a non-default index; every ``dup_every``-th row repeats an earlier
    one (same prompt, so one request answers both). Row ``i`` is the same in every call."""
    import pandas as pd

    tickets, texts = [], []
    for i in range(offset, offset + n):
        source = i - 7 if dup_every and i % dup_every == dup_every - 1 and i >= 7 else i
        rng = random.Random(seed * 1_000_003 + source)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 30)))
        tickets.append(f"T{source:06d}")
        texts.append(f"Customer says {words}.")
    return pd.DataFrame({"ticket": tickets, "text": texts},
                        index=pd.RangeIndex(10_000 + offset, 10_000 + offset + n, name="row_id"))


def expected_reply(ticket: str, text: str, structured: bool = False) -> object:
    """What the simulated endpoint's echo responder answers for a row (see EchoResponder)."""
    prompt = re.sub(r"\s+", " ", PROMPT.format(ticket=ticket, text=text)).strip()
    if structured:
        return {"topic": prompt[:200], "words": len(prompt.split())}
    reply = "[sim] " + prompt
    if (len(reply) + 3) // 4 > MAX_TOKENS:
        reply = reply[: MAX_TOKENS * 4]
    return reply


def distinct_requests(df) -> int:
    """The requests the rows of ``df`` need: one per distinct (ticket, text)."""
    return len(set(zip(df["ticket"], df["text"], strict=True)))
