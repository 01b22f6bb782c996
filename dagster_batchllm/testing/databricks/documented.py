"""Databricks' documented SQL examples of ``ai_query`` and the AI functions, as the docs show them.

The compatibility suite (``tests/sql/test_documented_examples.py``,
``tests/spark/test_spark_documented_examples.py``, ``bench/sql_compat.py``) runs each of these
through DuckDB and SQLite (``execute(..., dialect="databricks")``) and Spark SQL, and checks
the result types against the ones Databricks documents. The SQL is copied from
the page named above each example, without the ``>`` prompt the reference pages put before a
statement; nothing else is changed. What the examples read (``products``, ``customers`` ...)
the docs do not show: :data:`SAMPLE_TABLES` holds a few rows for each, written here.

Example::

    >>> from dagster_batchllm.testing.databricks.documented import EXAMPLES
    >>> example = next(e for e in EXAMPLES if e.name == "ai_classify: a literal")
    >>> example.result_types
    {0: 'STRING'}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DocumentedExample:
    """One SQL statement from Databricks' documentation."""

    name: str
    title: str  # the documentation page's title
    url: str
    sql: str
    # Result column (its alias, or its position where the docs give none: engines name an
    # unaliased expression differently) -> the Databricks type the page documents for it, the
    # AI function's return type. Columns not listed are the table's own and are not checked.
    result_types: Mapping[str | int, str]
    tables: tuple[str, ...] = ()  # the tables it reads, as it names them
    # Why it is not expected to run on these engines (yet), where the docs ask for more than a
    # served chat model: None when it should run.
    limitation: str | None = None


_SENTIMENT = ("ai_analyze_sentiment function",
              "https://learn.microsoft.com/azure/databricks/sql/language-manual/functions/"
              "ai_analyze_sentiment")
_CLASSIFY = ("ai_classify function",
             "https://docs.databricks.com/gcp/sql/language-manual/functions/ai_classify")
_EXTRACT = ("ai_extract function",
            "https://docs.databricks.com/en/sql/language-manual/functions/ai_extract.html")
_GRAMMAR = ("ai_fix_grammar function",
            "https://docs.databricks.com/en/sql/language-manual/functions/ai_fix_grammar.html")
_GEN = ("ai_gen function",
        "https://learn.microsoft.com/azure/databricks/sql/language-manual/functions/ai_gen")
_MASK = ("ai_mask function",
         "https://docs.databricks.com/sql/language-manual/functions/ai_mask.html")
_SIMILARITY = ("ai_similarity function",
               "https://learn.microsoft.com/azure/databricks/sql/language-manual/functions/"
               "ai_similarity")
_SUMMARIZE = ("ai_summarize function",
              "https://docs.databricks.com/gcp/sql/language-manual/functions/ai_summarize")
_TRANSLATE = ("ai_translate function",
              "https://docs.databricks.com/en/sql/language-manual/functions/ai_translate.html")
_AI_QUERY = ("ai_query function",
             "https://docs.databricks.com/aws/sql/language-manual/functions/ai_query")
# The same URL before the page documented named arguments: options as name/value pairs.
_AI_QUERY_EARLIER = ("ai_query function (the page's earlier version)",
                     "https://docs.databricks.com/en/sql/language-manual/functions/ai_query.html")
_BATCH = ("Deploy models for batch inference and prediction",
          "https://docs.databricks.com/aws/en/machine-learning/model-inference/index.md")
_BATCH_AI_QUERY = ("Perform batch LLM inference using ai_query",
                   "https://learn.microsoft.com/azure/databricks/machine-learning/"
                   "foundation-models/fmapi-batch-inference")
_BLOG = ("Databricks' announcement of batch LLM inference with ai_query (the call-center "
         "example, shipped as dagster_batchllm.testing.databricks.examples.CALL_CENTER_PIPELINE)",
         "")


def _example(source: tuple[str, str], name: str, sql: str,
             result_types: Mapping[str | int, str],
             *tables: str, limitation: str | None = None) -> DocumentedExample:
    title, url = source
    return DocumentedExample(name, title, url, sql.strip(), dict(result_types), tables,
                             limitation)


def _call_center() -> str:
    from .examples import CALL_CENTER_PIPELINE

    return CALL_CENTER_PIPELINE


EXAMPLES: tuple[DocumentedExample, ...] = (
    # -- ai_query function ------------------------------------------------------------------
    _example(_AI_QUERY, "ai_query: a materialized view", """
create or replace materialized view
ai_query_mv
TBLPROPERTIES('pipelines.channel' = 'PREVIEW') AS
SELECT
ai_query("databricks-meta-llama-3-3-70b-instruct", text) as response
FROM
messages
LIMIT 10;
""", {"response": "STRING"}, "messages",
             limitation="a materialized view with TBLPROPERTIES is a Lakeflow pipelines "
                        "construct: DuckDB, SQLite and open-source Spark have none"),
    # -- ai_query function, the earlier page: name/value pairs --------------------------------
    _example(_AI_QUERY_EARLIER, "ai_query: returnType as a name/value pair", """
SELECT ai_query(
    'qa_bot',
    'What gets stored in the metastore of Unity Catalog?',
    'returnType', 'STRING')
""", {0: "STRING"}),
    _example(_AI_QUERY_EARLIER, "ai_query: a STRUCT request", """
SELECT ai_query(
    'qa_bot',
    named_struct(
      'prompt', 'Write me a tweet about the launch of Dolly 2.0.',
      'temperature', 0.5),
    'returnType', 'STRING')
""", {0: "STRING"},
             limitation="a STRUCT request is for custom model endpoints: qa_bot must be an "
                        "MLflow model (mlflow_models=[MlflowModel(name='qa_bot', ...)])"),
    # -- batch inference --------------------------------------------------------------------
    _example(_BATCH, "ai_translate: batch inference over a Unity Catalog table", """
SELECT
writer_summary,
  ai_translate(writer_summary, "cn") as cn_translation
from user.batch.news_summaries
limit 500
;
""", {"cn_translation": "STRING"}, "user.batch.news_summaries"),
    _example(_BATCH_AI_QUERY, "ai_query: the batch inference template", """
CREATE OR REPLACE TABLE ${output_table_name} AS (
  SELECT
      ${input_column_name},
      AI_QUERY(
        "${endpoint}",
        CONCAT("${prompt}", ${input_column_name}),
        modelParameters => named_struct('max_tokens', ${num_output_tokens},'temperature', ${temperature})
      ) as response
    FROM ${input_table_name}
    LIMIT ${input_num_rows}
)
""",  # noqa: E501 (the docs' line)
             {}, limitation="a template: the SQL editor or a notebook widget fills in the "
                            "${...} placeholders before it runs"),
    # -- the task functions -----------------------------------------------------------------
    _example(_SENTIMENT, "ai_analyze_sentiment: positive", """
SELECT ai_analyze_sentiment('I am happy');
""", {0: "STRING"}),
    _example(_SENTIMENT, "ai_analyze_sentiment: negative", """
SELECT ai_analyze_sentiment('I am sad');
""", {0: "STRING"}),
    _example(_CLASSIFY, "ai_classify: a literal", """
SELECT ai_classify("My password is leaked.", ARRAY("urgent", "not urgent"));
""", {0: "STRING"}),
    _example(_CLASSIFY, "ai_classify: a table", """
SELECT
    description,
    ai_classify(description, ARRAY('clothing', 'shoes', 'accessories', 'furniture')) AS category
  FROM
    products
  LIMIT 10;
""", {"category": "STRING"}, "products"),
    _example(_EXTRACT, "ai_extract: person, location, organization", """
SELECT ai_extract(
    'John Doe lives in New York and works for Acme Corp.',
    array('person', 'location', 'organization')
  );
""", {0: "STRUCT<person: STRING, location: STRING, organization: STRING>"}),
    _example(_EXTRACT, "ai_extract: email, time", """
SELECT ai_extract(
    'Send an email to jane.doe@example.com about the meeting at 10am.',
    array('email', 'time')
  );
""", {0: "STRUCT<email: STRING, time: STRING>"}),
    _example(_GRAMMAR, "ai_fix_grammar: have", """
SELECT ai_fix_grammar('This sentence have some mistake');
""", {0: "STRING"}),
    _example(_GRAMMAR, "ai_fix_grammar: dont", """
SELECT ai_fix_grammar('She dont know what to did.');
""", {0: "STRING"}),
    _example(_GRAMMAR, "ai_fix_grammar: go", """
SELECT ai_fix_grammar('He go to school every days.');
""", {0: "STRING"}),
    _example(_GEN, "ai_gen: a literal", """
SELECT ai_gen('Generate a concise, cheerful email title for a summer bike sale with 20% discount');
""", {0: "STRING"}),
    _example(_GEN, "ai_gen: a table", """
SELECT
    question,
    ai_gen(
      'You are a teacher. Answer the students question in 50 words: ' || question
    ) AS answer
  FROM
    questions
  LIMIT 10;
""", {"answer": "STRING"}, "questions"),
    _example(_MASK, "ai_mask: person, email", """
SELECT ai_mask(
    'John Doe lives in New York. His email is john.doe@example.com.',
    array('person', 'email')
  );
""", {0: "STRING"}),
    _example(_MASK, "ai_mask: phone, address", """
SELECT ai_mask(
    'Contact me at 555-1234 or visit us at 123 Main St.',
    array('phone', 'address')
  );
""", {0: "STRING"}),
    _example(_SIMILARITY, "ai_similarity: a literal", """
SELECT ai_similarity('Apache Spark', 'Apache Spark');
""", {0: "FLOAT"}),
    _example(_SIMILARITY, "ai_similarity: ORDER BY", """
SELECT
   company_name
  FROM
   customers
  ORDER BY ai_similarity(company_name, 'Databricks') DESC
  LIMIT 1
""", {}, "customers"),
    _example(_SUMMARIZE, "ai_summarize: 20 words", """
SELECT ai_summarize(
    'Apache Spark is a unified analytics engine for large-scale data processing. ' ||
    'It provides high-level APIs in Java, Scala, Python and R, and an optimized ' ||
    'engine that supports general execution graphs. It also supports a rich set ' ||
    'of higher-level tools including Spark SQL for SQL and structured data ' ||
    'processing, pandas API on Spark for pandas workloads, MLlib for machine ' ||
    'learning, GraphX for graph processing, and Structured Streaming for incremental ' ||
    'computation and stream processing.',
    20
  );
""", {0: "STRING"}),
    _example(_TRANSLATE, "ai_translate: to es", """
SELECT ai_translate('Hello, how are you?', 'es');
""", {0: "STRING"}),
    _example(_TRANSLATE, "ai_translate: to en", """
SELECT ai_translate('La vida es un hermoso viaje.', 'en');
""", {0: "STRING"}),
    # -- the call-center pipeline -----------------------------------------------------------
    _example(_BLOG, "ai_query: the call-center pipeline", _call_center(),
             {"summary_analysis": "STRING", "risk_level": "STRING",
              "action_required": "STRING"}, "call_center_transcripts"),
)
"""Every documented example, in the order of the bench's table."""

# The endpoints the examples name; the AI functions without one use the first.
SERVED_MODELS = ("databricks-meta-llama-3-3-70b-instruct", "qa_bot", "llama-70b")

# A few rows for each table the examples read (the docs do not show them).
SAMPLE_TABLES: dict[str, dict[str, list]] = {
    "messages": {"text": ["What is Unity Catalog?", "Summarize the benefits of Delta Lake."]},
    "products": {"description": ["Leather hiking boots with a waterproof lining",
                                 "A merino wool scarf", "Oak dining table for six",
                                 "Cotton crew-neck t-shirt", None]},
    "questions": {"question": ["Why is the sky blue?", "What is photosynthesis?"]},
    "customers": {"company_name": ["Databricks Inc.", "Acme Corp.", "Globex"]},
    "user.batch.news_summaries": {"writer_summary": [
        "The city council approved a new bike lane on Main Street.",
        "Local bakery wins a national award for its sourdough."]},
}
