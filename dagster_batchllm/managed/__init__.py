"""Endpoints the resource starts and stops itself: the embedded classical models
(:mod:`.classical`) and llama.cpp's server (:mod:`.llama_server`)."""

from .start import MANAGED_KINDS, ManagedEndpointSpec, RunningEndpoint, start_managed

__all__ = ["MANAGED_KINDS", "ManagedEndpointSpec", "RunningEndpoint", "start_managed"]
