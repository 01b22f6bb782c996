"""A simulated oracle and proxy over the labelled truth of cascade_helpers."""

from __future__ import annotations

import pytest

from dagster_batchllm.simulator.labelled import LabelledResponder
from dagster_batchllm.testing import SimulatedEndpoint
from tests.semantic.cascade_helpers import ORACLE, PROXY, TRUTH


@pytest.fixture(scope="module")
def labelled_server():
    responder = LabelledResponder(TRUTH, oracle_models=[ORACLE], proxy_models=[PROXY],
                                  proxy_accuracy=0.85)
    with SimulatedEndpoint(models=None, responder=responder, max_concurrency=256) as sim:
        yield sim


@pytest.fixture
def labelled_sim(labelled_server):
    labelled_server.reset_stats()
    return labelled_server
