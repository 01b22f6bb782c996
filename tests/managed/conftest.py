"""The example dataset's generator, loaded from its file (assets/data is not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

DATA_DIR = Path(__file__).resolve().parents[2] / "assets" / "data"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location(
        "generate_transcripts", DATA_DIR / "generate_transcripts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
