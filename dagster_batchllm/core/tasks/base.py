"""What every job is made of: a call (what the user asked) and a task (how rows become requests).

A job is a :class:`CallBase` subclass, a frozen description of the work checked before a row
is read, and a :class:`Task` subclass registered for that call type (:func:`register_task`),
which turns the call's rows into request items and replies into row values. The client runs
every job through the same code (``infer``, ``embed``, ``predict`` and ``run_call`` for any
other registered call; their ``estimate``; online or through a provider's batch API), so a new
job is these two classes and nothing else: the engine never knows which job it runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..errors import InferenceConfigError, RowError
from ..ledger.stores import validate_identifier
from ..settings import described

if TYPE_CHECKING:
    from ..delivery.base import Delivery
    from ..requests import Completion, RowRequest
    from ..results import InferenceResult
    from ..settings import InferenceSettings

Call = TypeVar("Call", bound="CallBase")


@dataclasses.dataclass(frozen=True)
class _CallFields:
    """The dataclass fields every job's call has, keyword-only (so they follow each call's
    own fields, with or without defaults, in its ``__init__``)."""

    token_budget: int | None = described(
        "Most tokens this call may spend; rows past it are deferred to a later call.", None,
        kw_only=True)
    budget_usd: float | None = described(
        "Most USD this call (an asset's partition) may spend, at the prices of the endpoints: "
        "refused before anything is sent when the rows to send could cost more, and while it "
        "runs no request is sent whose most possible cost would pass it (those rows are "
        "deferred to a later call, as with token_budget).", None, kw_only=True)
    scope: str = described("The ledger scope of the rows (an asset's key).", "", kw_only=True)
    partition_key: str = described("The ledger partition of the rows.", "", kw_only=True)


class CallBase(_CallFields):
    """What every job's call has: the output and error columns, the ledger's scope and
    partition, the input columns it reads, its checks against a table, and its key material.

    Subclasses are frozen dataclasses with the fields ``output_column`` and ``error_column``;
    they call :meth:`_check_common` from ``__post_init__``. Every call also has the
    keyword-only fields ``token_budget``, ``budget_usd``, ``scope`` and ``partition_key``."""

    #: The job's name in logs and the ledger ("chat", "embed", "predict", ...).
    job: ClassVar[str] = "job"
    #: The client's method that runs it, for error messages ("infer", "embed", "predict").
    entry: ClassVar[str] = "run_call"
    #: The fields that shape what is sent: a change of one is a new request key for every row.
    sent_fields: ClassVar[tuple[str, ...]] = ()

    output_column: str
    error_column: str | None
    #: The model of every row (None: a model column names each row's). A job without this
    #: field keeps the default.
    model: str | None = None

    def _check_common(self) -> None:
        set_ = object.__setattr__  # frozen: normalized values are set once, here
        validate_identifier(self.output_column, "output column")
        set_(self, "error_column", self.error_column or f"{self.output_column}_error")
        validate_identifier(self.error_column, "output column")
        set_(self, "scope", self.scope or "")
        set_(self, "partition_key", self.partition_key or "")
        budget = self.budget_usd
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float)
                                   or not budget >= 0):
            raise InferenceConfigError(f"budget_usd must be a number >= 0 (USD), got {budget!r}.")

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def of(cls: type[Call], call: Call | None = None, /, **fields: Any) -> Call:
        """``call`` with ``fields`` changed, or a new call from ``fields``; a name that is no
        field raises, listing the fields."""
        unknown = sorted(set(fields) - cls.field_names())
        if unknown:
            raise InferenceConfigError(
                f"{cls.entry}() got unknown argument(s) {unknown}; it takes "
                f"{sorted(cls.field_names())}.")
        if call is None:
            return cls(**fields)
        return dataclasses.replace(call, **fields) if fields else call  # type: ignore[type-var]

    def bind(self: Call, columns: Sequence[str], settings: InferenceSettings) -> Call:
        """The call checked against a table's columns and the configured endpoints, with
        defaults (a model) filled in; every mistake raises before a request is sent."""
        self.check_columns(columns)
        return self

    # -- what the call reads and writes --------------------------------------------------------
    def columns_read(self) -> list[str]:
        """The input's columns a run reads, in the order its row tuples hold them."""
        raise NotImplementedError

    def check_columns(self, columns: Sequence[str]) -> None:
        """Raise when a column the call reads is missing, or one it writes exists already."""
        missing = [c for c in self.columns_read() if c not in columns]
        if missing:
            raise InferenceConfigError(
                f"Column(s) {missing} are not in the input table; available columns: "
                f"{list(columns)[:50]}.")
        for name in (self.output_column, self.error_column):
            if name in columns:
                raise InferenceConfigError(
                    f"The input already has a column '{name}'; choose another output_column.")

    @property
    def code_version(self) -> str:
        """A short hash of what goes into the request keys: when it changes, every row is
        answered again, so Dagster should call the asset stale."""
        return version_of({name: getattr(self, name) for name in self.sent_fields})

    def as_sent_by(self: Call, settings: InferenceSettings) -> Call:
        """The call with what a resource with ``settings`` fills in where the call says
        nothing (a model, a max_tokens): what its requests then carry. Nothing, by default."""
        return self

    def code_version_with(self, settings: InferenceSettings) -> str:
        """The code version of the call as a resource with ``settings`` answers it:
        :attr:`code_version` of :meth:`as_sent_by`, and what the configuration pins of the
        model's version (``settings.pinned_versions``). So a new default model, or a new
        declared served version, is a new code version, as it is a new request key."""
        sent = self.as_sent_by(settings)
        pinned = settings.pinned_versions(sent.model) if sent.model else ()
        if not pinned:
            return sent.code_version
        return version_of({"call": sent.code_version, "pinned": list(pinned)})


def version_of(sent: dict[str, Any]) -> str:
    text = json.dumps(sent, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


class Task:
    """How one job's rows become request items and replies become row values.

    A subclass sets :attr:`route` and implements :meth:`requests`, :meth:`value` and
    :meth:`parse_reply`; the rest has defaults that fit a request per row."""

    #: The API route its requests go to, below an endpoint's base URL.
    route: ClassVar[str]
    #: Most rows rendered at a time (None: the settings' chunk_rows). A rendered request holds
    #: its body, so a task whose bodies are large (images) renders fewer at once.
    max_chunk_rows: int | None = None
    #: Most items in one request, and most ``reserve_tokens`` summed over them (None: no cap
    #: beyond the count): a task of several rows per request (``deliver`` groups them) says.
    items_per_request: int = 1
    max_request_tokens: int | None = None
    #: Why this job's requests cannot be lines of a provider's batch file (None: they can):
    #: ``mode="batch_api"`` raises it before anything is read or sent.
    batch_refusal: ClassVar[str | None] = None

    def __init__(self, call: CallBase):
        self.call = call

    @classmethod
    async def prepare(cls, call: Any, frame: Any, client: Any) -> Task:
        """The task for a bound ``call`` over ``frame`` (the input's columns the call reads);
        ``client``: the :class:`~..client.InferenceClient` (a task that resolves models, or
        reads settings, finds them there)."""
        return cls(call)

    # -- rows into requests, replies into values ---------------------------------------------
    def requests(self, rows: Iterator[tuple]) -> Iterator[RowRequest | RowError]:
        """One request item per row (a tuple of :meth:`CallBase.columns_read`), or the row's
        error."""
        raise NotImplementedError

    def value(self, content: str) -> Any:
        """The row value of a stored reply; raises ``RowError`` when it is not usable."""
        raise NotImplementedError

    def reply_value(self, completion: Completion, request: RowRequest) -> Any:
        """The row value of a fresh reply to ``request``; raises ``RowError`` when it is not
        usable (the error may say more than :meth:`value` can, e.g. that it was cut off)."""
        return self.value(completion.content)

    def parse_reply(self, raw: bytes, *, endpoint: str, latency_s: float) -> Completion:
        """A 200 reply's body read into a Completion; raises ``MalformedResponseError``."""
        raise NotImplementedError

    def read_line(self, payload: Any, *, endpoint: str, latency_s: float) -> Completion:
        """A batch result line's reply (parsed from the line's JSON) read into a Completion
        whose ``content`` is what the ledger keeps (:meth:`value` reads it back)."""
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        return self.parse_reply(body, endpoint=endpoint, latency_s=latency_s)

    # -- how requests travel -----------------------------------------------------------------
    def route_models(self, settings: InferenceSettings) -> Collection[str] | None:
        """The models endpoints serve on :attr:`route` (None: whichever they serve)."""
        return None

    def deliver(self, delivery: Delivery) -> Delivery:
        """The delivery the run uses, given the one that sends one request as it is (a task
        that groups rows into requests wraps it; the others return it)."""
        return delivery

    def batch_line(self, delivery: Delivery) -> Delivery:
        """The delivery for the offline batch API, given the one that writes one request per
        batch line: a task whose items are not requests themselves wraps it (see
        :class:`~dagster_batchllm.core.tasks.embed.task.OneInputPerLine`)."""
        return delivery

    def run_settings(self, settings: InferenceSettings, capacity: int) -> InferenceSettings:
        """The settings of a run of this task (``capacity``: the requests the endpoints take
        at once); a task whose replies settle many rows at once writes in larger batches."""
        return settings

    # -- what the caller gets ------------------------------------------------------------------
    @property
    def label(self) -> str:
        """How the run's summary line names the job."""
        return self.call.job

    def result(self, df: Any, run: Any) -> InferenceResult:
        from ..results import InferenceResult

        return InferenceResult.of_run(df, run, output_column=self.call.output_column,
                                      error_column=self.call.error_column)


_TASKS: dict[type, type[Task]] = {}


def register_task(call_type: type[CallBase]):
    """Class decorator: the task that runs calls of ``call_type``."""

    def register(task_type: type[Task]) -> type[Task]:
        _TASKS[call_type] = task_type
        return task_type

    return register


def task_type_for(call: CallBase) -> type[Task]:
    for kind in type(call).__mro__:
        found = _TASKS.get(kind)
        if found is not None:
            return found
    raise InferenceConfigError(
        f"no task is registered for {type(call).__name__}: decorate its Task class with "
        f"@register_task({type(call).__name__})")


__all__ = ["CallBase", "Task", "register_task", "task_type_for", "version_of"]
