"""A run's budgets: tokens (``token_budget``) and USD (``budget_usd``), reserved before each
request and settled from its reply.

Before a call sends anything, :func:`check_planned_cost` refuses it when the rows it would
send are planned to cost more than its budget (the call's :class:`~..plan.Plan`). While it
runs, each request reserves its most possible cost (its prompt's strict token bound and
``max_tokens`` at the dearest price), so what was paid can never pass the budget, however
many requests are in flight: a request whose reservation does not fit waits for those in
flight to settle, and is deferred when none is left to wait for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..delivery.limits import CostBudget, TokenBudget, cost_bound
from ..errors import DeferredError, InferenceConfigError
from ..usage import hold_to_bound

if TYPE_CHECKING:
    from ..delivery.base import Attempts
    from ..requests import RowRequest
    from ..settings import InferenceSettings
    from .figures import ReplyPrices
    from .plan import Plan


def check_planned_cost(settings: InferenceSettings, budget_usd: float, plan: Plan) -> float:
    """Raise ``InferenceConfigError`` (naming both figures) when ``plan`` (the call's
    :class:`~..plan.Plan`: its requests not answered by the ledger, at the delivery it uses)
    costs more than ``budget_usd``; returns that cost. The plan's figures are a forecast, not
    a bound (calibrated by the ledger's past records, else the 4-characters estimate and
    max_tokens), so this refuses only what is not expected to fit: what the run pays is kept
    within the budget by each request's reservation of its strict bound as it goes."""
    unpriced = sorted(model for model, figures in plan.by_model.items()
                      if (figures["input_tokens"] or figures["expected_output_tokens"])
                      and settings.price_at(model) is None)
    if unpriced:
        raise InferenceConfigError(
            f"budget_usd={budget_usd:g} needs a price for {unpriced}: set "
            "Endpoint(prices={model: Price(input_per_mtok=..., output_per_mtok=...)}) (or the "
            "resource's prices={...}, the same mapping); nothing was sent.")
    cost = plan.cost_usd
    if cost is None:  # priced, but not at this delivery: the delivery refuses the call itself
        return 0.0
    if cost > budget_usd:
        raise InferenceConfigError(
            f"budget_usd is ${budget_usd:.6f}, but the {plan.rows_to_send:,} requests to send "
            f"are planned to cost ${cost:.6f} ({plan.delivery}; {plan.basis}); nothing was "
            "sent. Raise budget_usd, lower max_tokens, or send fewer rows.")
    return cost


class RunBudgets:
    """A run's budgets, in tokens (``token_budget``) and USD (``budget_usd``): whether a
    request may go now (:meth:`try_reserve`), and what it used once it went (:meth:`settle`).
    The run holds one only when it has a budget (:meth:`of`)."""

    def __init__(self, settings: InferenceSettings, prices: ReplyPrices, *,
                 tokens: int | None, usd: float | None):
        """``prices``: the run's, which price a reply for the USD budget as for its record."""
        self.settings, self.prices = settings, prices
        self.tokens = TokenBudget(tokens) if tokens is not None else None
        self.usd = CostBudget(usd) if usd is not None else None

    @classmethod
    def of(cls, settings: InferenceSettings, prices: ReplyPrices, *, tokens: int | None,
           usd: float | None) -> RunBudgets | None:
        """The run's budgets; None without any (nothing to ask before each request)."""
        if tokens is None and usd is None:
            return None
        return cls(settings, prices, tokens=tokens, usd=usd)

    def try_reserve(self, request: RowRequest) -> TokenBudget | None:
        """Reserve what ``request`` may use in every budget, or in none: None when it fits,
        else the budget that refused it."""
        tokens, usd = self.tokens, self.usd
        if tokens is not None and not tokens.try_reserve(request.reserve_tokens):
            return tokens
        if usd is not None and not usd.try_reserve(self._bound(request)):
            if tokens is not None:
                tokens.settle(request.reserve_tokens, 0)
            return usd
        return None

    def settle(self, request: RowRequest, attempts: Attempts, reply: Any) -> None:
        """Replace ``request``'s reservations by what it used (``reply``: its Completion, or
        None when it got none). Never more than was reserved, nor less than nothing, whatever
        the server reported (:mod:`..usage`): a figure past the bound counts as the bound."""
        if reply is not None:
            hold_to_bound(reply, request)
        if self.tokens is not None:
            spent = attempts.spent
            reserved = request.reserve_tokens
            self.tokens.settle(reserved, spent if 0 <= spent <= reserved else reserved)
        usd = self.usd
        if usd is not None:
            bound = self._bound(request)
            if reply is None:
                actual = 0.0
            elif not reply.usage_reported:  # not told: it may have cost its bound
                actual = bound
            else:
                # (at most the bound: a price of the endpoint that answered is at most the
                # dearest, which the bound is at)
                actual = min(bound, self.prices.cost(request.model, attempts.endpoint, reply))
            usd.settle(bound, actual)

    def over_budget(self, refused: TokenBudget, request: RowRequest) -> DeferredError:
        """Why ``request`` is deferred: ``refused`` (a budget :meth:`try_reserve` named) has
        too little left while nothing in flight can free any."""
        if isinstance(refused, CostBudget):
            return DeferredError(
                f"the budget (${refused.total:.6f}) has ${max(0.0, refused.remaining):.6f} "
                f"left, this request may cost up to ${self._bound(request):.6f}; a later call "
                f"will send it{refused.sends_every_row()}")
        return DeferredError(
            f"the token budget ({refused.total}) has {refused.remaining} tokens "
            f"left, this request may need {request.reserve_tokens}; a later call will send it")

    def _bound(self, request: RowRequest) -> float:
        """The most ``request`` may cost: its prompt's strict bound and ``max_tokens``, at
        the dearest price of its model."""
        return cost_bound(self.settings, request, batch=self.prices.batch)

__all__ = ["RunBudgets", "check_planned_cost"]
