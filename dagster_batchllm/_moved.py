"""Module paths of releases before the layered layout, kept importable.

``import dagster_batchllm.client`` (and the other paths below) give the module at its new
home, the same module object, so ``isinstance`` checks and pickles agree whichever path a user
wrote. Nothing inside the package uses these paths (a test checks it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

_PACKAGE = "dagster_batchllm"

# old path -> new path, both below the package
MOVED = {
    "client": "core.client",
    "settings": "core.settings",
    "results": "core.results",
    "errors": "core.errors",
    "ledger": "core.ledger",
    "prompts": "core.prompts",
    "engine": "core.engine",
    "pool": "core.pool",
    "transport": "core.transport",
    "retries": "core.retries",
    "budget": "core.limits",
    "coordination": "core.coordination",
    "ledger_writer": "core.ledger_writer",
    "component": "components.inference",
    "new_data_sensor": "sensors.new_data",
    "llama_server": "managed.llama_server",
    "local": "managed.classical",
    "sql.functions": "ai_functions.catalogue",
    "sql.calls": "ai_functions.calls",
    "sql.types": "ai_functions.types",
    "sql.schemas": "ai_functions.schemas",
    "sql.outcomes": "ai_functions.outcomes",
}


def new_path(fullname: str) -> str | None:
    """The module an old dotted path now lives at (its submodules follow it), or None."""
    if not fullname.startswith(_PACKAGE + "."):
        return None
    old = fullname[len(_PACKAGE) + 1:]
    for prefix, target in MOVED.items():
        if old == prefix or old.startswith(prefix + "."):
            return f"{_PACKAGE}.{target}{old[len(prefix):]}"
    if old.startswith("testing.") and old != "testing.__main__":  # the simulator's modules
        return f"{_PACKAGE}.simulator.{old[len('testing.'):]}"
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if new_path(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        # The module at its new home: importlib keeps its own __name__ and __spec__.
        return importlib.import_module(new_path(spec.name))

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        # First: a moved package's old name must not let the path finder load its submodules
        # a second time under the old name.
        sys.meta_path.insert(0, _MovedModules())
