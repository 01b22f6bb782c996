"""``dg scaffold defs dagster_batchllm.BatchInferenceComponent <name>`` (and
``ModelScoringComponent``): a defs.yaml that loads.

Dagster's default scaffolder writes ``attributes: {}``, which cannot load (an inference asset
needs a name, a source and a prompt). This one writes a complete, commented file that loads as
it is, on the embedded default endpoint, for the user to point at their table and endpoints.
Without a ``source`` it names a placeholder table, ``<name>_source``, and declares it an
external asset (``external_source: true``), so ``dg check defs`` passes in a fresh project (and
with several scaffolds: each its own placeholder, as a key declared twice does not load); a
named ``source`` is taken for an asset of the project unless ``external_source`` says
otherwise.

Example::

    dg scaffold defs dagster_batchllm.BatchInferenceComponent summaries \\
        --json-params '{"source": "cleaned_transcripts", "prompt": "Summarize: {transcript}"}'
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import ClassVar, Generic, TypeVar

import dagster as dg
from dagster.components import Scaffolder, ScaffoldRequest
from pydantic import BaseModel, Field

Params = TypeVar("Params", bound=BaseModel)


class DefsYamlScaffolder(Scaffolder[Params], Generic[Params]):
    """Writes ``defs.yaml`` (only: a component declared in Python needs no scaffold), from
    ``--json-params`` or the parameters' defaults."""

    component: ClassVar[str]
    params: ClassVar[type[BaseModel]]
    #: (component type name, the folder's name, the parameters) -> the defs.yaml text
    text: ClassVar[Callable[[str, str, BaseModel], str]]

    @classmethod
    def get_scaffold_params(cls) -> type[BaseModel]:
        return cls.params

    def scaffold(self, request: ScaffoldRequest[Params]) -> None:
        if request.scaffold_format != "yaml":
            raise dg.DagsterInvalidDefinitionError(
                f"{self.component} scaffolds a defs.yaml only; run dg scaffold without "
                "--format python.")
        params = request.params or self.params()
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(
            self.text(request.type_name, request.target_path.name, params))


class SourceParams(BaseModel):
    """The upstream table, as both scaffolds take it."""

    source: str | None = Field(
        default=None, description="The upstream asset whose table is read (default: a "
        "placeholder, <name>_source, declared an external asset).")
    external_source: bool | None = Field(
        default=None, description="Declare the source an external asset (a table this project "
        "does not materialize); default: true for the placeholder, false for a named source.")

    def source_lines(self, name: str, what: str) -> str:
        """The defs.yaml lines of the source: the placeholder or a table from outside the
        project with ``external_source: true`` (else its definitions would not load), an
        asset of the project with the line commented out."""
        source = self.source or f"{name}_source"
        external = self.external_source if self.external_source is not None else (
            self.source is None)
        line = f"  source: {yaml_text(source)}       # the upstream asset whose table is {what}\n"
        if external:
            return line + ("  external_source: true   # not an asset of this project: declared "
                           "an external asset\n"
                           "  #   here (remove this line where the project defines it)\n")
        return line + ("  # external_source: true   # where the source is not an asset of this "
                       "project\n")


class InferenceScaffoldParams(SourceParams):
    """What ``--json-params`` may say; everything has a default that loads."""

    prompt: str = Field(default="Summarize: {text}",
                        description="A prompt template over the source table's columns.")
    output_column: str = Field(default="output", description="The column for the answers.")
    model: str | None = Field(default=None, description="The model (default: the resource's).")


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
        f"{params.source_lines(name, 'inferred')}"
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


class ScoringScaffoldParams(SourceParams):
    """What ``--json-params`` may say to ``dg scaffold defs
    dagster_batchllm.ModelScoringComponent <name>``; everything has a default that loads."""

    model: str = Field(default="risk", description="The model's name in the resource.")
    model_uri: str = Field(default="models:/risk@champion",
                           description="Where MLflow finds it (models:/name@alias, a path).")
    input_columns: list[str] = Field(default_factory=lambda: ["f1", "f2"],
                                     description="The columns the model reads.")
    output_column: str = Field(default="prediction", description="The prediction column.")


def scoring_defs_yaml(type_name: str, name: str, params: ScoringScaffoldParams) -> str:
    columns = ", ".join(yaml_text(c) for c in params.input_columns)
    return (
        f"type: {type_name}\n"
        "attributes:\n"
        f"  name: {yaml_text(name)}\n"
        f"{params.source_lines(name, 'scored')}"
        f"  model: {yaml_text(params.model)}\n"
        f"  input_columns: [{columns}]   # named as the model's features\n"
        f"  output_column: {yaml_text(params.output_column)}\n"
        "  # key_columns: [row_id]\n"
        "  # partitions_def: {type: daily, start_date: \"2026-01-01\"}\n"
        "  # The model's registry version as an asset the scores depend on (a moved alias\n"
        "  # marks them stale), and a sensor that re-scores when it moves:\n"
        f"  # model_version: {{name: {params.model}_model}}\n"
        "  # alias_sensor: {minimum_interval_seconds: 300}\n"
        "  # asset_attributes: {group_name: scoring, owners: [\"team:data\"]}\n"
        "  # Or drop `resource` and provide a BatchInferenceResource as `llm` in your "
        "definitions.\n"
        "  resource:\n"
        "    mlflow_models:\n"
        f"      - {{name: {yaml_text(params.model)}, model_uri: "
        f"{yaml_text(params.model_uri)}}}\n"
        "    mlflow_registry_uri: sqlite:///mlflow.db   # your MLflow registry\n"
        "    store_url: sqlite:///batchllm.db   # the results ledger: any SQLAlchemy URL\n"
    )


class InferenceScaffolder(DefsYamlScaffolder[InferenceScaffoldParams]):
    """A complete, commented defs.yaml that loads as it is, on the embedded default endpoint,
    for the user to point at their table and endpoints."""

    component = "BatchInferenceComponent"
    params = InferenceScaffoldParams
    text = staticmethod(defs_yaml)


class ScoringScaffolder(DefsYamlScaffolder[ScoringScaffoldParams]):
    """A complete, commented defs.yaml that loads as it is (the model is only looked up when
    the asset runs), for the user to point at their table, model and registry."""

    component = "ModelScoringComponent"
    params = ScoringScaffoldParams
    text = staticmethod(scoring_defs_yaml)
