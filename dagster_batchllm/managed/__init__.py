"""Endpoints the resource starts and stops itself: the embedded classical models
(:mod:`.classical`) and vLLM's OpenAI server (:mod:`.vllm_server`, with :mod:`.vllm_model` for
a model without a GPU or a hub)."""

from .start import MANAGED_KINDS, ManagedEndpointSpec, RunningEndpoint, start_managed

__all__ = ["MANAGED_KINDS", "ManagedEndpointSpec", "RunningEndpoint", "start_managed"]
