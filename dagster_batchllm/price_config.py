"""An endpoint's prices as Dagster config: ``Endpoint(prices=...)`` in code, YAML or run config.

In code, ``prices`` takes what the core takes (one :class:`~.core.pricing.Price` for every
model of the endpoint, or a mapping model -> Price); in config (YAML, the launchpad) it is a
mapping model -> the Price's fields, ``'*'`` standing for every model::

    prices:
      gpt-4o: {input_per_mtok: 2.5, output_per_mtok: 10, cached_input_per_mtok: 1.25}
      '*': {input_per_mtok: 0.2, output_per_mtok: 0.6}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import dagster as dg
from pydantic import Field

from .core import EVERY_MODEL, Price


class EndpointPrice(dg.Config):
    """The fields of :class:`~dagster_batchllm.core.pricing.Price`, as config."""

    input_per_mtok: float = Field(description="USD per million prompt tokens.")
    output_per_mtok: float = Field(description="USD per million completion tokens.")
    cached_input_per_mtok: float | None = Field(
        default=None, description="USD per million prompt tokens answered from the server's "
        "prefix cache (usage.prompt_tokens_details.cached_tokens); by default input_per_mtok.")
    batch_discount: float = Field(
        default=0.5, description="The share of the price the provider's batch API charges "
        "(OpenAI, Together, Groq, Mistral, Anthropic: 0.5).")
    batch_input_per_mtok: float | None = Field(
        default=None, description="USD per million prompt tokens through the batch API, where "
        "it is no share of the online price.")
    batch_output_per_mtok: float | None = Field(
        default=None, description="USD per million completion tokens through the batch API.")

    def to_price(self) -> Price:
        return Price(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Price)})


def as_price_config(value: Any) -> Any:
    """``Endpoint.prices`` as given in code (a Price, a mapping of Prices) in its config form;
    config already in that form passes as it is (pydantic checks it)."""
    if isinstance(value, Price):
        value = {EVERY_MODEL: value}
    if isinstance(value, Mapping):
        return {model: EndpointPrice(**dataclasses.asdict(price)) if isinstance(price, Price)
                else price for model, price in value.items()}
    return value


def spec_prices(prices: Mapping[str, EndpointPrice]) -> dict[str, Price]:
    """The config's prices as the core's (``EndpointSpec.prices``)."""
    return {model: price.to_price() for model, price in prices.items()}


__all__ = ["EndpointPrice", "as_price_config", "spec_prices"]
