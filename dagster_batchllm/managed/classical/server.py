"""Start the embedded default endpoint: ``ClassicalResponder`` behind the package's OpenAI-protocol
server (:mod:`dagster_batchllm.openai_server`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster_batchllm.managed.classical.models import ALIAS, LOCAL_MODELS

if TYPE_CHECKING:
    from dagster_batchllm.openai_server import ServedEndpoint

RESPONDER_SPEC = "dagster_batchllm.managed.classical.models:ClassicalResponder"


def start_local_endpoint(port: int = 0, process: bool = True, host: str = "127.0.0.1",
                         **options) -> ServedEndpoint:
    """Start and return an OpenAI-compatible endpoint serving the local classical models.

    ``process=True`` (the default) runs the server in a subprocess so the models' CPU work
    does not compete with the caller's GIL; ``process=False`` runs it on a thread.  Extra
    keyword arguments (``max_concurrency``, ``max_context_tokens``, ...) go to
    ``ServedEndpoint``. Call ``.stop()`` on the result (or use it as a context manager) when
    done.

    Example::

        endpoint = start_local_endpoint()
        client = openai.OpenAI(base_url=endpoint.base_url, api_key="unused")
        client.chat.completions.create(model="local-summarizer", messages=[...])
        endpoint.stop()
    """
    # Imported here: the server (aiohttp) is only needed when serving.
    from dagster_batchllm.openai_server import ServedEndpoint

    if process:
        responder: object = RESPONDER_SPEC  # the subprocess imports and builds its own
    else:
        from dagster_batchllm.managed.classical.models import ClassicalResponder

        responder = ClassicalResponder()
    endpoint = ServedEndpoint(responder, models=[*LOCAL_MODELS, ALIAS], host=host, port=port,
                              process=process, **options)
    return endpoint.start()
