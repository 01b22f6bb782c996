"""The simulated OpenAI-compatible server: latency, fault injection and usage counting.

It never imports dagster: it runs in subprocesses and Spark executors. The embedded default
(:mod:`dagster_batchllm.managed.classical`) serves its classical models through it, and
:mod:`dagster_batchllm.testing` hands it to tests and benchmarks.
"""

from .endpoint import SimulatedEndpoint
from .responders import EchoResponder, Responder, schema_instance
from .state import max_in_window

__all__ = ["EchoResponder", "Responder", "SimulatedEndpoint", "max_in_window", "schema_instance"]
