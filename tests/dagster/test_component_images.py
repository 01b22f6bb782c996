"""Images through ``defs.yaml``: ``BatchInferenceComponent``'s ``images`` attribute sends each
row's image column with its prompt, as ``infer(images=...)`` does."""

from __future__ import annotations

import hashlib

import dagster as dg
import pandas as pd
import pytest

from dagster_batchllm.testing import SimulatedEndpoint, png_bytes
from tests.dagster.defs_yaml import loaded_defs_yaml

pytestmark = pytest.mark.timeout(60)
PAGES = [png_bytes(2, 2, (200, 0, 0)), png_bytes(3, 2, (0, 200, 0))]


@dg.asset
def scans() -> pd.DataFrame:
    return pd.DataFrame({"doc": ["a", "b", "c"], "page": [*PAGES, "not an image path.txt"]})


def test_the_component_sends_each_rows_image(tmp_path):
    with SimulatedEndpoint(models=("vision",)) as sim:
        attributes = {
            "name": "read_scans", "source": "scans", "prompt": "Read {doc}",
            "images": "{page}", "model": "vision", "output_column": "text",
            "resource": {"endpoints": [{"name": "v", "base_url": sim.base_url,
                                        "models": ["vision"]}],
                         "store_url": f"sqlite:///{tmp_path / 'ledger.db'}"}}
        with loaded_defs_yaml("dagster_batchllm.BatchInferenceComponent", attributes,
                              "read_scans") as (component, defs):
            assert component.images == "{page}"  # the call reads it as column page
            asset = defs.get_assets_def("read_scans")
            llm = defs.resources["llm"]
        result = dg.materialize([scans, asset], resources={"llm": llm})
        assert result.success
        table = result.output_for_node("read_scans")
        for answer, doc, raw in zip(table["text"][:2], "ab", PAGES, strict=True):
            digest = hashlib.sha256(raw).hexdigest()[:12]
            assert answer == f"[sim] Read {doc} [image sha256:{digest}]"
        assert table["text_error"][2].startswith("invalid_input")  # no such file: its own error
        assert sim.stats(log=False)["images"]["images"] == 2
