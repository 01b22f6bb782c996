"""A Component loaded from a ``defs.yaml``, as a code location loading it builds it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import yaml
from dagster.components.testing import create_defs_folder_sandbox


@contextmanager
def loaded_defs_yaml(component_type: str, attributes: dict[str, Any],
                     folder: str) -> Iterator[tuple[Any, Any]]:
    """``(component, definitions)`` of ``{type: component_type, attributes: attributes}``
    written to ``<defs folder>/<folder>/defs.yaml`` in a sandbox project."""
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.defs_folder_path / folder
        path.mkdir()
        (path / "defs.yaml").write_text(
            yaml.safe_dump({"type": component_type, "attributes": attributes}))
        with sandbox.load_component_and_build_defs(defs_path=path) as loaded:
            yield loaded
