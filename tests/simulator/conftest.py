"""One simulated endpoint per test module (tests reset and configure it through ``fresh``)."""

from __future__ import annotations

import pytest

from dagster_batchllm.testing import SimulatedEndpoint


@pytest.fixture(scope="module")
def sim():
    with SimulatedEndpoint() as endpoint:
        yield endpoint
