"""The example's documents pipeline (invoice PDFs -> pages -> fields -> table) materialized with
``dg.materialize``: on the embedded default, every field is what the invoice prints; the scan
fails alone, saying a vision model is needed; a rerun sends nothing; on a (simulated) vision
endpoint the scan's page image is what is sent for it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from assets.data.generate_invoices import example_invoices
from assets.documents import INVOICE_SCHEMA, document_assets
from dagster_batchllm import BatchInferenceResource, ManagedEndpoint
from dagster_batchllm.documents import parse_document
from dagster_batchllm.testing import SimulatedEndpoint
from resources.warehouse import WarehouseIOManager, WarehouseResource

pytestmark = pytest.mark.timeout(180)
FIELDS = list(INVOICE_SCHEMA["properties"])


@pytest.fixture
def run_pipeline(tmp_path, instance):
    """Materialize the four assets with the given llm resource; the result and the warehouse."""
    warehouse = WarehouseResource(url=f"sqlite:///{tmp_path / 'warehouse.db'}")
    config = {"ops": {"invoice_pdfs": {"config": {"folder": str(tmp_path / "invoices")}}}}

    def run(llm):
        result = dg.materialize(document_assets, instance=instance, run_config=config,
                                resources={"llm": llm, "warehouse": warehouse,
                                           "io_manager": WarehouseIOManager(warehouse=warehouse)})
        assert result.success
        return result, warehouse

    return run


def embedded(tmp_path) -> BatchInferenceResource:
    return BatchInferenceResource(managed_endpoints=[ManagedEndpoint(name="embedded")],
                                  default_model="local",
                                  store_url=f"sqlite:///{tmp_path / 'ledger.db'}")


def test_on_the_embedded_default_every_field_is_what_the_invoice_prints(run_pipeline,
                                                                       tmp_path):
    result, warehouse = run_pipeline(embedded(tmp_path))

    truth = {i.document_id: i for i in example_invoices()}
    table = warehouse.read_table("invoices").set_index("document_id")
    pages = warehouse.read_table("invoice_pages")
    assert sorted(table.index) == sorted(truth)
    assert pages.groupby("document_id").size().max() == 2  # long invoices run onto page 2
    for document_id, invoice in truth.items():
        row = table.loc[document_id]
        if invoice.scanned:
            assert row["fields_error"].startswith("unsupported_task: ")
            assert "vision model endpoint is needed" in row["fields_error"]
            assert row[FIELDS].isna().all()  # nothing made up for it
            continue
        assert row["fields_error"] is None, row["fields_error"]
        assert {f: row[f] for f in FIELDS} == {
            "invoice_number": invoice.invoice_number, "invoice_date": invoice.invoice_date,
            "amount_due": invoice.amount_due, "customer_name": invoice.customer_name,
            "customer_email": invoice.customer_email, "customer_phone": invoice.customer_phone,
        }, document_id
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks and all(checks.values()), checks  # the one scan stays under the warning rate


@pytest.mark.slow
def test_a_rerun_sends_nothing(run_pipeline, tmp_path):
    llm = embedded(tmp_path)
    first, _ = run_pipeline(llm)
    again, _ = run_pipeline(llm)

    def sent(result):
        [materialization] = result.asset_materializations_for_node("invoices")
        return materialization.metadata["batchllm/run/requests"].value

    # 12 answered + the scan, refused (422) and not retried; the rerun answers the 12 from the
    # ledger and sends the scan again, since a refusal is not an answer.
    assert sent(first) == 13
    assert sent(again) == 1


def test_on_a_vision_endpoint_the_scan_sends_its_page_image(run_pipeline, tmp_path):
    with SimulatedEndpoint(models=("vision-model",)) as sim:
        llm = BatchInferenceResource(
            endpoints=[{"name": "vision", "base_url": sim.base_url, "models": ["vision-model"]}],
            default_model="vision-model", store_url=f"sqlite:///{tmp_path / 'ledger.db'}")
        _, warehouse = run_pipeline(llm)
        images = sim.stats(log=False)["images"]

    table = warehouse.read_table("invoices").set_index("document_id")
    scan = next(i for i in example_invoices() if i.scanned)
    png = Path(tmp_path / "invoices" / f"{scan.document_id}-page1.png").read_bytes()
    assert parse_document(tmp_path / "invoices" / f"{scan.document_id}.pdf")[0].text == ""
    assert (images["requests"], images["images"], images["bytes"]) == (1, 1, len(png))
    assert table["fields_error"].isna().all()
    sent = json.loads(warehouse.read_table("invoice_documents").set_index("document_id")
                      .loc[scan.document_id, "messages"])
    url = sent[1]["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert hashlib.sha256(png).hexdigest() == hashlib.sha256(
        __import__("base64").b64decode(url.split(",", 1)[1])).hexdigest()


def test_an_unreadable_pdf_is_its_own_row_with_the_reason(tmp_path):
    from assets.documents import invoice_documents, invoice_pages
    from dagster_batchllm.testing.pdf_writer import write_text_pdf
    from tests.documents.samples import encrypted_pdf

    (tmp_path / "good.pdf").write_bytes(write_text_pdf([["Invoice number: INV-9"]]))
    (tmp_path / "locked.pdf").write_bytes(encrypted_pdf())
    pdfs = pd.DataFrame({"document_id": ["good", "locked"],
                         "path": [str(tmp_path / "good.pdf"), str(tmp_path / "locked.pdf")]})

    pages = invoice_pages(dg.build_asset_context(), pdfs)
    documents = invoice_documents(dg.build_asset_context(), pages).set_index("document_id")

    assert pages["parse_error"].isna().tolist() == [True, False]
    assert "encrypted" in documents.loc["locked", "parse_error"]
    assert documents.loc["locked", "messages"] is None  # nothing to send: a row error later
    assert json.loads(documents.loc["good", "messages"])[1]["content"] == (
        "Invoice:\n\nInvoice number: INV-9")
