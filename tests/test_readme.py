"""Every code block in README.md runs as written.

The README says how: its example addresses ``http://10.0.0.5:8000/v1`` and
``http://10.0.0.6:8000/v1`` are pointed at simulated endpoints serving ``llama-70b``; nothing else
in a block changes. The Python blocks run in order in one interpreter (they build on each other,
as a reader's session does), in a fresh folder, without ``PYSPARK_PYTHON`` (the README says the
library needs none); the SQL block is saved as ``pipeline.sql``, as the README says; the YAML
block loads as a component; the bash block that points the example at real servers runs the
example location (copied to a fresh folder); the ``text`` blocks are pictures, and the layout one
must name only paths that exist. The first block (set up, run) is what CI itself runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dagster_batchllm.testing import SimulatedEndpoint

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ADDRESSES = ("http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1")

pytestmark = pytest.mark.timeout(600)


def _blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2))
            for m in re.finditer(r"^```(\w*)\n(.*?)^```$", README, re.S | re.M)]


def _blocks_of(language: str) -> list[str]:
    return [body for lang, body in _blocks() if lang == language]


@pytest.fixture(scope="module")
def endpoints():
    with SimulatedEndpoint(models=("llama-70b",)) as a, \
            SimulatedEndpoint(models=("llama-70b",), api_key="sk-example") as b:
        yield a, b


def _pointed_at(text: str, endpoints) -> str:
    for address, sim in zip(ADDRESSES, endpoints, strict=True):
        text = text.replace(address, sim.base_url)
    return text


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "GPU_B_KEY")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def test_every_block_has_a_language_this_test_knows():
    languages = {lang for lang, _ in _blocks()}
    assert languages <= {"bash", "python", "sql", "yaml", "text"}, languages
    assert len(_blocks_of("python")) >= 5


def test_the_python_blocks_run_in_order(endpoints, tmp_path):
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    [sql] = _blocks_of("sql")
    (tmp_path / "pipeline.sql").write_text(sql)
    script = "\n\n".join(_pointed_at(block, endpoints) for block in _blocks_of("python"))
    (tmp_path / "readme.py").write_text(script)
    done = subprocess.run([sys.executable, "readme.py"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    out = done.stdout
    assert "2 rows: 2 ok" in out  # the library block's summary line
    assert "[sim] Summarize: I want a refund for my broken lamp." in out  # Spark's table
    assert re.search(r"^720 calls, \d+ flagged$", out, re.M)  # the Databricks pipeline
    # Both endpoints took requests, the key-protected one with its key from the EnvVar.
    assert all(sim.stats(log=False)["requests"] > 0 for sim in endpoints)


def test_the_yaml_block_loads_as_a_component(tmp_path):
    from dagster.components.testing import create_defs_folder_sandbox

    [block] = _blocks_of("yaml")
    attributes = yaml.safe_load(block)
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.defs_folder_path / "readme_component"
        path.mkdir()
        (path / "defs.yaml").write_text(block)
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            asset = defs.get_assets_def(attributes["attributes"]["name"])
            assert next(iter(asset.specs)).group_name == "calls"
            assert "llm" in defs.resources


def test_the_bash_block_runs_the_example_on_the_given_endpoints(endpoints, tmp_path):
    [first, real_servers] = _blocks_of("bash")
    assert "pytest" in first  # the two commands CI runs itself
    for name in ("run_example.py", "definitions.py", "workspace.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("assets", "resources"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    for sim in endpoints:
        sim.reset_stats()
    env = _env()
    env.pop("DAGSTER_HOME", None)  # the example's own, under the copied folder
    env["BATCHLLM_API_KEY"] = "sk-example"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", _pointed_at(real_servers, endpoints)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    assert "classified" in done.stdout
    assert sum(sim.stats(log=False)["requests"] for sim in endpoints) > 0


def test_the_layout_names_only_paths_that_exist():
    [layout] = [body for body in _blocks_of("text") if body.startswith("dagster_batchllm/")]
    parents: list[str] = []
    for line in layout.splitlines():
        indent = len(line) - len(line.lstrip())
        names = line.strip().split("  ")[0]
        depth = indent // 2
        parents = parents[:depth]
        for name in re.split(r",\s*", names):
            name = name.strip()
            if not name or " " in name:
                continue
            path = ROOT.joinpath(*parents, name.rstrip("/"))
            assert path.exists(), f"README's layout names {path.relative_to(ROOT)}"
        if names.endswith("/") and "," not in names:
            parents.append(names.rstrip("/"))
