"""What a call would send and what it would cost, before it sends anything: the :class:`Plan`.

``InferenceClient.plan(df, <the arguments of infer>)`` counts what the dry run counts (the
rows the ledger answers, the duplicates and the invalid rows left out: :class:`DryCount`, the
one home of that counting, which ``estimate()`` and ``budget_usd``'s check read too) and
forecasts, per model, what the rows left to send will use and cost:

- **Input tokens.** Each request's estimate (``RowRequest.typical_prompt_tokens``: 4
  characters per token, a few per message) times the ratio of what the servers counted to
  what was estimated over the ledger's past ``ok`` records of the same scope and model (each
  record keeps both: ``prompt_tokens`` and ``estimated_prompt_tokens``). An asset's scope stands
  for its prompt template; a call without a scope is calibrated by the model's records of
  every scope, and its basis says so. (No tokenizer library is used: tiktoken, the one for
  OpenAI's models, fetches its encoding files over the network at first use.) Where an
  endpoint serving the model counts tokens itself (``tokenize_route``: vLLM's ``/tokenize``),
  the server counts the prompts of up to :data:`SERVER_COUNTED_AT_MOST` of the requests (all of
  them when there are no more, else that many spread evenly over them); the forecast is then
  their exact count, scaled to the rest by their ratio to the estimate, and the calibrated
  figure stays beside it (``calibrated_input_tokens``). A count the server cannot give or
  that is no count keeps the calibrated figure, and the basis says why.
- **Output tokens.** The mean completion tokens of those records, at most each request's
  ``max_tokens``.
- **Cached share.** The share of those records' prompt tokens the servers' prefix caches
  answered, priced at the cached price.
- **Cost per delivery.** ``online``: at the cheapest price among the endpoints serving the
  model (the pool sends there first; a dearer one takes only what the cheaper cannot);
  ``batch_api``, where an endpoint with ``batch_api=True`` serves every model to send: at its
  batch price.
- **The budget needed** (``budget_needed_usd``): the ``budget_usd`` that sends every row at the
  call's delivery, by the rule the budget keeps (:mod:`.budgets`). Online each request
  reserves its most possible cost (:func:`~..delivery.limits.cost_bound`) until its reply
  settles it, and one that does not fit waits for those in flight: so the run needs the
  planned cost plus the largest single reservation, which the last request must find free.
  Through a batch API each line is charged its most possible cost for good when it is
  submitted: so the call needs the sum of those, often a few times the planned cost (the
  bound counts a token per byte of the prompt and ``max_tokens`` for every reply).

With fewer than :data:`MIN_CALIBRATION_RECORDS` such records, a model's figures are the
bound: the 4-characters estimate, ``max_tokens`` for every reply, nothing cached. Each model's
``basis`` says which it was.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..delivery.limits import cost_bound
from ..delivery.tokenize import TokenCountUnavailable
from ..ledger.table import OK

if TYPE_CHECKING:
    from ..ledger.table import Ledger
    from ..pricing import Price
    from ..requests import RowRequest
    from ..settings import EndpointSpec, InferenceSettings

#: How a plan asks a server for prompt counts: ``(endpoint, requests) -> counts`` in order,
#: or :class:`~..delivery.tokenize.TokenCountUnavailable`.
ServerCounter = Callable[["EndpointSpec", Sequence["RowRequest"]], list[int]]

#: Fewer past records than this of a (scope, model), and the plan takes the bound.
MIN_CALIBRATION_RECORDS = 20
#: The most recent records of a (scope, model) a plan calibrates by: recent answers say more
#: of the next ones (a model upgraded behind its name, a prompt tuned in a scope).
CALIBRATION_RECORDS = 5_000
ONLINE, BATCH_API = "online", "batch_api"
#: The most requests of one model whose prompts a plan has the server count (an even spread
#: of them beyond): enough for a ratio within a percent, few enough to take a second.
SERVER_COUNTED_AT_MOST = 256


@dataclass
class DryCount:
    """What a dry run counts: ``to_send``, the distinct requests the ledger does not answer
    (in row order), and the rows left out (answered by the ledger, repeats of an earlier row
    of the call, invalid); ``requests_to_send`` counts requests, of several rows where the
    job groups them."""

    rows: int
    to_send: list[RowRequest]
    answered_by_ledger: int
    deduplicated: int
    invalid: int
    requests_to_send: int


@dataclass
class PastUsage:
    """What the ledger's past ``ok`` records of a (scope, model) used, summed."""

    records: int = 0
    prompt_tokens: int = 0
    estimated_prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def past_usage(ledger: Ledger, scope: str, model: str) -> PastUsage:
    """The most recent :data:`CALIBRATION_RECORDS` ``ok`` records of ``model`` in ``scope``
    (every scope where ``scope`` is empty) that were paid for and kept their estimate (not
    those copied from the ledger, with no tokens, nor those written before the estimate was
    kept), nor those whose usage a server got wrong (kept at the request's bound, which is
    no measure: ``usage_corrected``)."""
    t = ledger.table
    recent = sa.select(t.c.prompt_tokens, t.c.estimated_prompt_tokens, t.c.completion_tokens,
                       t.c.cached_tokens).where(
        t.c.status == OK, t.c.model == model, t.c.estimated_prompt_tokens.is_not(None),
        t.c.estimated_prompt_tokens > 0, t.c.prompt_tokens > 0, t.c.usage_corrected.is_(None))
    if scope:
        recent = recent.where(t.c.scope == scope)
    recent = recent.order_by(t.c.updated_at.desc()).limit(CALIBRATION_RECORDS).subquery()
    query = sa.select(sa.func.count(), *(sa.func.coalesce(sa.func.sum(recent.c[name]), 0)
                                        for name in ("prompt_tokens", "estimated_prompt_tokens",
                                                     "completion_tokens", "cached_tokens")))
    with ledger.engine.connect() as conn:
        row = conn.execute(query).one()
    return PastUsage(*(int(value or 0) for value in row))


@dataclass
class ModelForecast:
    """One model's part of a plan."""

    requests: int
    input_tokens: int
    expected_output_tokens: int
    cached_share: float
    cost_by_delivery: dict[str, float | None]
    basis: str
    calibrated: bool
    #: The prompt tokens as calibrated by the ledger (or the bound), whatever ``input_tokens``
    #: came from; and how many of the requests a server counted exactly (0: none).
    calibrated_input_tokens: int = 0
    server_counted: int = 0


@dataclass
class ServerCount:
    """What a server counted of one model's requests: the prompt tokens of ``counted`` of
    them, whose estimates sum to ``estimated``; or ``unavailable``, why not."""

    endpoint: str
    counted: int = 0
    tokens: int = 0
    estimated: int = 0
    unavailable: str | None = None


def server_count(settings: InferenceSettings, requests: Sequence[RowRequest], model: str,
                 counter: ServerCounter | None) -> ServerCount | None:
    """The exact prompt tokens of ``requests`` (or of an even spread of
    :data:`SERVER_COUNTED_AT_MOST` of them) as the first endpoint serving ``model`` with a
    ``tokenize_route`` counts them; None where none has one (or no counter is given)."""
    endpoint = next((e for e in settings.endpoints
                     if e.tokenize_route and model in e.served_models), None)
    if counter is None or endpoint is None or not requests:
        return None
    step = max(1, math.ceil(len(requests) / SERVER_COUNTED_AT_MOST))
    sample = list(requests[::step])
    try:
        counts = counter(endpoint, sample)
    except TokenCountUnavailable as exc:
        return ServerCount(endpoint.name, unavailable=str(exc))
    return ServerCount(endpoint.name, len(sample), sum(counts),
                       sum(r.typical_prompt_tokens for r in sample))


def forecast(settings: InferenceSettings, requests: Sequence[RowRequest], usage: PastUsage,
             *, model: str, scope: str, counted: ServerCount | None = None) -> ModelForecast:
    """The tokens and costs of one model's ``requests`` (see the module's docstring)."""
    estimated = sum(r.typical_prompt_tokens for r in requests)
    where = f"scope {scope!r}, model {model!r}" if scope else f"model {model!r} (no scope)"
    if usage.records >= MIN_CALIBRATION_RECORDS:
        ratio = usage.prompt_tokens / usage.estimated_prompt_tokens
        per_reply = usage.completion_tokens / usage.records
        input_tokens = round(estimated * ratio)
        output = round(sum(min(per_reply, r.max_tokens) for r in requests))
        cached_share = usage.cached_tokens / usage.prompt_tokens
        basis = (f"calibrated from {usage.records:,} past records of {where}: prompt tokens "
                 f"{ratio:.3f}x the 4-characters estimate, {per_reply:.1f} completion tokens "
                 f"a reply, {cached_share:.1%} cached")
    else:
        input_tokens, cached_share = estimated, 0.0
        output = sum(r.max_tokens for r in requests)
        basis = (f"bound: 4 characters per token, max_tokens for every reply, nothing cached "
                 f"({usage.records} past records of {where}, fewer than "
                 f"{MIN_CALIBRATION_RECORDS})")
    calibrated_input = input_tokens
    if counted is not None and counted.unavailable is not None:
        basis += (f"; prompt tokens not counted by {counted.endpoint}'s /tokenize "
                  f"({counted.unavailable})")
    elif counted is not None:
        # The counted requests' tokens, scaled to the rest by their ratio to the estimate
        # (when every request was counted: their sum, exactly).
        everyone = counted.counted == len(requests)
        ratio = counted.tokens / counted.estimated if counted.estimated else 1.0
        input_tokens = counted.tokens if everyone else round(estimated * ratio)
        which = (f", all {counted.counted:,} requests" if everyone else
                 f" for {counted.counted:,} of {len(requests):,} requests, {ratio:.3f}x the "
                 "4-characters estimate")
        basis = (f"prompt tokens counted by {counted.endpoint}'s /tokenize{which} "
                 f"(calibrated: {calibrated_input:,}); {basis}")
    costs: dict[str, float | None] = {
        ONLINE: _cost(online_price(settings, model), input_tokens, output, cached_share)}
    batch_endpoint = settings.batch_endpoint_for(model)
    if batch_endpoint is not None:
        costs[BATCH_API] = _cost(settings.price_at(model, batch_endpoint.name), input_tokens,
                                 output, cached_share, batch=True)
    return ModelForecast(len(requests), input_tokens, output, cached_share, costs, basis,
                         usage.records >= MIN_CALIBRATION_RECORDS, calibrated_input,
                         counted.counted if counted is not None else 0)


def online_price(settings: InferenceSettings, model: str) -> Price | None:
    """The price the pool pays first for ``model`` online: the cheapest of the endpoints
    serving it that price it (None: none does)."""
    prices = [settings.price_at(model, e.name) for e in settings.endpoints
              if model in e.served_models]
    priced = [p for p in prices if p is not None] or (
        [settings.price_at(model)] if settings.price_at(model) is not None else [])
    return min(priced, key=lambda p: p.upper_bound(1, 1), default=None)


def _cost(price: Price | None, input_tokens: int, output: int, cached_share: float, *,
          batch: bool = False) -> float | None:
    if not (input_tokens or output):
        return 0.0  # (an in-process model's predictions: nothing to price)
    if price is None:
        return None
    return price.cost(input_tokens, output, round(input_tokens * cached_share), batch=batch)


@dataclass
class Plan:
    """What ``infer`` (or ``embed``, ``run_call``) with the same arguments would send and
    cost; nothing is sent. Row counts as :class:`~.results.InferenceEstimate`'s;
    ``rows_to_send``: the distinct requests to send (rows of the call that repeat one ride
    along). ``cost_usd``: at ``delivery``, the one the call would use; ``cost_by_delivery``:
    every delivery the endpoints offer for the models to send (None: a model is not priced
    there). ``budget_needed_usd``: the ``budget_usd`` that sends every row at ``delivery``
    (online: ``cost_usd`` and the largest single reservation; batch: every line's most
    possible cost, charged at submission; rounded up to the micro-dollar; None: not priced).
    ``basis`` says how each model's figures were obtained; ``by_model`` holds each model's
    figures."""

    rows: int
    rows_to_send: int
    rows_answered_by_ledger: int
    rows_deduplicated: int
    invalid_rows: int
    requests_to_send: int
    input_tokens: int
    expected_output_tokens: int
    cached_share: float
    delivery: str
    cost_usd: float | None
    cost_by_delivery: dict[str, float | None]
    basis: str
    by_model: dict[str, dict[str, Any]] = field(default_factory=dict)
    budget_needed_usd: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        costs = ", ".join(f"{name} {_usd(cost)}" for name, cost in self.cost_by_delivery.items())
        return (f"plan: {self.rows:,} rows, {self.rows_to_send:,} to send in "
                f"{self.requests_to_send:,} requests ({self.rows_answered_by_ledger:,} answered "
                f"by the ledger, {self.rows_deduplicated:,} duplicates, {self.invalid_rows:,} "
                f"invalid); ~{self.input_tokens:,} input tokens ({self.cached_share:.0%} "
                f"cached), ~{self.expected_output_tokens:,} output tokens; cost {costs} (this "
                f"call: {self.delivery}, {_usd(self.cost_usd)}); budget_usd that sends every "
                f"row: {_usd(self.budget_needed_usd)} ({_NEEDED_BECAUSE[self.delivery]}). "
                f"Basis: {self.basis}")


# Why the budget needed is more than the planned cost, per delivery (see the module's docstring)
_NEEDED_BECAUSE = {
    ONLINE: "the planned cost and the largest single request's reservation",
    BATCH_API: "each batch line is charged its most possible cost when submitted",
}


def _usd(cost: float | None) -> str:
    return "not priced" if cost is None else f"${cost:.6f}"


def budget_needed(settings: InferenceSettings, requests: Sequence[RowRequest],
                  cost_usd: float | None, delivery: str) -> float | None:
    """The ``budget_usd`` that sends every one of ``requests`` at ``delivery`` (see the
    module's docstring), rounded up to the micro-dollar, as the plan shows it; None where a
    model is not priced."""
    batch = delivery == BATCH_API
    bounds = [cost_bound(settings, r, batch=batch) for r in requests]
    if cost_usd is None or math.inf in bounds:
        return None
    needed = sum(bounds) if batch else cost_usd + max(bounds, default=0.0)
    # Up, with room for float sums in another order: a budget of this figure is enough.
    return math.ceil(needed * 1e6 + 1e-6) / 1e6 if needed else 0.0


def make_plan(settings: InferenceSettings, ledger: Ledger, counted: DryCount, *, scope: str,
              delivery: str = ONLINE, counter: ServerCounter | None = None) -> Plan:
    """The plan of the requests ``counted`` leaves to send, calibrated by ``ledger``; with a
    ``counter``, prompts counted by the endpoints that offer it (see :func:`server_count`)."""
    by_model: dict[str, list[RowRequest]] = {}
    for request in counted.to_send:
        by_model.setdefault(request.model, []).append(request)
    forecasts = {model: forecast(settings, requests, past_usage(ledger, scope, model),
                                 model=model, scope=scope,
                                 counted=server_count(settings, requests, model, counter))
                 for model, requests in by_model.items()}
    # Nothing to send costs nothing whichever way it goes.
    offered = [ONLINE] + ([BATCH_API] if all(
        BATCH_API in f.cost_by_delivery for f in forecasts.values()) else [])
    cost_by_delivery: dict[str, float | None] = {}
    for name in offered:
        costs = [f.cost_by_delivery[name] for f in forecasts.values()]
        cost_by_delivery[name] = (None if None in costs else round(sum(costs), 9))
    input_tokens = sum(f.input_tokens for f in forecasts.values())
    cached = sum(f.input_tokens * f.cached_share for f in forecasts.values())
    return Plan(
        rows=counted.rows, rows_to_send=len(counted.to_send),
        rows_answered_by_ledger=counted.answered_by_ledger,
        rows_deduplicated=counted.deduplicated, invalid_rows=counted.invalid,
        requests_to_send=counted.requests_to_send, input_tokens=input_tokens,
        expected_output_tokens=sum(f.expected_output_tokens for f in forecasts.values()),
        cached_share=cached / input_tokens if input_tokens else 0.0, delivery=delivery,
        cost_usd=cost_by_delivery.get(delivery), cost_by_delivery=cost_by_delivery,
        basis="; ".join(f"{model}: {f.basis}" for model, f in forecasts.items())
        or "nothing to send",
        by_model={model: dataclasses.asdict(f) for model, f in forecasts.items()},
        budget_needed_usd=budget_needed(settings, counted.to_send,
                                        cost_by_delivery.get(delivery), delivery))


__all__ = ["BATCH_API", "MIN_CALIBRATION_RECORDS", "ONLINE", "SERVER_COUNTED_AT_MOST", "DryCount",
           "ModelForecast", "PastUsage", "Plan", "ServerCount", "ServerCounter", "budget_needed",
           "forecast", "make_plan", "online_price", "past_usage", "server_count"]
