"""Databricks' documented SQL examples of ``ai_query`` and the AI functions (:mod:`.documented`),
their example pipeline (:mod:`.examples`), and runners that check them on DuckDB and SQLite
(:mod:`.compat`) and in Spark SQL (:mod:`.spark_compat`): the compatibility suite of
``tests/sql``, ``tests/spark`` and ``bench/sql_compat.py``, and what the docs show.
"""
