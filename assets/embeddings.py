"""Embeddings of the cleaned transcripts, and what they are for: similar earlier calls.

``transcript_embeddings`` embeds each day's cleaned transcripts (on the embedded default,
``local-embedder``: hashed word and character n-grams, a lexical similarity);
``similar_high_risk_calls`` finds, in DuckDB, for each call the classifier rated High risk,
the three most similar earlier calls of that day (``list_cosine_similarity`` over the
vectors), with what those calls were about.
"""



import dagster as dg
import duckdb
import pandas as pd

from dagster_batchllm import build_embedding_asset
from resources.warehouse import vector_from_blob

from .partitions import daily_call_center_asset
from .pipeline import DAILY_CALLS, classified_transcripts, cleaned_transcripts

transcript_embeddings = build_embedding_asset(
    name="transcript_embeddings",
    source=cleaned_transcripts,
    input_column="transcript_text",
    output_column="embedding",
    **DAILY_CALLS,
)

SIMILAR_CALLS_SQL = """
WITH calls AS (
    SELECT e.call_id, e.call_date, e.call_timestamp, e.embedding, c.risk_level, c.action_required
    FROM embeddings e JOIN classified c USING (call_id)
    WHERE e.embedding IS NOT NULL
),
pairs AS (
    SELECT h.call_id, h.call_date, h.call_timestamp, h.action_required,
           p.call_id AS similar_call_id, p.call_timestamp AS similar_call_timestamp,
           p.action_required AS similar_action_required,
           list_cosine_similarity(h.embedding, p.embedding) AS similarity
    FROM calls h JOIN calls p
      ON p.call_date = h.call_date AND p.call_timestamp < h.call_timestamp
    WHERE h.risk_level = 'High'
)
SELECT * EXCLUDE (rank), rank AS similarity_rank FROM (
    SELECT *, row_number() OVER (PARTITION BY call_id
                                 ORDER BY similarity DESC, similar_call_id) AS rank
    FROM pairs)
WHERE rank <= 3
ORDER BY call_timestamp, call_id, similarity_rank
"""


def _similar_high_risk_calls(context: dg.AssetExecutionContext, classified: pd.DataFrame,
                             embeddings: pd.DataFrame) -> pd.DataFrame:
    """For each High-risk call, the 3 most similar earlier calls of its day."""
    vectors = embeddings[["call_id", "call_date", "call_timestamp", "embedding"]].assign(
        embedding=embeddings["embedding"].map(vector_from_blob))
    con = duckdb.connect()
    try:
        con.register("embeddings", vectors)
        con.register("classified", classified[["call_id", "risk_level", "action_required"]])
        similar = con.sql(SIMILAR_CALLS_SQL).df()
    finally:
        con.close()
    context.add_output_metadata({
        "dagster/row_count": len(similar),
        "high_risk_calls": int(similar["call_id"].nunique()),
        "same_action_as_nearest": float(
            (similar.loc[similar.similarity_rank == 1, "similar_action_required"]
             == similar.loc[similar.similarity_rank == 1, "action_required"]).mean())
        if len(similar) else 0.0,
    })
    return similar


similar_high_risk_calls = daily_call_center_asset(
    _similar_high_risk_calls,
    name="similar_high_risk_calls",
    ins={"classified": dg.AssetIn(classified_transcripts.key),
         "embeddings": dg.AssetIn(transcript_embeddings.key)},
    kinds={"duckdb", "sqlite"},
    description="For each call the LLM classification rates High risk, the 3 most similar "
                "earlier calls of the same day, by cosine similarity of their embeddings "
                "(computed in DuckDB with list_cosine_similarity).",
)

embedding_assets = [transcript_embeddings, similar_high_risk_calls]
