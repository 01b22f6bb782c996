"""A fresh ``dg`` project in a folder, and the real ``dg`` CLI run in it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

BIN = Path(sys.executable).parent
PROJECT_PYPROJECT = textwrap.dedent("""\
    [project]
    name = "fresh_project"
    version = "0.1.0"
    requires-python = ">=3.10,<3.14"
    dependencies = ["dagster", "dagster-batchllm"]

    [build-system]
    requires = ["hatchling"]
    build-backend = "hatchling.build"

    [tool.dg]
    directory_type = "project"

    [tool.dg.project]
    root_module = "fresh_project"
    registry_modules = ["fresh_project.components.*"]
""")
PROJECT_DEFINITIONS = textwrap.dedent("""\
    from pathlib import Path

    from dagster import definitions, load_from_defs_folder


    @definitions
    def defs():
        return load_from_defs_folder(path_within_project=Path(__file__).parent)
""")


def fresh_dg_project(root: Path) -> Path:
    """The files ``create-dagster project fresh_project`` writes (create-dagster is not
    installed with the package, and the test installs nothing): a src layout whose definitions
    load the defs folder, empty."""
    package = root / "src" / "fresh_project"
    (package / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PROJECT_PYPROJECT)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(PROJECT_DEFINITIONS)
    return root


def dg_cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           # What create-dagster's `uv sync` does by installing the project: its package
           # importable (dg list defs imports it; dg check defs finds src/ itself).
           "PYTHONPATH": str(project / "src")}
    done = subprocess.run([str(BIN / "dg"), *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
    return done


def check_defs(project: Path) -> None:
    done = dg_cli(project, "check", "defs")
    assert "All definitions loaded successfully" in done.stdout + done.stderr
