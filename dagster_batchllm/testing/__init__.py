"""A simulated OpenAI-compatible endpoint for tests and benchmarks, and what both share around
it: calls at once on threads and a process killed mid-way (``concurrency``), a TCP proxy that
cuts a database off (``tcp_proxy``), and the chaos suite (``dagster_batchllm.testing.chaos``,
imported on its own). Fixtures, each imported on its own: Databricks' documented SQL examples and
their runners (``dagster_batchllm.testing.databricks``) and PDFs written with pdfium
(``dagster_batchllm.testing.pdf_writer``). Nothing in the product path imports this package.

None of it imports dagster: it runs in subprocesses and Spark executors.

Example::

    from dagster_batchllm.testing import SimulatedEndpoint

    with SimulatedEndpoint(latency_s=0.05, max_concurrency=64) as sim:
        sim.script(429, "drop")  # fault injection for the next two requests
        ...  # point a client at sim.base_url
        print(sim.stats()["by_status"])
"""

from ..openai_server.endpoint import stop_process
from ..openai_server.responder import Responder
from ..simulator.clients import openai_client, post_json, wait_for_batch, wait_until
from ..simulator.endpoint import SimulatedEndpoint
from ..simulator.images import data_uri, png_bytes
from ..simulator.mlflow_registry import LocalRegistry, ModelServer
from ..simulator.responders import RISK_LEVEL_SCHEMA, EchoResponder, schema_instance
from ..simulator.state import max_in_window
from .concurrency import run_on_threads, sigkill_when
from .tcp_proxy import CuttableProxy

__all__ = [
    "RISK_LEVEL_SCHEMA",
    "CuttableProxy",
    "EchoResponder",
    "LocalRegistry",
    "ModelServer",
    "Responder",
    "SimulatedEndpoint",
    "data_uri",
    "max_in_window",
    "openai_client",
    "png_bytes",
    "post_json",
    "run_on_threads",
    "schema_instance",
    "sigkill_when",
    "stop_process",
    "wait_for_batch",
    "wait_until",
]
