"""Every code block in README.md, in every ``docs/*.md`` and in ``bench/README.md`` runs as written.

The README says how: its example addresses ``http://10.0.0.5:8000/v1`` and
``http://10.0.0.6:8000/v1`` are pointed at simulated endpoints serving ``llama-70b``; nothing else
in a block changes. Each page is its own test. A page's Python blocks run in order in one
interpreter (they build on each other, as a reader's session does), in a fresh folder, without
``PYSPARK_PYTHON`` (the README says the library needs none); a page's SQL block is saved as
``pipeline.sql``, as the page says; every YAML block loads as a component; the README's bash
block that points the example at real servers runs the example location (copied to a fresh
folder), and no other page has bash blocks; the ``text`` blocks are pictures, and the layout one
(docs/architecture.md) must name only paths that exist. The README's first block (set up, run)
is what CI itself runs.

What the prose names is kept true too: every relative link (and its ``#anchor``) leads somewhere,
every ``dagster_batchllm.…`` name in backticks imports, and every ``….py`` path in backticks exists.
"""

from __future__ import annotations

import importlib
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
ADDRESSES = ("http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1")
LANGUAGES = {"bash", "python", "sql", "yaml", "text"}


def _pages() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             ROOT / "bench" / "README.md"]
    return [page.relative_to(ROOT).as_posix() for page in pages if page.exists()]


PAGES = _pages()

# What a page's Python blocks print, beyond running to the end (regexes, one line each).
PRINTS = {
    "README.md": [
        r"2 rows: 2 ok",  # the library block's summary line
        r"^True$",  # the partitioned asset materialized
    ],
    "docs/jobs.md": [r"^\(3, 384\) ", r"\['deferred', 'deferred'\]"],
    "docs/dagster.md": [r"^True$"],
    "docs/sql-and-spark.md": [
        re.escape("[sim] Summarize: I want a refund for my broken lamp."),  # Spark's table
        r"^720 calls, \d+ flagged$",  # the Databricks pipeline
    ],
}

pytestmark = pytest.mark.timeout(600)


def _text(page: str) -> str:
    return (ROOT / page).read_text()


def _blocks(page: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2))
            for m in re.finditer(r"^```(\w*)\n(.*?)^```$", _text(page), re.S | re.M)]


def _blocks_of(page: str, language: str) -> list[str]:
    return [body for lang, body in _blocks(page) if lang == language]


def _pages_with(language: str) -> list[str]:
    return [page for page in PAGES if _blocks_of(page, language)]


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


def test_the_pages_are_the_readme_and_the_docs():
    assert PAGES[0] == "README.md"
    assert {"docs/architecture.md", "bench/README.md"} <= set(PAGES), PAGES
    assert len(_text("README.md").splitlines()) <= 300  # the README stays a front page


@pytest.mark.parametrize("page", PAGES)
def test_every_block_has_a_language_this_test_knows(page):
    languages = {lang for lang, _ in _blocks(page)}
    assert languages <= LANGUAGES, languages
    assert len(_blocks_of(page, "sql")) <= 1  # saved as pipeline.sql
    if page == "README.md":
        assert len(_blocks_of(page, "python")) >= 5
    else:
        assert not _blocks_of(page, "bash"), "only the README's bash blocks are run"


def _needs_vllm(block: str) -> bool:
    """A block that starts a managed vLLM: run by the ``vllm`` tier, which has vLLM."""
    return 'kind="vllm"' in block


def _run_python_blocks(page: str, endpoints, tmp_path, *, with_vllm: bool) -> str:
    """Run the page's Python blocks in order (those that need vLLM only ``with_vllm``) and
    check what they print; their output."""
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    for sql in _blocks_of(page, "sql"):
        (tmp_path / "pipeline.sql").write_text(sql)
    script = "\n\n".join(_pointed_at(block, endpoints) for block in _blocks_of(page, "python")
                          if with_vllm or not _needs_vllm(block))
    (tmp_path / "page.py").write_text(script)
    for sim in endpoints:
        sim.reset_stats()
    done = subprocess.run([sys.executable, "page.py"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    for expected in PRINTS.get(page, []):
        assert re.search(expected, done.stdout, re.M), (expected, done.stdout[-3000:])
    return done.stdout


@pytest.mark.vllm
def test_the_readme_runs_with_its_managed_vllm(endpoints, tmp_path):
    """The README's managed-vLLM block, in its place among the others, answers its rows and
    leaves no process of vLLM behind (its guards are counted before and after)."""
    from tests.vllm_engine.test_terminate import vllm_guards

    [block] = [b for b in _blocks_of("README.md", "python") if _needs_vllm(b)]
    assert "vllm.close()" in block
    before = vllm_guards()
    printed = _run_python_blocks("README.md", endpoints, tmp_path, with_vllm=True)
    assert len(re.findall(r"^\d+ rows: \d+ ok", printed, re.M)) >= 2, printed[-3000:]
    assert vllm_guards() <= before


@pytest.mark.parametrize("page", _pages_with("python"))
def test_the_python_blocks_run_in_order(page, endpoints, tmp_path):
    _run_python_blocks(page, endpoints, tmp_path, with_vllm=False)
    # Every endpoint the page names took requests, the key-protected one with its key from the
    # EnvVar.
    python = "\n".join(_blocks_of(page, "python"))
    for address, sim in zip(ADDRESSES, endpoints, strict=True):
        if address in python:
            assert sim.stats(log=False)["requests"] > 0, address


@pytest.mark.parametrize("page", _pages_with("yaml"))
def test_the_yaml_blocks_load_as_components(page):
    from dagster.components.testing import create_defs_folder_sandbox

    for block in _blocks_of(page, "yaml"):
        attributes = yaml.safe_load(block)["attributes"]
        with create_defs_folder_sandbox() as sandbox:
            path = sandbox.defs_folder_path / "page_component"
            path.mkdir()
            (path / "defs.yaml").write_text(block)
            with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
                asset = defs.get_assets_def(attributes["name"])
                group = attributes.get("asset_attributes", {}).get("group_name")
                if group:
                    assert next(iter(asset.specs)).group_name == group
                if "resource" in attributes:
                    assert attributes.get("resource_key", "llm") in defs.resources


def test_the_bash_block_runs_the_example_on_the_given_endpoints(endpoints, tmp_path):
    [first, real_servers] = _blocks_of("README.md", "bash")
    assert "pytest" in first  # the two commands CI runs itself
    assert _text("README.md").split("\n", 3)[2] == "```bash"  # and they open the README
    for name in ("run_example.py", "definitions.py", "workspace.yaml", "dagster.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("assets", "resources"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    for sim in endpoints:
        sim.reset_stats()
    env = _env()
    env.pop("DAGSTER_HOME", None)  # the copied dagster.yaml's, under the copied folder
    env["BATCHLLM_API_KEY"] = "sk-example"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", _pointed_at(real_servers, endpoints)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    assert "classified" in done.stdout
    assert sum(sim.stats(log=False)["requests"] for sim in endpoints) > 0


def test_the_layout_names_only_paths_that_exist():
    [(page, layout)] = [(page, body) for page in PAGES for body in _blocks_of(page, "text")
                        if body.startswith("dagster_batchllm/")]
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
            assert path.exists(), f"{page}'s layout names {path.relative_to(ROOT)}"
        if names.endswith("/") and "," not in names:
            parents.append(names.rstrip("/"))


def _prose(page: str) -> str:
    """The page without its code blocks."""
    return re.sub(r"^```\w*\n.*?^```$", "", _text(page), flags=re.S | re.M)


def _anchors(page: str) -> set[str]:
    """GitHub's anchors for the page's headings."""
    headings = re.findall(r"^#+ (.+)$", _prose(page), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES)
def test_the_links_lead_somewhere(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = ((ROOT / page).parent / path).resolve() if path else ROOT / page
        assert linked.exists(), f"{page} links to {target}"
        if anchor:
            assert anchor in _anchors(linked.relative_to(ROOT).as_posix()), \
                f"{page} links to {target}: no such heading"


def _importable(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                value = getattr(value, attribute)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", PAGES)
def test_the_names_and_paths_in_the_prose_exist(page):
    spans = re.findall(r"`([^`\n]+)`", _prose(page))
    for name in {m for span in spans for m in re.findall(r"\bdagster_batchllm(?:\.\w+)+", span)}:
        assert _importable(name), f"{page} names {name}"
    folders = (ROOT, ROOT / "dagster_batchllm", ROOT / "bench", (ROOT / page).parent)
    for span in spans:
        if re.fullmatch(r"[\w./-]+\.py", span):
            assert any((folder / span).exists() for folder in folders), f"{page} names {span}"
