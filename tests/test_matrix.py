"""The README's table of jobs x interfaces says what the tests prove: every cell that says a job
works there names a test below that exists, and every "no" is a "no" here too (issue 31)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Every job in every place"
NO = "no"

# (job row, interface column) -> the test that proves the cell, or NO (the README says why).
PROOF: dict[tuple[str, str], str] = {}


def _row(job: str, *cells: str) -> None:
    interfaces = ("Python", "DuckDB", "SQLite", "Spark", "asset", "`defs.yaml`", "batch API",
                  "dry run", "model column")
    assert len(cells) == len(interfaces)
    PROOF.update({(job, interface): cell for interface, cell in zip(interfaces, cells,
                                                                   strict=True)})


_row("chat (`infer`, `ai_query`, the AI functions)",
     "tests/core/test_infer_results.py::"
     "test_results_keep_input_order_and_index_with_output_error_and_stats",
     "tests/sql/test_sql_duckdb.py::test_databricks_pipeline_runs_on_duckdb",
     "tests/sql/test_sql_sqlite.py::test_ai_query_is_batched_deduplicated_and_null_safe",
     "tests/spark/test_spark_sql.py::test_the_databricks_example_query_runs_unchanged",
     "tests/dagster/test_dagster_checks.py::test_checks_pass_on_a_clean_run",
     "tests/dagster/test_component.py::test_component_loads_from_defs_yaml_and_materializes",
     "tests/batch_api/test_batch_mode.py::test_wait_true_answers_every_row_and_records_usage",
     "tests/core/test_infer_results.py::"
     "test_estimate_sends_nothing_and_counts_ledger_hits_duplicates_invalid_and_cost",
     "tests/core/test_infer_results.py::"
     "test_model_column_routes_rows_per_model_and_unknown_models_fail_per_row")
_row("images and documents",
     "tests/core/test_images_infer.py::"
     "test_each_row_gets_its_own_image_from_bytes_paths_and_data_uris",
     "tests/sql/test_sql_files.py::"
     "test_duckdb_blob_rows_get_their_own_image_and_a_null_file_is_not_sent",
     "tests/sql/test_sql_files.py::test_sqlite_files_is_the_seventh_argument_blob_or_path",
     "tests/spark/test_spark_files.py::"
     "test_spark_sql_files_sends_each_rows_image_and_a_rerun_sends_nothing",
     "tests/dagster/test_example_documents.py::"
     "test_on_a_vision_endpoint_the_scan_sends_its_page_image",
     "tests/dagster/test_component_images.py::test_the_component_sends_each_rows_image",
     "tests/batch_api/test_batch_mode.py::"
     "test_image_rows_go_through_the_batch_api_as_they_go_online",
     "tests/core/test_images_infer.py::"
     "test_reservations_and_estimates_count_image_tokens_not_base64",
     "tests/core/test_images_infer.py::"
     "test_images_go_with_a_model_column_each_row_to_its_own_model")
_row("embeddings (`embed`)",
     "tests/core/test_embed.py::test_vectors_are_the_ones_the_openai_client_reads",
     "tests/sql/test_sql_embeddings.py::test_duckdb_gives_float_lists_that_cosine_functions_take",
     "tests/sql/test_sql_embeddings.py::test_sqlite_gives_json_array_text",
     "tests/spark/test_spark_embeddings.py::test_embed_col_and_ai_query_give_float_arrays",
     "tests/dagster/test_embedding_asset.py::"
     "test_a_single_run_backfill_gives_each_partition_its_figures_and_checks",
     "tests/dagster/test_component_embedding.py::"
     "test_the_embedding_component_loads_from_defs_yaml_and_materializes",
     "tests/core/test_a_new_job.py::test_embeddings_go_through_the_batch_api_one_input_per_line",
     "tests/core/test_embed.py::"
     "test_inputs_go_many_per_request_and_a_rerun_pays_only_for_new_texts",
     NO)
_row("MLflow models (`predict`)",
     "tests/core/test_predict_mlflow.py::test_every_uri_form_scores_the_registered_model",
     "tests/sql/test_sql_mlflow.py::test_duckdb_runs_the_documented_custom_model_form",
     "tests/sql/test_sql_mlflow.py::test_sqlite_runs_it_with_json_objects",
     "tests/spark/test_spark_models.py::test_model_udf_matches_mlflow_spark_udf_row_for_row",
     "tests/dagster/test_scoring_assets.py::"
     "test_a_moved_alias_marks_the_scores_stale_and_the_rerun_uses_the_new_version",
     "tests/dagster/test_component_scoring.py::"
     "test_the_scoring_component_loads_from_defs_yaml_and_materializes",
     NO,
     "tests/core/test_predict_estimate.py::"
     "test_the_dry_run_of_predict_counts_what_a_call_would_score",
     "tests/core/test_predict_mlflow.py::test_a_model_column_routes_each_row_to_its_model")
_row("filters and cascades (`filter`, `classify`, `ai_filter`, `cascade`)",
     "tests/semantic/test_filter.py::"
     "test_filter_keeps_the_rows_that_pass_and_says_why_each_null_is_null",
     "tests/semantic/test_sql_ai_filter.py::test_ai_filter_in_where_and_join_on_duckdb",
     "tests/semantic/test_sql_ai_filter.py::test_a_cascade_in_duckdb_and_sqlite_gives_the_same_rows",
     "tests/spark/test_spark_ai_filter.py::"
     "test_the_same_ai_filter_sql_gives_the_same_rows_in_spark_and_duckdb",
     "tests/semantic/test_cascade_asset.py::"
     "test_an_assets_cascade_figures_are_in_its_materialization",
     NO,
     "tests/semantic/test_filter.py::"
     "test_through_a_batch_api_a_filter_waits_for_its_batch_at_the_batch_price",
     NO, NO)
_row("aggregates (`aggregate`, `ai_agg`, `ai_summarize_agg`)",
     "tests/semantic/test_aggregate.py::"
     "test_a_group_ten_times_the_context_is_reduced_whole_and_a_rerun_sends_nothing",
     "tests/semantic/test_aggregate_sql.py::"
     "test_duckdb_groups_are_answered_together_and_match_llm_aggregate",
     "tests/semantic/test_aggregate_sql.py::"
     "test_sqlite_aggregates_by_position_with_the_same_answers",
     "tests/semantic/test_aggregate_spark.py::"
     "test_the_same_sql_gives_the_same_answers_on_duckdb_and_spark",
     "tests/semantic/test_aggregate_asset.py::"
     "test_an_asset_aggregates_through_the_ledger_under_its_key",
     NO,
     "tests/semantic/test_aggregate.py::"
     "test_through_a_batch_api_each_level_is_a_batch_and_a_rerun_sends_nothing",
     NO, NO)
_row("a job of your own (a call and a task)",
     "tests/core/test_a_new_job.py::"
     "test_a_new_job_runs_online_with_the_ledger_dedup_and_row_errors",
     NO, NO, NO,
     "tests/dagster/test_call_asset.py::"
     "test_a_new_jobs_asset_answers_each_partition_with_its_figures_and_checks",
     NO,
     "tests/core/test_a_new_job.py::test_a_new_job_runs_through_the_batch_api",
     "tests/core/test_a_new_job.py::test_a_new_job_has_its_dry_run",
     "n/a")


def _readme_table() -> dict[tuple[str, str], str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        table.update({(cells[0], interface): cell for interface, cell in zip(
            header[1:], cells[1:], strict=True)})
    return table


def test_every_cell_of_the_readme_matrix_is_proved_or_says_why_not():
    table = _readme_table()
    assert set(table) == set(PROOF), set(table) ^ set(PROOF)
    problems = []
    for cell, said in table.items():
        proof = PROOF[cell]
        if proof in (NO, "n/a"):
            if not said.startswith(f"{proof}: ") or len(said) < len(proof) + 6:
                problems.append(f"{cell}: the README says {said!r}; it should say why not")
            continue
        if said.startswith(("no", "n/a")):
            problems.append(f"{cell}: the README says {said!r}, but {proof} proves it")
        path, name = proof.split("::")
        source = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        if not re.search(rf"^def {name}\(", source, re.M):
            problems.append(f"{cell}: {proof} does not exist")
    assert not problems, "\n".join(problems)
