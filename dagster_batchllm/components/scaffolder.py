"""``dg scaffold defs dagster_batchllm.BatchInferenceComponent <name>``: a defs.yaml that loads.

Dagster's default scaffolder writes ``attributes: {}``, which cannot load (an inference asset
needs a name, a source and a prompt). This one writes a complete, commented file that loads as
it is, on the embedded default endpoint, for the user to point at their table and endpoints.

Example::

    dg scaffold defs dagster_batchllm.BatchInferenceComponent summaries \\
        --json-params '{"source": "cleaned_transcripts", "prompt": "Summarize: {transcript}"}'
"""

from __future__ import annotations

import json

import dagster as dg
from dagster.components import Scaffolder, ScaffoldRequest
from pydantic import BaseModel, Field


class InferenceScaffoldParams(BaseModel):
    """What ``--json-params`` may say; everything has a default that loads."""

    source: str = Field(default="upstream_table",
                        description="The upstream asset whose table is inferred.")
    prompt: str = Field(default="Summarize: {text}",
                        description="A prompt template over the source table's columns.")
    output_column: str = Field(default="output", description="The column for the answers.")
    model: str | None = Field(default=None, description="The model (default: the resource's).")


class InferenceScaffolder(Scaffolder[InferenceScaffoldParams]):
    @classmethod
    def get_scaffold_params(cls) -> type[InferenceScaffoldParams]:
        return InferenceScaffoldParams

    def scaffold(self, request: ScaffoldRequest[InferenceScaffoldParams]) -> None:
        if request.scaffold_format != "yaml":
            raise dg.DagsterInvalidDefinitionError(
                "BatchInferenceComponent scaffolds a defs.yaml only; run dg scaffold without "
                "--format python.")
        params = request.params or InferenceScaffoldParams()
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(
            defs_yaml(request.type_name, request.target_path.name, params))


def yaml_text(value: str) -> str:
    """``value`` as a YAML string that Dagster's templating leaves as it is.

    A JSON string is a YAML string, quoted and escaped. Dagster renders ``{{ ... }}`` in YAML
    values as Jinja, so a prompt's literal braces (``{{`` in a str.format template) are wrapped
    in a raw block.
    """
    if "{{" in value or "{%" in value or "{#" in value:
        value = "{% raw %}" + value + "{% endraw %}"
    return json.dumps(value)


def defs_yaml(type_name: str, name: str, params: InferenceScaffoldParams) -> str:
    model = (f"  model: {yaml_text(params.model)}\n" if params.model else
             "  # model: llama-70b           # default: the resource's default_model\n")
    return (
        f"type: {type_name}\n"
        "attributes:\n"
        f"  name: {yaml_text(name)}\n"
        f"  source: {yaml_text(params.source)}       # the upstream asset whose table is "
        "inferred\n"
        f"  prompt: {yaml_text(params.prompt)}\n"
        f"  output_column: {yaml_text(params.output_column)}\n"
        f"{model}"
        "  max_tokens: 128\n"
        "  # partitions_def: {type: daily, start_date: \"2026-01-01\"}\n"
        "  # asset_attributes: {group_name: llm, owners: [\"team:data\"]}\n"
        "  # The endpoints. The embedded default below serves classical models on 127.0.0.1 "
        "(no GPU);\n"
        "  # for real LLM servers list them instead, e.g.\n"
        "  #   endpoints: [{name: gpu-a, base_url: \"http://10.0.0.5:8000/v1\", "
        "models: [llama-70b],\n"
        "  #               api_key: {env: GPU_A_API_KEY}}]\n"
        "  # or drop `resource` and provide a BatchInferenceResource as `llm` in your "
        "definitions.\n"
        "  resource:\n"
        "    managed_endpoints: [{kind: classical}]\n"
        "    default_model: local\n"
        "    store_url: sqlite:///batchllm.db   # the results ledger: any SQLAlchemy URL\n"
    )
