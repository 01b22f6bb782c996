"""A labelled truth for cascades, and tickets it labels (tests/semantic/conftest.py serves
them through a simulated oracle and proxy)."""

from __future__ import annotations

import random

import pandas as pd

from dagster_batchllm.simulator.labelled import KeywordTruth

ORACLE, PROXY = "llama-70b", "llama-8b"
LABELS = ["refund", "complaint", "question"]
_SENTENCES = {"refund": ["I want a refund.", "Give me my money back."],
              "complaint": ["The chair arrived broken.", "The courier was rude."],
              "question": ["When do you open?", "Do you ship abroad?"]}
TRUTH = KeywordTruth({"refund": "refund", "money back": "refund", "broken": "complaint",
                      "rude": "complaint"}, default="question")


def tickets(rows: int, seed: int = 3) -> pd.DataFrame:
    rng = random.Random(seed)
    bodies = [f"Ticket {i}: {rng.choice(_SENTENCES[rng.choice(LABELS)])} "
              f"Order {rng.randint(1, 9999)}." for i in range(rows)]
    return pd.DataFrame({"ticket_id": range(rows), "body": bodies})
