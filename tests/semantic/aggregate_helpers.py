"""What the aggregate tests share: a small context, complaint rows, a simulated endpoint that
answers aggregate requests and counts their rows."""

from __future__ import annotations

import random
from collections.abc import Iterator

from dagster_batchllm.simulator.aggregation import AggregatingResponder
from dagster_batchllm.testing import SimulatedEndpoint

CONTEXT = 512  # tokens: small, so a few hundred rows are many times the context
INSTRUCTION = "What do these customers complain about most?"


def complaints(n: int, seed: int = 7, start: int = 0) -> list[str]:
    rng = random.Random(seed)
    things = ["lamp", "chair", "kettle", "desk", "sofa", "blender"]
    return [f"Ticket {start + i}: my {rng.choice(things)} arrived broken, order "
            f"{rng.randint(1000, 9999)}, I want a refund." for i in range(n)]


def aggregating_endpoint(models: tuple[str, ...] = ("sim-model",)
                         ) -> Iterator[SimulatedEndpoint]:
    """A started endpoint with a CONTEXT-token context; ``.responder`` is its tally."""
    responder = AggregatingResponder(models=models)
    with SimulatedEndpoint(models=models, responder=responder,
                           max_context_tokens=CONTEXT) as sim:
        sim.responder = responder
        yield sim
