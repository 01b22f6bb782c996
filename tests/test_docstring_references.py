"""Every cross-reference in the package's docstrings and comments names something that exists.

Modules move (issue 41 moved a dozen); a ``:mod:``/``:class:``/``:func:``/``:meth:``/``:attr:``
reference left behind sends a reader to nothing. The references are resolved the way Sphinx
does: a leading dot is a suffix of some dotted name in the package, a full name must exist, and
a bare name is one of the module's own names (defined or imported) or a member of one of its
classes. Names of other packages (``pandas.DataFrame``) are not ours to check.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = "dagster_batchllm"
ROOT = Path(__file__).resolve().parents[1]
_REFERENCE = re.compile(r":(mod|class|func|meth|attr|data|exc|obj):`~?([^`<>]+?)`")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _names(body: list[ast.stmt], prefix: str = "") -> set[str]:
    """The names a module (or a class, under ``prefix``) defines: functions, classes, their
    members, assignments, imports; and a class's instance attributes (``self.x = ...``)."""
    found: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(prefix + node.name)
            if isinstance(node, ast.ClassDef):
                found |= _names(node.body, f"{prefix}{node.name}.")
            elif prefix:  # a method: what it sets on self is a member of its class
                found |= {prefix + target.attr for target in ast.walk(node)
                          if isinstance(target, ast.Attribute) and isinstance(target.ctx, ast.Store)
                          and isinstance(target.value, ast.Name) and target.value.id == "self"}
        elif isinstance(node, ast.Assign):
            found |= {prefix + t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(prefix + node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom) and not prefix:
            found |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.If | ast.Try):
            found |= _names(node.body, prefix) | _names(node.orelse, prefix)
    return found


def stale_references(root: Path, package: str) -> list[str]:
    modules = {_module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    local = {m: _names(ast.parse(p.read_text(encoding="utf-8")).body)
             for m, p in modules.items()}
    everything = set(modules) | {f"{m}.{n}" for m, names in local.items() for n in names}

    def resolves(target: str, module: str) -> bool:
        target = target.strip().removesuffix("()")
        if target.startswith("."):
            suffix = target.lstrip(".")
            return any(name == suffix or name.endswith("." + suffix) for name in everything)
        head = target.split(".")[0]
        if head == package:
            return target in everything
        if head in local[module]:
            return True
        if "." not in target:
            return any(name.endswith("." + target) for name in local[module])
        return True  # another package's name

    return [f"{path.relative_to(root)}:{number}: :{role}:`{target}`"
            for module, path in modules.items()
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            for role, target in _REFERENCE.findall(line)
            if not resolves(target, module)]


def test_every_reference_in_the_package_resolves():
    stale = stale_references(ROOT, PACKAGE)
    assert not stale, "References to nothing:\n  " + "\n  ".join(stale)


def test_the_check_finds_a_reference_to_a_moved_module(tmp_path):
    package = tmp_path / "pkg"
    (package / "run").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "run" / "__init__.py").write_text("")
    (package / "run" / "engine.py").write_text(
        '"""Runs rows; see :mod:`.prompts` and :class:`.engine.Engine`."""\n'
        "class Engine:\n"
        '    """:meth:`start` and :attr:`rows`; :func:`pkg.run.engine.gone`."""\n'
        "    def start(self):\n"
        "        self.rows = []\n")
    assert stale_references(tmp_path, "pkg") == [
        "pkg/run/engine.py:1: :mod:`.prompts`",
        "pkg/run/engine.py:3: :func:`pkg.run.engine.gone`",
    ]
