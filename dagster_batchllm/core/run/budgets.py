"""A run's budgets: tokens (``token_budget``) and USD (``budget_usd``), reserved before each
request and settled from its reply.

Before a call sends anything, :func:`check_planned_cost` refuses it when the rows it would
send may cost more than its budget (the dry run's figures: estimated prompt tokens and
``max_tokens`` at the dearest price). While it runs, each request reserves its most possible
cost (its prompt's strict token bound and ``max_tokens`` at that price), so what was paid can
never pass the budget, however many requests are in flight: a request whose reservation does
not fit waits for those in flight to settle, and is deferred when none is left to wait for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..delivery.limits import CostBudget, TokenBudget
from ..errors import DeferredError, InferenceConfigError
from ..pricing import cost_at

if TYPE_CHECKING:
    from ..delivery.base import Attempts
    from ..settings import InferenceSettings
    from .prompts import RowRequest


def cost_bound(settings: InferenceSettings, request: RowRequest, *, batch: bool,
               planned: bool = False) -> float:
    """The most ``request`` can cost: its prompt's token bound (``planned``: the dry run's
    estimate of its prompt tokens) and its max_tokens at the dearest price of its model (inf
    where the model has no price and the request has tokens)."""
    prompt = (request.typical_prompt_tokens if planned
              else max(0, request.reserve_tokens - request.max_tokens))
    if not (prompt or request.max_tokens):
        return 0.0  # (an in-process model's prediction)
    price = settings.price_at(request.model)
    if price is None:
        return math.inf
    return price.upper_bound(prompt, request.max_tokens, batch=batch)


def check_planned_cost(settings: InferenceSettings, budget_usd: float,
                       to_send: Iterable[RowRequest], *, batch: bool) -> float:
    """Raise ``InferenceConfigError`` (naming both figures) when the requests ``to_send``
    (distinct, not answered by the ledger) would cost more than ``budget_usd`` by the dry
    run's figures (their estimated prompt tokens and max_tokens, at the dearest price);
    returns that cost. (While the run goes, each request reserves its stricter bound.)"""
    total, count, unpriced = 0.0, 0, set()
    for request in to_send:
        bound = cost_bound(settings, request, batch=batch, planned=True)
        count += 1
        if bound == math.inf:
            unpriced.add(request.model)
        else:
            total += bound
    if unpriced:
        raise InferenceConfigError(
            f"budget_usd={budget_usd:g} needs a price for {sorted(unpriced)}: set "
            "Endpoint(prices=...) (or the resource's prices=[ModelPrice(...)]); nothing was "
            "sent.")
    if total > budget_usd:
        raise InferenceConfigError(
            f"budget_usd is ${budget_usd:.6f}, but the {count:,} requests to send may cost "
            f"up to ${total:.6f} (their estimated prompt tokens and max_tokens at the dearest "
            f"price of their models{', batch price' if batch else ''}); nothing was sent. "
            "Raise budget_usd, lower max_tokens, or send fewer rows.")
    return total


class RunBudgets:
    """The budgets of :class:`~.engine.InferenceRun`, mixed into it (``budget``: tokens,
    ``cost_budget``: USD; either may be None)."""

    budget: TokenBudget | None
    cost_budget: CostBudget | None

    def _try_reserve(self, request: RowRequest) -> TokenBudget | None:
        """Reserve what ``request`` may use in every budget, or in none: None when it fits,
        else the budget that refused it."""
        budget, cost_budget = self.budget, self.cost_budget
        if budget is not None and not budget.try_reserve(request.reserve_tokens):
            return budget
        if cost_budget is not None and not cost_budget.try_reserve(
                cost_bound(self.settings, request, batch=self._batch_priced)):
            if budget is not None:
                budget.settle(request.reserve_tokens, 0)
            return cost_budget
        return None

    def _settle_budgets(self, request: RowRequest, attempts: Attempts, reply: Any) -> None:
        """Replace ``request``'s reservations by what it used (``reply``: its Completion, or
        None when it got none)."""
        if self.budget is not None:
            self.budget.settle(request.reserve_tokens, attempts.spent)
        cost_budget = self.cost_budget
        if cost_budget is not None:
            bound = cost_bound(self.settings, request, batch=self._batch_priced)
            if reply is None:
                actual = 0.0
            elif not reply.usage_reported:  # not told: it may have cost its bound
                actual = bound
            else:
                actual = self._reply_cost(request.model, attempts.endpoint, reply)
            cost_budget.settle(bound, actual)

    def _reply_cost(self, model: str, endpoint: str | None, reply: Any) -> float:
        at_endpoint = self._rates.setdefault(endpoint, {})
        if model not in at_endpoint:
            price = self.settings.price_at(model, endpoint)
            at_endpoint[model] = (price.per_token(batch=self._batch_priced)
                                  if price is not None else None)
        rates = at_endpoint[model]
        if rates is None:
            return 0.0
        return cost_at(rates, reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)

    def _over_budget(self, refused: TokenBudget, request: RowRequest) -> DeferredError:
        if isinstance(refused, CostBudget):
            bound = cost_bound(self.settings, request, batch=self._batch_priced)
            return DeferredError(
                f"the budget (${refused.total:.6f}) has ${max(0.0, refused.remaining):.6f} "
                f"left, this request may cost up to ${bound:.6f}; a later call will send it")
        return DeferredError(
            f"the token budget ({refused.total}) has {refused.remaining} tokens "
            f"left, this request may need {request.reserve_tokens}; a later call will send it")


__all__ = ["RunBudgets", "check_planned_cost", "cost_bound"]
