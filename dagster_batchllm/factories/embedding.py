"""``build_embedding_asset``: "this table, this text, this embedding model" as an asset.

The embeddings sibling of :func:`~dagster_batchllm.factories.inference.build_inference_asset`,
with the same keywords and the same body (:mod:`.shared`): the same partitions, single-run
backfills, per partition figures and checks, so the retry-partitions sensor works on it
unchanged; the rows get one float32 vector each (a 1-D numpy array) in ``output_column``.
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg
import numpy as np

from ..core import EmbedCall
from .calls import CallJob
from .shared import AssetOptions, asset_factory, build_asset


@asset_factory()
def build_embedding_asset(options: AssetOptions, *, call: EmbedCall | None = None,
                          mode: str = "online", wait: bool = True, deadline: Any = None,
                          **call_fields: Any) -> dg.AssetsDefinition:
    """Build a software-defined asset that embeds a text of each row of an upstream table.

    What to embed is an :class:`~dagster_batchllm.core.tasks.embed.call.EmbedCall`: pass one as
    ``call``, or its fields as keywords (``input=`` a template or ``input_column=``,
    ``model=``, ``output_column=``, ``dimensions=``, ``inputs_per_request=`` ...); the other
    keywords are every asset factory's (below). Each partition's materialization
    carries its rows' figures, what the run paid, ``batchllm/dimensions`` and the checks.
    ``mode="batch_api"`` (and ``wait``, ``deadline``) as for
    :func:`~dagster_batchllm.factories.inference.build_inference_asset`: one input per line of
    the provider's batch file, at its batch price.

    Example::

        from dagster_batchllm import build_embedding_asset

        embeddings = build_embedding_asset(name="transcript_embeddings",
                                           source="cleaned_transcripts",
                                           input_column="transcript_text", model="bge-large")
    """
    return build_asset("build_embedding_asset", options,
                       lambda: EmbeddingJob(EmbedCall.of(call, **call_fields), mode=mode,
                                            wait=wait, deadline=deadline))


class EmbeddingJob(CallJob):
    """An embedding per row: a float32 vector in ``output_column``. Sent as any registered
    job's call is (:class:`~.calls.CallJob`); it says what its vectors are."""

    call: EmbedCall

    def description(self) -> str:
        return _describe(self.call)

    def version_covers(self) -> str:
        return "the text, model and size"

    def column_docs(self, input_columns: Sequence[str]
                    ) -> tuple[dict[str, str], dict[str, str]]:
        return _column_docs(self.call)

    def models_named(self, settings: Any) -> str:
        return self.call.model or ", ".join(sorted(settings.embedding_models))

    def own_figures(self, stats: Any, rows_out: Any) -> dict[str, Any]:
        return _dimensions(rows_out, self.call.output_column)


def _dimensions(table: Any, column: str) -> dict[str, Any]:
    """The vectors' size (nothing before any row has one)."""
    if column not in table.columns:
        return {}
    sizes = sorted({len(v) for v in table[column] if isinstance(v, Sequence | np.ndarray)})
    if not sizes:
        return {}
    return {"batchllm/dimensions": sizes[0] if len(sizes) == 1 else ", ".join(map(str, sizes))}


def _column_docs(call: EmbedCall) -> tuple[dict[str, str], dict[str, str]]:
    descriptions = {
        call.output_column: ("The row's embedding: a float32 vector (1-D numpy array); null "
                             f"where the row failed or was deferred (see `{call.error_column}`)."),
        call.error_column: ("Why the row has no vector, as '<error_type>: <reason>'; null "
                            "where it succeeded."),
    }
    return descriptions, {call.output_column: "float32[]", call.error_column: "string"}


def _describe(call: EmbedCall) -> str:
    who = (f"model `{call.model}`" if call.model else
           "the endpoints' only embedding model")
    what = (f"the text `{call.input}`" if call.input is not None
            else f"column `{call.input_column}`")
    size = f", {call.dimensions} dimensions" if call.dimensions else ""
    return (f"Embeddings with {who}{size}: {what}, {call.inputs_per_request} inputs per request;"
            f" vectors in `{call.output_column}`, failed rows' reasons in "
            f"`{call.error_column}`.")
