"""Documents: 10,000 PDF pages parsed and sent, and 10,000 page images of ~200 KB sent, by
``infer`` and by a plain ``AsyncOpenAI`` loop: rows/s and peak RSS.

From the repository root::

    .venv/bin/python -m bench.documents          # 10,000 pages (and 2,500: memory is flat)
    .venv/bin/python -m bench.documents --quick  # 500 and 2,000

Two workloads, each run by both clients in a fresh subprocess against one simulated endpoint
(its own process, 50 ms latency, so the theoretical limit is concurrency / latency = 64 / 0.05
= 1,280 rows/s; the server's CPU is not counted in RSS):

* **text**: N pages in N/4 four-page invoice PDFs (written with pdfium), each page's text layer
  parsed with ``parse_document(render=False)``, then one request per page with a JSON schema
  (``response_format``). Rows/s counts parse + infer, end to end.
* **images**: N rows each sending one of 32 distinct random-pixel PNG files of ~200 KB (by
  path: ``infer(images=...)``; the baseline reads, base64-encodes and sends each file inside
  its semaphore), so N x 200 KB of images cross the wire. Each row's prompt names it, so every
  request is distinct.

The baseline is what one writes by hand: ``asyncio.Semaphore(64)`` around
``client.chat.completions.create`` for every row, ``asyncio.gather`` over all of them; no
ledger, no retries, no budget. ``infer`` writes every answer to a SQLite ledger as well.
"rows/s" is end to end (parse + infer), "infer rows/s" the sending alone, which the limit
bounds; "CPU ms/row" is the client process's CPU (parse included), which decides the figures
when the cores are shared (the image rows: validating, encoding and hashing 200 KB each).
RSS: VmHWM (``peak_memory``) of the subprocess; "before" is after the imports and the table (the
paths, or for text the parsed pages: they are the input), "growth" the peak over it.

Measured on the shared 2-core machine (other sessions' tests running, load 2 to 5), 10,000
rows, three runs: text (parse + infer) 727-823 rows/s for ``infer`` (sending alone 1,107-1,136
rows/s, 86-89% of the limit) against 477-603 for the baseline (571-763); peak RSS 168-171 MiB
(22 -> 31 MiB of growth from 2,500 to 10,000 pages) against 96 MiB. Images (1,954 MiB of
images sent): 211-397 rows/s against 240-474; the wall-clock order flips with the machine's
load, the client CPU does not: 1.1 ms a row for ``infer``, 2.1 ms for the baseline (text: 0.65
against 1.6). Peak RSS 285-293 MiB against 119-121 MiB, flat in rows: 148 -> 166 MiB of
growth from 2,500 to 10,000 image rows (under 2.5 KiB a row: the answers; an image is 200 KB).
``infer`` holds more at once because it renders 256 image rows ahead of sending (64 in flight
for the baseline), bounded whatever the row count.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import tempfile
import time
from pathlib import Path

from bench.baselines import chat_loop
from bench.child import run_child, serve_child
from bench.images import DISTINCT_FILES, write_images  # incompressible ~200 KB PNGs
from bench.peak_memory import peak_resident_mib

MODEL = "sim-model"
CONCURRENCY = 64
LATENCY_S = 0.05
PAGES_PER_DOCUMENT = 4
MAX_TOKENS = 64
SCHEMA = {"type": "object", "properties": {
    "invoice_number": {"type": ["string", "null"]}, "amount_due": {"type": ["number", "null"]}},
    "required": ["invoice_number", "amount_due"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema",
                   "json_schema": {"name": "invoice", "strict": True, "schema": SCHEMA}}
TEXT_PROMPT = "Extract the invoice number and amount due from this page:\n"
IMAGE_PROMPT = "Extract the invoice number and amount due from page {name}"


def write_documents(folder: Path, pages: int) -> None:
    from dagster_batchllm.testing.pdf_writer import write_text_pdf

    for d in range(pages // PAGES_PER_DOCUMENT):
        (folder / f"doc{d:06d}.pdf").write_bytes(write_text_pdf([
            [f"INVOICE page {p + 1} of {PAGES_PER_DOCUMENT}", f"Invoice number: INV-{d:06d}",
             f"Amount due: ${d % 997 + 0.5:,.2f}", "Description | Qty | Unit price | Line total",
             *(f"Item {k} | {k} | $1.00 | ${k}.00" for k in range(1, 20))]
            for p in range(PAGES_PER_DOCUMENT)]))


def parsed_pages(folder: Path) -> list[str]:
    from dagster_batchllm.documents import parse_document

    return [TEXT_PROMPT + page.text for path in sorted(folder.glob("*.pdf"))
            for page in parse_document(path, render=False)]


# -- the children ----------------------------------------------------------------------------
def run_batchllm(base_url: str, workload: str, folder: Path, rows: int, store: str) -> dict:
    import pandas as pd

    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=base_url, models=(MODEL,),
                                max_concurrency=CONCURRENCY),),
        store_url=f"sqlite:///{store}", progress_interval_s=3600.0)
    with InferenceClient(settings) as client:
        client.ledger.lookup_ok([], "", "")  # open the ledger before measuring
        start, cpu = time.perf_counter(), time.process_time()
        if workload == "text":
            df = pd.DataFrame({"page": parsed_pages(folder)})
            parsed = time.perf_counter()
            before = peak_resident_mib()
            result = client.infer(df, prompt_column="page", model=MODEL, output_column="fields",
                                  response_format=RESPONSE_FORMAT, max_tokens=MAX_TOKENS)
        else:
            files = sorted(str(p) for p in folder.glob("*.png"))
            df = pd.DataFrame({"name": [f"row {i}" for i in range(rows)],
                               "image": [files[i % len(files)] for i in range(rows)]})
            parsed = time.perf_counter()
            before = peak_resident_mib()
            result = client.infer(df, prompt=IMAGE_PROMPT, images="image", model=MODEL,
                                  output_column="fields", max_tokens=MAX_TOKENS)
        wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    assert result.stats.succeeded == len(df), result.stats.summary()
    return {"rows": len(df), "wall": wall, "parse": parsed - start, "before": before,
            "peak": peak_resident_mib(), "cpu": cpu}


async def _baseline(base_url: str, messages_of, rows: int, **params) -> None:
    await chat_loop(base_url, messages_of, rows, model=MODEL, concurrency=CONCURRENCY,
                    max_tokens=MAX_TOKENS, **params)


def run_baseline(base_url: str, workload: str, folder: Path, rows: int) -> dict:
    import openai  # noqa: F401  (imported before "RSS before", as infer's client is)

    start, cpu = time.perf_counter(), time.process_time()
    if workload == "text":
        pages = parsed_pages(folder)
        parsed = time.perf_counter()
        before = peak_resident_mib()
        asyncio.run(_baseline(base_url, lambda i: [{"role": "user", "content": pages[i]}],
                              len(pages), response_format=RESPONSE_FORMAT))
        rows = len(pages)
    else:
        files = sorted(str(p) for p in folder.glob("*.png"))
        parsed = time.perf_counter()
        before = peak_resident_mib()

        def messages_of(i: int) -> list[dict]:
            data = base64.b64encode(Path(files[i % len(files)]).read_bytes()).decode()
            return [{"role": "user", "content": [
                {"type": "text", "text": IMAGE_PROMPT.format(name=f"row {i}")},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}]

        asyncio.run(_baseline(base_url, messages_of, rows))
    return {"rows": rows, "wall": time.perf_counter() - start, "parse": parsed - start,
            "before": before, "peak": peak_resident_mib(), "cpu": time.process_time() - cpu}


# -- the driver --------------------------------------------------------------------------------
def measure(client: str, base_url: str, workload: str, folder: str, rows: int,
            store: str) -> dict:
    """Runs in the fresh subprocess: ``client`` (batchllm or AsyncOpenAI) over a workload."""
    if client == "batchllm":
        return run_batchllm(base_url, workload, Path(folder), rows, store)
    return run_baseline(base_url, workload, Path(folder), rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    from dagster_batchllm.testing import SimulatedEndpoint

    sizes = (500, 2000) if args.quick else (2500, 10_000)
    limit = CONCURRENCY / LATENCY_S
    print(f"simulated endpoint: {LATENCY_S * 1000:.0f} ms latency, concurrency {CONCURRENCY}: "
          f"limit {limit:,.0f} rows/s\n")
    print(f"  {'workload':<8} {'client':<22} {'rows':>6} {'parse s':>7} {'total s':>7} "
          f"{'rows/s':>7} {'infer rows/s':>12} {'of limit':>8} {'RSS before':>10} "
          f"{'RSS peak':>9} {'growth':>8} {'CPU ms/row':>10}")
    with tempfile.TemporaryDirectory() as work, SimulatedEndpoint(
            models=(MODEL,), latency_s=LATENCY_S, max_concurrency=256, process=True) as sim:
        images = Path(work, "images")
        image_kb = write_images(images)
        growth: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for workload in ("text", "images"):
            for rows in sizes:
                folder = images
                if workload == "text":
                    folder = Path(work, f"pdfs-{rows}")
                    folder.mkdir()
                    write_documents(folder, rows)
                for client in ("batchllm", "AsyncOpenAI"):
                    store = str(Path(work, f"ledger-{workload}-{rows}.db"))
                    r = run_child("bench.documents", client=client, base_url=sim.base_url,
                                  workload=workload, folder=str(folder), rows=rows, store=store)
                    grown = r["peak"] - r["before"]
                    growth.setdefault((workload, client), []).append((r["rows"], grown))
                    label = ("batchllm infer" if client == "batchllm"
                             else "AsyncOpenAI + Semaphore")
                    rate = r["rows"] / r["wall"]  # end to end: parse + infer
                    sending = r["rows"] / (r["wall"] - r["parse"])  # infer alone, vs the limit
                    print(f"  {workload:<8} {label:<22} {r['rows']:>6} {r['parse']:>7.1f} "
                          f"{r['wall']:>7.1f} {rate:>7.0f} {sending:>12.0f} "
                          f"{sending / limit:>7.0%} "
                          f"{r['before']:>8.0f}Mi {r['peak']:>7.0f}Mi {grown:>6.0f}Mi "
                          f"{r['cpu'] * 1000 / r['rows']:>10.2f}")
        print(f"\n  images: {DISTINCT_FILES} distinct PNGs of {image_kb:.0f} KB; "
              f"{sizes[-1]} rows send {sizes[-1] * image_kb / 1024:,.0f} MiB of images")
        for (workload, client), points in growth.items():
            (small, g_small), (large, g_large) = points
            print(f"  {workload:<6} {client:<12} peak growth {g_small:.0f} -> {g_large:.0f} MiB "
                  f"from {small:,} to {large:,} rows: "
                  f"{(g_large - g_small) * 1024 / (large - small):.1f} KiB per extra row")


if __name__ == "__main__" and not serve_child(measure):
    main()
