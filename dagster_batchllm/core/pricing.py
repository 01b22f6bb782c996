"""What tokens cost: a model's :class:`Price`, and the cost of one answer.

``Price`` is the one price type: in code, ``Price(input_per_mtok=2.5, output_per_mtok=10)``; in
Dagster config and YAML, the same fields (``dagster_batchllm.resource_config.PriceConfig``
declares them from these). The same model costs differently at different providers, so a
price belongs to an endpoint (``EndpointSpec.prices``: per model, or one for every model it
serves); the settings' resource-wide ``prices`` are the fallback for endpoints that name none.
:func:`price_on` is the one place that decides which price applies. Prices are plain frozen
data: they travel to Spark executors with the settings.

Example::

    >>> Price(input_per_mtok=2.0, output_per_mtok=8.0).cost(1_000, 500)
    0.006
    >>> Price(input_per_mtok=2.0, output_per_mtok=8.0).cost(1_000, 500, batch=True)
    0.003
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .descriptions import described

#: The key of a prices mapping under which one price covers every model it applies to.
EVERY_MODEL = "*"


@dataclass(frozen=True)
class Price:
    """USD per million tokens of one model (at one endpoint, or resource-wide).

    Checked where it is built: a price below 0, or a ``batch_discount`` outside 0 to 1, is
    refused then, saying which field and what it takes."""

    input_per_mtok: float = described("USD per million prompt tokens.")
    output_per_mtok: float = described("USD per million completion tokens.")
    cached_input_per_mtok: float | None = described(
        "USD per million prompt tokens answered from the server's prefix cache "
        "(usage.prompt_tokens_details.cached_tokens; Anthropic's cache reads); None: "
        "input_per_mtok.", None)
    batch_discount: float = described(
        "The share of the online price the provider's batch API charges, from 0 to 1 (OpenAI, "
        "Together, Groq, Mistral, Anthropic: 0.5, half price; 1: the online price); "
        "batch_input_per_mtok and batch_output_per_mtok take precedence where given.", 0.5)
    batch_input_per_mtok: float | None = described(
        "USD per million prompt tokens through the batch API, where it is no share of the "
        "online price; None: input_per_mtok * batch_discount.", None)
    batch_output_per_mtok: float | None = described(
        "USD per million completion tokens through the batch API; None: output_per_mtok * "
        "batch_discount.", None)

    def __post_init__(self) -> None:
        for name in ("input_per_mtok", "output_per_mtok", "cached_input_per_mtok",
                     "batch_input_per_mtok", "batch_output_per_mtok"):
            value = getattr(self, name)
            if value is None and name not in ("input_per_mtok", "output_per_mtok"):
                continue
            if not _is_number(value) or value < 0:
                raise ValueError(
                    f"Price: {name} is USD per million tokens, a number >= 0 (0 for a model "
                    f"that costs nothing); got {value!r}.")
        share = self.batch_discount
        if not _is_number(share) or not 0 <= share <= 1:
            raise ValueError(
                "Price: batch_discount is the share of the online price the batch API charges, "
                f"from 0 to 1 (0.5: half price; 1: the online price); got {share!r}. For batch "
                "prices that are no share of the online ones, set batch_input_per_mtok and "
                "batch_output_per_mtok.")

    def per_mtok(self, *, batch: bool = False) -> tuple[float, float, float]:
        """USD per million (uncached prompt, cached prompt, completion) tokens, for an online
        request or a batch line."""
        cached = self.cached_input_per_mtok
        rates = (self.input_per_mtok, self.input_per_mtok if cached is None else cached,
                 self.output_per_mtok)
        if not batch:
            return rates
        share = self.batch_discount
        return (self.batch_input_per_mtok if self.batch_input_per_mtok is not None
                else rates[0] * share, rates[1] * share,
                self.batch_output_per_mtok if self.batch_output_per_mtok is not None
                else rates[2] * share)

    def per_token(self, *, batch: bool = False) -> tuple[float, float, float]:
        """:meth:`per_mtok` in USD per token."""
        uncached, cached, output = self.per_mtok(batch=batch)
        return uncached / 1e6, cached / 1e6, output / 1e6

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, *,
             batch: bool = False) -> float:
        """USD for one reply's usage (``prompt_tokens`` includes the cached ones, as OpenAI's
        usage does)."""
        return cost_at(self.per_token(batch=batch), prompt_tokens, completion_tokens,
                       cached_tokens)

    def upper_bound(self, prompt_tokens: int, completion_tokens: int, *,
                    batch: bool = False) -> float:
        """The most a request of these tokens can cost: no prompt token cached (a cached price
        above the input price is taken at its word)."""
        uncached, cached, output = self.per_token(batch=batch)
        return prompt_tokens * max(uncached, cached) + completion_tokens * output


def cost_at(rates: tuple[float, float, float], prompt_tokens: int, completion_tokens: int,
            cached_tokens: int = 0) -> float:
    """USD of a reply's usage at ``rates`` (:meth:`Price.per_token`); the run's hot path, one
    call per answered row. Never negative: the run holds a server's figures to the request's
    bound first (``core/usage.py``), and a figure below 0 that reached here anyway costs 0."""
    cached = (cached_tokens if 0 <= cached_tokens <= prompt_tokens
              else prompt_tokens if cached_tokens > 0 else 0)
    cost = (prompt_tokens - cached) * rates[0] + cached * rates[1] + completion_tokens * rates[2]
    return cost if cost > 0.0 else 0.0


def price_pairs(value: Price | Mapping[str, Price] | Iterable[Any] | None, *,
                where: str) -> tuple[tuple[str, Price], ...]:
    """Prices in their stored form, sorted (model, Price) pairs, from one Price (every model,
    :data:`EVERY_MODEL`), a mapping model -> Price, or such pairs. ``where``: whose prices
    they are, for the error."""
    if value is None:
        return ()
    if isinstance(value, Price):
        return ((EVERY_MODEL, value),)
    pairs = value.items() if isinstance(value, Mapping) else value
    stored = []
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(
                f"{where}: prices is a mapping model -> Price, such as {{'gpt-4o': Price("
                f"input_per_mtok=2.5, output_per_mtok=10)}} (or one Price for every model); "
                f"got an item {pair!r}.")
        model, price = pair
        if not isinstance(price, Price):
            raise ValueError(f"{where}: prices[{model!r}] must be a Price (Price(input_per_mtok"
                             f"=..., output_per_mtok=...)), got {type(price).__name__}.")
        stored.append((str(model), price))
    return tuple(sorted(stored))


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def price_on(endpoint_prices: tuple[tuple[str, Price], ...],
             resource_prices: Mapping[str, Price], model: str) -> Price | None:
    """The price of ``model`` at an endpoint: its own price of the model, else its price of
    every model, else the resource-wide price of the model, else the resource-wide price of
    every model (None: not priced)."""
    every = None
    for name, price in endpoint_prices:
        if name == model:
            return price
        if name == EVERY_MODEL:
            every = price
    if every is not None:
        return every
    return resource_prices.get(model, resource_prices.get(EVERY_MODEL))


__all__ = ["EVERY_MODEL", "Price", "cost_at", "price_on", "price_pairs"]
