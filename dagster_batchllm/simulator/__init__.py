"""The simulated OpenAI-compatible server: latency, fault injection and usage counting.

It speaks chat and legacy completions (with image parts), embeddings, and the Files and
Batches API, all answered by the same responder.

It never imports dagster: it runs in subprocesses and Spark executors. The embedded default
(:mod:`dagster_batchllm.managed.classical`) serves its classical models through it, and
:mod:`dagster_batchllm.testing` hands it to tests and benchmarks.
"""

from .endpoint import SimulatedEndpoint
from .images import data_uri, png_bytes
from .responders import EchoResponder, Responder, schema_instance
from .state import max_in_window

__all__ = ["EchoResponder", "Responder", "SimulatedEndpoint", "data_uri", "max_in_window",
           "png_bytes", "schema_instance"]
