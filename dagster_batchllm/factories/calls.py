"""``build_call_asset``: any registered job's call over an upstream table, as an asset.

The three named factories (inference, embedding, scoring) say what their columns mean; a job
added as a call class and a task class (:mod:`dagster_batchllm.core.tasks.base`) needs no
factory of its own: this one sends its call through ``llm.run_call`` with the same body as the
others (:mod:`.shared`), so it gets the same partitions, backfills, per-partition figures,
checks and retry-partitions sensor, online or through a provider's batch API.
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from ..core import CallBase, InferenceConfigError, task_type_for
from .shared import AssetJob, AssetOptions, asset_factory, build_asset


@asset_factory()
def build_call_asset(options: AssetOptions, *, call: CallBase, mode: str = "online",
                     wait: bool = True, deadline: Any = None) -> dg.AssetsDefinition:
    """Build a software-defined asset that runs ``call`` (any job's call whose task is
    registered) over each row of an upstream table.

    The asset's table is the input with the call's ``output_column`` and ``error_column``;
    its code version is the call's (as ``resource=`` sends it, where given), so a change of
    what is sent marks the asset unsynced.
    ``mode``, ``wait`` and ``deadline`` are as for
    :func:`~dagster_batchllm.build_inference_asset`.

    Example (a job of your own, see ``tests/core/test_a_new_job.py``)::

        reversed_texts = build_call_asset(name="reversed_texts", source="texts",
                                          call=ReverseCall(column="text"))
    """

    def job() -> CallJob:
        if not isinstance(call, CallBase):
            raise InferenceConfigError(
                f"call= must be a job's call object (a CallBase subclass), got "
                f"{type(call).__name__}; for a chat prompt use build_inference_asset.")
        task_type_for(call)  # a call of no registered job says how to register one, now
        return CallJob(call, mode=mode, wait=wait, deadline=deadline)

    return build_asset("build_call_asset", options, job)


class CallJob(AssetJob):
    """A registered job's call per row: its value in ``output_column``."""

    call: CallBase

    def send(self, llm: Any, frame: Any, **run: Any) -> Any:
        return llm.run_call(frame, self.call, **run, collect_keys=True, mode=self.mode,
                            wait=self.wait)

    def description(self) -> str:
        call = self.call
        who = f"model `{call.model}`" if call.model else "the resource's models"
        columns = ", ".join(f"`{c}`" for c in call.columns_read())
        return (f"Batch job `{call.job}` with {who}: reads {columns}; values in "
                f"`{call.output_column}`, failed rows' reasons in `{call.error_column}`.")

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "batchllm/task": self.call.job}

    def column_docs(self, input_columns: Sequence[str]
                    ) -> tuple[dict[str, str], dict[str, str]]:
        call = self.call
        descriptions = {
            call.output_column: (f"The `{call.job}` job's value for the row; null where the row "
                                 f"failed or was deferred (see `{call.error_column}`)."),
            call.error_column: ("Why the row has no value, as '<error_type>: <reason>'; null "
                                "where it succeeded."),
        }
        return descriptions, {call.error_column: "string"}
