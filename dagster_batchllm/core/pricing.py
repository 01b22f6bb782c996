"""What tokens cost: a model's :class:`Price` at an endpoint, and the cost of one answer.

The same model costs differently at different providers, so a price belongs to an endpoint
(``EndpointSpec.prices``: per model, or one for every model it serves); the resource-wide
``model_prices`` (``ModelPrice``) is the fallback for endpoints that name none.
:func:`price_on` is the one place that decides which price applies. Prices are plain frozen
data: they travel to Spark executors with the settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: The key of ``EndpointSpec.prices`` under which one price covers every model it serves.
EVERY_MODEL = "*"


@dataclass(frozen=True)
class Price:
    """USD per million tokens of one model at one endpoint.

    ``cached_input_per_mtok``: prompt tokens the server answered from its prefix cache
    (``usage.prompt_tokens_details.cached_tokens``; Anthropic's cache reads), by default at
    ``input_per_mtok``. ``batch_discount``: the share of the price a provider's batch API
    charges (OpenAI, Together, Groq, Mistral, Anthropic: 0.5). ``batch_input_per_mtok`` /
    ``batch_output_per_mtok``: batch prices that are no such share (the resource-wide
    ``ModelPrice`` form can say them)."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    batch_discount: float = 0.5
    batch_input_per_mtok: float | None = None
    batch_output_per_mtok: float | None = None

    def __post_init__(self) -> None:
        for name in ("input_per_mtok", "output_per_mtok", "cached_input_per_mtok",
                     "batch_discount", "batch_input_per_mtok", "batch_output_per_mtok"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"Price: {name} must be a number >= 0, got {value!r}.")

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


def endpoint_prices(value: Price | Mapping[str, Price] | Iterable[Any] | None, *,
                    endpoint: str) -> tuple[tuple[str, Price], ...]:
    """``EndpointSpec.prices`` in its stored form, sorted (model, Price) pairs, from one Price
    (every model), a mapping model -> Price, or such pairs."""
    if value is None:
        return ()
    if isinstance(value, Price):
        return ((EVERY_MODEL, value),)
    pairs = value.items() if isinstance(value, Mapping) else value
    stored = []
    for pair in pairs:
        model, price = pair
        if not isinstance(price, Price):
            raise ValueError(f"Endpoint '{endpoint}': prices[{model!r}] must be a Price, got "
                             f"{type(price).__name__}.")
        stored.append((str(model), price))
    return tuple(sorted(stored))


def legacy_price(entry: tuple[Any, ...]) -> tuple[str, Price]:
    """A ``model_prices`` entry ``(model, prompt, completion[, batch prompt, batch
    completion])`` (USD per 1M tokens, what ``ModelPrice`` makes) as a Price."""
    model, prompt, completion, *batch = entry
    if len(batch) >= 2:
        return model, Price(prompt, completion, batch_input_per_mtok=batch[0],
                            batch_output_per_mtok=batch[1])
    return model, Price(prompt, completion, batch_discount=1.0)


def price_on(endpoint_prices_: tuple[tuple[str, Price], ...],
             resource_prices: Mapping[str, Price], model: str) -> Price | None:
    """The price of ``model`` at an endpoint: its own price of the model, else its price of
    every model, else the resource-wide price of the model (None: not priced)."""
    every = None
    for name, price in endpoint_prices_:
        if name == model:
            return price
        if name == EVERY_MODEL:
            every = price
    return every if every is not None else resource_prices.get(model)


__all__ = ["EVERY_MODEL", "Price", "cost_at", "endpoint_prices", "legacy_price", "price_on"]
