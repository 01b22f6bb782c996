"""``ai_query`` and the Databricks AI functions, defined once for SQL (:mod:`dagster_batchllm.sql`)
and Spark (:mod:`dagster_batchllm.spark`): their parameters, SQL types, system prompts, JSON
schemas and how a reply becomes a SQL value."""
