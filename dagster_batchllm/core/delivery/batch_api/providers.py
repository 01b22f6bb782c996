"""Which batch protocol an endpoint speaks (its ``batch_protocol``)."""

from __future__ import annotations

from ...settings import EndpointSpec
from .anthropic import AnthropicBatchProtocol, config_problem
from .openai import OpenAIBatchProtocol
from .protocol import BatchProtocol


def protocol_for(endpoint: EndpointSpec) -> BatchProtocol:
    """The batch protocol an endpoint speaks (its ``batch_protocol``)."""
    if endpoint.batch_protocol == "anthropic":
        return AnthropicBatchProtocol(endpoint)
    return OpenAIBatchProtocol(endpoint)


def batch_config_problem(endpoint: EndpointSpec, route: str) -> str | None:
    """Why calls on ``route`` cannot go through the endpoint's batch API at all, if so: said
    before a row is read, not as an error per row."""
    if endpoint.batch_protocol == "anthropic":
        return config_problem(endpoint, route)
    return None


__all__ = ["batch_config_problem", "protocol_for"]
