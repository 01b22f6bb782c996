"""The simulated OpenAI-compatible server: latency, fault injection and usage counting.

It is the server of :mod:`dagster_batchllm.openai_server` (chat and legacy completions with
image parts, embeddings, all answered by the same responder) with latency, rate limits, faults,
and the Files and Batches APIs.

It never imports dagster: it runs in subprocesses and Spark executors.
:mod:`dagster_batchllm.testing` hands it to tests and benchmarks; nothing in the product path
imports it.
"""

from ..openai_server.responder import Responder
from .endpoint import SimulatedEndpoint
from .images import data_uri, png_bytes
from .responders import EchoResponder, schema_instance
from .state import max_in_window

__all__ = ["EchoResponder", "Responder", "SimulatedEndpoint", "data_uri", "max_in_window",
           "png_bytes", "schema_instance"]
