"""A small OpenAI-compatible HTTP server answered by a responder: what the managed endpoints
serve (:mod:`dagster_batchllm.managed.classical`), and what the simulator
(:mod:`dagster_batchllm.simulator`) adds its latency, rate limits, faults and batches to.

It speaks chat and legacy completions (with image parts), embeddings and ``/v1/models``,
validated as OpenAI and vLLM do, with a bound on requests in flight and counters of what it
served. It never imports dagster: it runs in subprocesses and Spark executors.

Example::

    from dagster_batchllm.openai_server import ServedEndpoint

    with ServedEndpoint("my_module:MyResponder", process=True) as endpoint:
        ...  # point a client at endpoint.base_url
        print(endpoint.stats()["by_status"])
"""

from .endpoint import ServedEndpoint, stop_process
from .protocol import Reject
from .responder import Responder
from .server import OpenAIApp, ServerSettings
from .state import SERVING_CONFIG, ServingState

__all__ = ["SERVING_CONFIG", "OpenAIApp", "Reject", "Responder", "ServedEndpoint",
           "ServerSettings", "ServingState", "stop_process"]
