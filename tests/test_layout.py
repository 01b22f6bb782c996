"""The package's layers and shape, checked from its source: no import cycles between modules or
between folders (type-only imports included), a core whose layers import only downward, no Dagster
or PySpark in the core, no product module importing the harness (``testing``, ``simulator``), no
import of a module path that does not exist, and modules of a readable size.

The imports are read statically (``ast``) from every module under ``dagster_batchllm/``, those
inside functions included (a lazy import is still a dependency), those under
``if TYPE_CHECKING:`` left out (they never run) unless a check asks for them. ``from . import
x`` inside a package is an edge to the submodule ``x``; ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, to the module that defines ``name`` when ``pkg`` re-exports it
lazily (its ``__init__`` maps names to their modules in ``_HOMES``, as the core's does: importing
the name runs that module and nothing else), else to ``pkg``. Importing a submodule also runs its
package's ``__init__``, but that is not an edge: a package that re-exports its submodules forms
a cycle only when a submodule imports its own package back.

The layers outside the core import it only through ``dagster_batchllm.core`` (its ``__all__``),
and that ``__all__`` holds exactly the names they use.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = "dagster_batchllm"
ROOT = Path(__file__).resolve().parents[1]

# Code that runs without Dagster and PySpark: the core, the OpenAI-protocol server and the
# simulator built on it, the AI-function catalogue and what Spark executors import.
NO_FRAMEWORK_PACKAGES = ("core", "openai_server", "simulator", "ai_functions")
# The harness: what tests, benchmarks and users' own tests import. It may import the product; no
# other module imports it, not lazily in a function, not for type checkers.
HARNESS_PACKAGES = ("testing", "simulator")
SPARK_EXECUTOR_MODULES = ("spark.worker", "spark.job", "spark.budget", "spark.model_worker",
                          "spark.aggregate_worker")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line})"


@dataclass
class ImportGraph:
    """Every module of a package, its imports of the package's modules and of the outside."""

    modules: dict[str, Path] = field(default_factory=dict)
    edges: dict[str, list[Edge]] = field(default_factory=dict)  # internal, by source
    lazy: dict[str, dict[str, str]] = field(default_factory=dict)  # package -> name -> module
    external: dict[str, dict[str, int]] = field(default_factory=dict)  # top-level name -> line
    missing: list[str] = field(default_factory=list)  # imports of paths that name no module

    def imports_of(self, module: str) -> set[str]:
        return {e.target for e in self.edges.get(module, [])}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, type_checking: bool = False) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: anywhere, except under ``if TYPE_CHECKING:`` (with
    ``type_checking``, those too: every import a type checker reads)."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif not type_checking and isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))


def build_graph(root: Path, package: str, type_checking: bool = False) -> ImportGraph:
    """The import graph of ``root / package`` (``root`` is the directory holding the package);
    with ``type_checking``, the imports under ``if TYPE_CHECKING:`` are edges too."""
    graph = ImportGraph()
    for path in sorted((root / package).rglob("*.py")):
        graph.modules[module_name(path, root)] = path
        if path.name == "__init__.py":
            homes = lazy_homes(path, module_name(path, root))
            if homes:
                graph.lazy[module_name(path, root)] = homes
    for module, path in graph.modules.items():
        _add_imports(graph, package, module, path, type_checking)
    return graph


def lazy_homes(init: Path, package: str) -> dict[str, str]:
    """The names a package's ``__init__`` re-exports lazily, each with its module: read from
    its module-level ``_HOMES = {".module": ("name", ...)}`` (empty without one)."""
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(
            node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id == "_HOMES" for t in targets) and node.value:
            homes = ast.literal_eval(node.value)
            return {name: package + module if module.startswith(".") else module
                    for module, names in homes.items() for name in names}
    return {}


def _add_imports(graph: ImportGraph, package: str, module: str, path: Path,
                 type_checking: bool) -> None:
    edges = graph.edges.setdefault(module, [])
    external = graph.external.setdefault(module, {})

    def internal(name: str, line: int) -> None:
        # The module itself, else the nearest enclosing package that is one of ours.
        target = name
        while target not in graph.modules and "." in target:
            target = target.rpartition(".")[0]
        if target in graph.modules:
            edges.append(Edge(module, target, line))

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in _imports(tree, type_checking):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top == package:
                    if alias.name not in graph.modules:
                        graph.missing.append(f"{module} imports {alias.name} (line {node.lineno})")
                    internal(alias.name, node.lineno)
                else:
                    external.setdefault(top, node.lineno)
            continue
        if node.level:
            base = module if path.name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        if source.split(".")[0] != package:
            external.setdefault(source.split(".")[0], node.lineno)
            continue
        if source not in graph.modules:
            graph.missing.append(f"{module} imports from {source} (line {node.lineno})")
        for alias in node.names:
            candidate = f"{source}.{alias.name}"
            if candidate not in graph.modules:
                candidate = graph.lazy.get(source, {}).get(alias.name, source)
            internal(candidate, node.lineno)


# -- the analyses ----------------------------------------------------------------------------------
def import_cycles(graph: ImportGraph) -> list[tuple[list[str], list[Edge]]]:
    """Every group of modules that import each other (a strongly connected component), with
    one of its cycles as edges."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(start: str) -> None:
        # Tarjan's algorithm, iterative (a deep chain must not hit the recursion limit).
        work = [(start, iter(sorted(graph.imports_of(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.imports_of(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1 or node in graph.imports_of(node):
                    groups.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            connect(module)
    return [(group, _cycle_in(graph, group)) for group in sorted(groups)]


def _cycle_in(graph: ImportGraph, group: list[str]) -> list[Edge]:
    """A shortest cycle through the group's first module, as edges."""
    members = set(group)
    start = group[0]
    came_by: dict[str, Edge] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for edge in graph.edges.get(node, []):
            if edge.target not in members:
                continue
            if edge.target == start:
                path = [edge]
                while path[0].source != start:
                    path.insert(0, came_by[path[0].source])
                return path
            if edge.target not in came_by:
                came_by[edge.target] = edge
                queue.append(edge.target)
    raise AssertionError(f"no cycle through {start} in {group}")


def is_framework(name: str) -> bool:
    """Dagster (and its own packages) or PySpark."""
    return name in ("dagster", "pyspark") or (name.startswith("dagster_") and name != PACKAGE)


def framework_imports(graph: ImportGraph, module: str) -> list[list[Edge | str]]:
    """Every way ``module`` reaches Dagster or PySpark: the chain of package imports that leads
    to a module importing it, ending with that import."""
    came_by: dict[str, Edge | None] = {module: None}
    queue = deque([module])
    found: list[list[Edge | str]] = []
    while queue:
        node = queue.popleft()
        for name, line in sorted(graph.external.get(node, {}).items()):
            if is_framework(name):
                chain: list[Edge | str] = [f"{node} imports {name} (line {line})"]
                step = came_by[node]
                while step is not None:
                    chain.insert(0, step)
                    step = came_by[step.source]
                found.append(chain)
        for edge in graph.edges.get(node, []):
            if edge.target not in came_by:
                came_by[edge.target] = edge
                queue.append(edge.target)
    return found


def framework_free_modules(graph: ImportGraph) -> list[str]:
    prefixes = tuple(f"{PACKAGE}.{p}" for p in NO_FRAMEWORK_PACKAGES)
    executors = {f"{PACKAGE}.{m}" for m in SPARK_EXECUTOR_MODULES}
    return sorted(m for m in graph.modules
                  if m in executors or any(m == p or m.startswith(p + ".") for p in prefixes))


def _in_harness(module: str) -> bool:
    return any(module == f"{PACKAGE}.{p}" or module.startswith(f"{PACKAGE}.{p}.")
               for p in HARNESS_PACKAGES)


def harness_imports(graph: ImportGraph) -> list[Edge]:
    """Every import of the harness by a module outside it."""
    return [edge for module in sorted(graph.modules) if not _in_harness(module)
            for edge in graph.edges.get(module, []) if _in_harness(edge.target)]


def _describe(chain: Iterable[Edge | str]) -> str:
    return "\n    ".join(str(step) for step in chain)


# The core's layers, top to bottom: each imports only its own layer and those below it, type-only
# imports included. The client drives batch passes, which drive runs; a run drives the job's task
# and a delivery; both keep answers in the ledger; and every layer shares the leaf's plain types.
CORE_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("client", ("core", "core.client")),
    ("batch orchestration", ("core.batch",)),
    ("run", ("core.run",)),
    ("tasks", ("core.tasks",)),
    ("delivery", ("core.delivery",)),
    ("ledger", ("core.ledger",)),
    ("shared types", tuple(f"core.{name}" for name in (
        "requests", "results", "errors", "error_kinds", "settings", "descriptions", "pricing",
        "usage", "redaction", "file_policy"))),
)


def core_layer(module: str, package: str = PACKAGE,
               layers: tuple[tuple[str, tuple[str, ...]], ...] = CORE_LAYERS) -> int | None:
    """The index of the core layer ``module`` belongs to (None: not in the core, or in no
    layer). A package prefix covers its submodules; ``core`` itself only its ``__init__``."""
    for i, (_name, prefixes) in enumerate(layers):
        for prefix in prefixes:
            full = f"{package}.{prefix}"
            if module == full or (prefix != "core" and module.startswith(full + ".")):
                return i
    return None


def layer_violations(graph: ImportGraph, package: str = PACKAGE,
                     layers: tuple[tuple[str, tuple[str, ...]], ...] = CORE_LAYERS
                     ) -> list[str]:
    """Core modules in no layer, and imports from a core layer up to a higher one."""
    found = []
    for module in sorted(graph.modules):
        if not (module == f"{package}.core" or module.startswith(f"{package}.core.")):
            continue
        here = core_layer(module, package, layers)
        if here is None:
            found.append(f"{module} is in no core layer")
            continue
        for edge in graph.edges.get(module, []):
            there = core_layer(edge.target, package, layers)
            if there is not None and there < here:
                found.append(f"{edge}: {layers[here][0]} imports {layers[there][0]}")
    return found


def folder_graph(graph: ImportGraph, package: str = PACKAGE,
                 layers: tuple[tuple[str, tuple[str, ...]], ...] = CORE_LAYERS) -> ImportGraph:
    """The import graph one level up: each top-level folder of the package is a node, and so
    is each core layer (the core's root holds both the client and the shared types)."""
    def node(module: str) -> str:
        layer = core_layer(module, package, layers)
        if layer is not None:
            return f"{package}.core[{layers[layer][0]}]"
        return ".".join(module.split(".")[:2])

    folders = ImportGraph()
    for module in graph.modules:
        folders.modules.setdefault(node(module), graph.modules[module])
    for module, edges in graph.edges.items():
        for edge in edges:
            source, target = node(module), node(edge.target)
            known = folders.edges.setdefault(source, [])
            if source != target and all(e.target != target for e in known):
                known.append(Edge(source, target, edge.line))
    return folders


# -- the package -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return build_graph(ROOT, PACKAGE)


@pytest.fixture(scope="module")
def typed_graph() -> ImportGraph:
    """With the imports under ``if TYPE_CHECKING:``: what a reader and a type checker follow."""
    return build_graph(ROOT, PACKAGE, type_checking=True)


def test_the_graph_sees_the_package(graph):
    """The checks below are only as good as the graph: it holds what the source says."""
    assert f"{PACKAGE}.core.client" in graph.modules
    assert f"{PACKAGE}.core.client" in graph.imports_of(f"{PACKAGE}.spark.worker")
    assert f"{PACKAGE}.core.tasks.chat.call" in graph.imports_of(f"{PACKAGE}.core.client")
    assert "dagster" in graph.external[f"{PACKAGE}.resource"]
    # A function-level import of pyspark is seen (ai_query_col imports it when called).
    assert "pyspark" in graph.external[f"{PACKAGE}.spark.columns"]
    # TYPE_CHECKING imports are not: the root package imports the resource only for type checkers.
    assert f"{PACKAGE}.resource" not in graph.imports_of(PACKAGE)


def test_no_import_cycles_not_even_for_type_checkers(typed_graph):
    cycles = import_cycles(typed_graph)
    assert not cycles, "Import cycles among the package's modules:\n  " + "\n  ".join(
        f"{', '.join(group)}; for example:\n    {_describe(cycle)}" for group, cycle in cycles)


def test_the_core_layers_import_only_downward(typed_graph):
    found = layer_violations(typed_graph)
    assert not found, "Core imports against its layers:\n  " + "\n  ".join(found)


def test_no_import_cycles_between_folders(typed_graph):
    cycles = import_cycles(folder_graph(typed_graph))
    assert not cycles, "Folders that import each other:\n  " + "\n  ".join(
        f"{', '.join(group)}; for example:\n    {_describe(cycle)}" for group, cycle in cycles)


def test_core_simulator_catalogue_and_spark_executors_import_no_dagster_or_pyspark(graph):
    modules = framework_free_modules(graph)
    assert f"{PACKAGE}.spark.worker" in modules and f"{PACKAGE}.core.run.engine" in modules
    problems = {m: framework_imports(graph, m) for m in modules}
    problems = {m: chains for m, chains in problems.items() if chains}
    assert not problems, "Modules that must run without Dagster and PySpark import them:\n  " + \
        "\n  ".join(f"{m}:\n    {_describe(chains[0])}" for m, chains in problems.items())


def test_no_product_module_imports_the_harness():
    """The product serves through its own OpenAI-protocol server; the simulator and the testing
    package stay importable for tests (users' own included), but nothing else imports them, not
    even lazily or for type checkers."""
    typed = build_graph(ROOT, PACKAGE, type_checking=True)
    assert f"{PACKAGE}.openai_server" in typed.imports_of(f"{PACKAGE}.managed.classical.server")
    assert f"{PACKAGE}.openai_server.endpoint" in typed.imports_of(
        f"{PACKAGE}.simulator.endpoint")  # the harness builds on the product, not the other way
    found = harness_imports(typed)
    assert not found, "Product modules importing the harness (testing/, simulator/):\n  " + \
        "\n  ".join(str(e) for e in found)


def test_every_imported_module_path_exists(graph):
    found = graph.missing
    assert not found, "Imports of module paths that do not exist:\n  " + "\n  ".join(found)


# At most this many modules directly in core/ (the rest in subpackages by concern), and no module
# longer than this. Modules are split by concern, never by size: the bound is soft and well above
# what one concern takes here (a 450-line cap split single concepts into pairs and mixins); a
# module past it most likely holds two.
CORE_MODULES_AT_MOST = 15
MODULE_LINES_AT_MOST = 800


def test_core_holds_few_modules_directly():
    direct = sorted(p.name for p in (ROOT / PACKAGE / "core").glob("*.py"))
    assert len(direct) <= CORE_MODULES_AT_MOST, direct


def test_no_module_is_longer_than_the_bound(graph):
    long = {m: n for m, path in graph.modules.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES_AT_MOST}
    assert not long, f"modules over {MODULE_LINES_AT_MOST} lines: {long}"


# -- the core's one surface ---------------------------------------------------------------------
@dataclass(frozen=True)
class CoreImport:
    module: str  # the importing module, outside the core
    source: str  # what it imports from: the core's package, or one of its modules
    names: tuple[str, ...]  # the names imported (none for a plain ``import``)
    line: int

    def __str__(self) -> str:
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.module} line {self.line}: {self.source}{names}"


def _outside_core(module: str, package: str) -> bool:
    return not (module == f"{package}.core" or module.startswith(f"{package}.core."))


def core_imports(graph: ImportGraph, package: str = PACKAGE) -> list[CoreImport]:
    """Every import of the core by a module outside it, type-only and lazy ones included; and
    every string constant that names a core module (``importlib.import_module("...")``, a
    lazy map), as an import of it without names."""
    core = f"{package}.core"
    found = []
    for module, path in sorted(graph.modules.items()):
        if not _outside_core(module, package):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _imports(tree, type_checking=True):
            if isinstance(node, ast.Import):
                found += [CoreImport(module, a.name, (), node.lineno) for a in node.names
                          if a.name == core or a.name.startswith(core + ".")]
                continue
            base = module if path.name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            source = (f"{base}.{node.module}" if node.module else base) if node.level \
                else node.module or ""
            if source == core or source.startswith(core + "."):
                found.append(CoreImport(module, source, tuple(a.name for a in node.names),
                                        node.lineno))
        found += [CoreImport(module, node.value, (), node.lineno) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value.startswith(core + ".") and node.value.isascii()
                  and node.value.replace(".", "").replace("_", "").isalnum()]
    return found


@pytest.fixture(scope="module")
def outer_core_imports(graph) -> list[CoreImport]:
    return core_imports(graph)


def test_outer_layers_import_the_core_only_through_its_surface(outer_core_imports):
    """``from ..core import X``, never ``from ..core.settings import X``: what the core offers
    the rest of the package is its ``__all__``, one list to read and to keep small."""
    found = [i for i in outer_core_imports if i.source != f"{PACKAGE}.core"]
    assert not found, ("Imports of the core's modules from outside it (import the name from "
                       f"{PACKAGE}.core, adding it to its __all__ if it must be offered):\n  "
                       + "\n  ".join(str(i) for i in found))


def _core_surface() -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The core's ``__all__``, its lazy map (name -> module) and what its ``TYPE_CHECKING``
    block imports (name -> module), read from its source."""
    path = ROOT / PACKAGE / "core" / "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exported = next(ast.literal_eval(node.value) for node in tree.body
                    if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
    typed = {alias.name: f"{PACKAGE}.core.{node.module}"
             for block in tree.body if isinstance(block, ast.If) and _is_type_checking(block.test)
             for node in block.body if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    return exported, lazy_homes(path, f"{PACKAGE}.core"), typed


def test_every_name_the_core_offers_resolves(graph):
    """Each name of ``__all__`` is defined (or imported) in the module the lazy map names, and
    type checkers see the same names from the same modules; importing the core loads none of
    them until one is used."""
    exported, homes, typed = _core_surface()
    assert len(exported) == len(set(exported)), "names listed twice in the core's __all__"
    assert set(exported) == set(homes), (
        f"in __all__ but not in _HOMES: {sorted(set(exported) - set(homes))}; in _HOMES but "
        f"not in __all__: {sorted(set(homes) - set(exported))}")
    assert typed == homes, "the TYPE_CHECKING imports differ from _HOMES: " + ", ".join(
        f"{n}: {typed.get(n)} / {homes.get(n)}" for n in sorted(set(typed) | set(homes))
        if typed.get(n) != homes.get(n))
    undefined = [f"{name} (not in {module})" for name, module in sorted(homes.items())
                 if module not in graph.modules
                 or name not in _top_level_names(graph.modules[module])]
    assert not undefined, "names of the core's __all__ that do not resolve: " + ", ".join(
        undefined)


@pytest.mark.slow  # imports the whole core (pandas, SQLAlchemy, the HTTP clients): ~0.7 s
def test_every_name_the_core_offers_imports():
    import subprocess
    import sys

    code = ("import sys, dagster_batchllm.core as core\n"
            "assert 'dagster_batchllm.core.client' not in sys.modules\n"  # lazy
            "print(len([getattr(core, name) for name in core.__all__]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(_core_surface()[0])


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_the_core_offers_exactly_what_the_outer_layers_use(outer_core_imports):
    """No dead name in the core's ``__all__`` and none missing: it is the names the layers
    outside the core import from it, the package's own re-exports among them."""
    exported, _homes, _typed = _core_surface()
    used = {name for i in outer_core_imports if i.source == f"{PACKAGE}.core"
            for name in i.names}
    top = ast.parse((ROOT / PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    reexported = {name for node in top.body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)
                  for name, module in ast.literal_eval(node.value).items()
                  if module == f"{PACKAGE}.core"}
    assert reexported, "the package re-exports no core name: has _LAZY moved?"
    wanted = used | reexported
    assert set(exported) == wanted, (
        f"offered but used by no layer outside the core: {sorted(set(exported) - wanted)}; "
        f"used but not in __all__: {sorted(wanted - set(exported))}")


# -- the checks themselves, on a package made for them -------------------------------------------
def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checks_find_cycles_framework_imports_and_missing_paths(tmp_path):
    _write(tmp_path, {
        f"{PACKAGE}/__init__.py": "",
        f"{PACKAGE}/core/__init__.py": "",
        f"{PACKAGE}/core/client.py": "",
        # core.a -> core.b (in a function) -> core.a: a cycle; core.b also reaches dagster.
        f"{PACKAGE}/core/a.py": "from . import b\n",
        f"{PACKAGE}/core/b.py": "def f():\n    from .a import thing\n    from ..top import x\n",
        f"{PACKAGE}/top.py": "import dagster\n",
        # Only for type checkers: neither an edge nor an import of pyspark.
        f"{PACKAGE}/core/c.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    import pyspark\n    from . import a\n"
                                 f"else:\n    from {PACKAGE} import client\n"),
        # A package re-exporting its submodule is no cycle...
        f"{PACKAGE}/spark/__init__.py": "from .worker import run\n",
        f"{PACKAGE}/spark/worker.py": "import json\n",
        # ...unless the submodule imports the package back.
        f"{PACKAGE}/sql/__init__.py": "from .api import run\n",
        f"{PACKAGE}/sql/api.py": f"from {PACKAGE}.sql import other\n",
    })
    graph = build_graph(tmp_path, PACKAGE)

    cycles = import_cycles(graph)
    assert [group for group, _ in cycles] == [[f"{PACKAGE}.core.a", f"{PACKAGE}.core.b"],
                                              [f"{PACKAGE}.sql", f"{PACKAGE}.sql.api"]]
    assert [str(e) for e in cycles[0][1]] == [f"{PACKAGE}.core.a -> {PACKAGE}.core.b (line 1)",
                                              f"{PACKAGE}.core.b -> {PACKAGE}.core.a (line 2)"]

    [chain] = framework_imports(graph, f"{PACKAGE}.core.a")
    assert [str(s) for s in chain] == [
        f"{PACKAGE}.core.a -> {PACKAGE}.core.b (line 1)",
        f"{PACKAGE}.core.b -> {PACKAGE}.top (line 3)",
        f"{PACKAGE}.top imports dagster (line 1)",
    ]
    assert framework_imports(graph, f"{PACKAGE}.spark.worker") == []
    assert "pyspark" not in graph.external[f"{PACKAGE}.core.c"]
    assert graph.imports_of(f"{PACKAGE}.core.c") == {PACKAGE}

    assert graph.missing == []
    _write(tmp_path, {f"{PACKAGE}/core/d.py": f"import {PACKAGE}.core.gone\nfrom .gone import x\n"})
    assert sorted(build_graph(tmp_path, PACKAGE).missing) == [
        f"{PACKAGE}.core.d imports {PACKAGE}.core.gone (line 1)",
        f"{PACKAGE}.core.d imports from {PACKAGE}.core.gone (line 2)"]


def test_a_lazy_reexport_is_an_edge_to_its_module_and_a_deep_core_import_is_found(tmp_path):
    _write(tmp_path, {
        f"{PACKAGE}/__init__.py": "",
        f"{PACKAGE}/core/__init__.py": ('_HOMES = {".client": ("Client",), '
                                        '".errors": ("Oops",)}\n'),
        f"{PACKAGE}/core/client.py": "class Client: ...\n",
        f"{PACKAGE}/core/errors.py": "class Oops(Exception): ...\n",
        f"{PACKAGE}/sql/__init__.py": "",
        f"{PACKAGE}/sql/api.py": "from ..core import Client, Oops\n",
        f"{PACKAGE}/sql/deep.py": ("def later():\n    from ..core.errors import Oops\n"
                                   f"NAME = '{PACKAGE}.core.client'\n"),
    })
    graph = build_graph(tmp_path, PACKAGE)
    assert graph.imports_of(f"{PACKAGE}.sql.api") == {f"{PACKAGE}.core.client",
                                                      f"{PACKAGE}.core.errors"}
    assert [str(i) for i in core_imports(graph)] == [
        f"{PACKAGE}.sql.api line 1: {PACKAGE}.core (Client, Oops)",
        f"{PACKAGE}.sql.deep line 2: {PACKAGE}.core.errors (Oops)",
        f"{PACKAGE}.sql.deep line 3: {PACKAGE}.core.client",
    ]


def test_the_harness_check_finds_lazy_and_type_only_imports(tmp_path):
    _write(tmp_path, {
        f"{PACKAGE}/__init__.py": "",
        f"{PACKAGE}/core/__init__.py": "",
        # The harness may import the product...
        f"{PACKAGE}/testing/__init__.py": "from ..core import helpers\n",
        f"{PACKAGE}/core/helpers.py": "",
        f"{PACKAGE}/simulator/__init__.py": f"import {PACKAGE}.testing\n",
        # ...the product may not import it: in a function, or for type checkers only.
        f"{PACKAGE}/managed/__init__.py": "",
        f"{PACKAGE}/managed/lazy.py": "def start():\n    from ..testing import Endpoint\n",
        f"{PACKAGE}/managed/typed.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        f"    from {PACKAGE}.simulator import Endpoint\n"),
    })
    typed = build_graph(tmp_path, PACKAGE, type_checking=True)
    assert [str(e) for e in harness_imports(typed)] == [
        f"{PACKAGE}.managed.lazy -> {PACKAGE}.testing (line 2)",
        f"{PACKAGE}.managed.typed -> {PACKAGE}.simulator (line 3)"]
    # Without type_checking the graph holds what runs: the type-only import is not in it.
    assert [str(e) for e in harness_imports(build_graph(tmp_path, PACKAGE))] == [
        f"{PACKAGE}.managed.lazy -> {PACKAGE}.testing (line 2)"]


def test_the_layer_and_folder_checks_find_upward_and_circular_imports(tmp_path):
    layers = (("client", ("core", "core.client")), ("run", ("core.run",)),
              ("shared types", ("core.requests",)))
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/core/__init__.py": "",
        "pkg/core/client.py": "from .run import engine\n",
        "pkg/core/run/__init__.py": "",
        "pkg/core/run/engine.py": "from ..requests import Request\n",
        # Only for type checkers, and still against the layers.
        "pkg/core/requests.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from .run.engine import Engine\nclass Request: ...\n"),
        "pkg/core/stray.py": "",
        "pkg/ops/__init__.py": "",
        "pkg/ops/filter.py": "from ..catalogue import functions\n",
        "pkg/catalogue/__init__.py": "",
        "pkg/catalogue/functions.py": "def later():\n    from ..ops import filter\n",
    })
    typed = build_graph(tmp_path, "pkg", type_checking=True)
    assert layer_violations(typed, "pkg", layers) == [
        "pkg.core.requests -> pkg.core.run.engine (line 3): shared types imports run",
        "pkg.core.stray is in no core layer",
    ]
    assert layer_violations(build_graph(tmp_path, "pkg"), "pkg", layers) == [
        "pkg.core.stray is in no core layer"]
    folders = import_cycles(folder_graph(typed, "pkg", layers))
    assert [group for group, _cycle in folders] == [
        ["pkg.catalogue", "pkg.ops"],
        ["pkg.core[run]", "pkg.core[shared types]"],
    ]
