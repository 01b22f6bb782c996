"""Batch API mode: client CPU per row to build, upload and settle N rows, and peak RSS.

From the repository root::

    .venv/bin/python -m bench.batch_api            # 30,000, 60,000 and 120,000 rows
    .venv/bin/python -m bench.batch_api --quick    # 5,000, 10,000 and 20,000 rows

Each measurement runs in a fresh subprocess against a simulated endpoint in its own process
(its CPU and memory are not counted), which runs each batch to its end at once:

* ``infer(mode="batch_api", wait=False)``: render and key the rows, look them up, write the
  batch files (cut at 50,000 lines), record the keys in the batch book, upload and create the
  batches, record the rows deferred: the *submit* CPU;
* the same call again once the batches ended: poll, stream the output files into the book,
  hand each answer to the engine, write the ledger: the *collect* CPU.

Beside it, the same N rows through two references: a **plain openai script** (the baseline:
``json.dumps`` each line into a file, ``files.create``, ``batches.create``, poll,
``files.content`` read whole, ``json.loads`` each line into a list; no ledger, no resume, no
budget) and the **floor** (only what any client must do: serialize each request body, hash it
for its key and write the line; no network). Peak RSS is the subprocess's maximum resident
set; its growth from before the call shows what scales with N. The table of N answers the
result holds grows with N in every mode, so the online engine's growth over the same rows (at
zero latency) is printed too, and the row ``batch-online`` is the one's growth less the other's.
Batch mode's files are streamed, never held whole; what it holds beyond online's is the answers
of the batches it collects (up to 131,072, until the pass has written them to the ledger) and
the outcomes of every row of each of its two calls.
Every kind imports ``openai`` and makes one request with it before it is measured (a
one-time second of CPU, not per row).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from bench.child import run_child, serve_child
from bench.peak_memory import peak_resident_mib

MODEL = "sim-model"
PROMPT = "Summarize this call transcript: {text}"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mib() -> float:
    return peak_resident_mib()  # VmHWM: ru_maxrss would be the parent's after exec


def _frame(rows: int):
    import pandas as pd

    return pd.DataFrame({"text": [f"customer {i} asks about the refund of order {i * 7}"
                                  for i in range(rows)]})


def measure(kind: str, base_url: str, rows: int, store: str) -> dict:
    """Runs in the fresh subprocess."""
    import openai

    # One-time costs of the process, not per row, paid before any kind is measured: the
    # import (~1 s of CPU) and what the client loads on its first request and first use of
    # files and batches (its HTTP stack, ~0.2 s).
    warm = openai.OpenAI(base_url=base_url, api_key="k")
    warm.models.list()
    _ = warm.files, warm.batches
    warm.close()

    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

    df = _frame(rows)
    if kind in ("plain", "floor"):
        before, start = _rss_mib(), _cpu()
        (plain_openai if kind == "plain" else floor)(base_url, df)
        return {"cpu_s": _cpu() - start, "rss_before": before, "rss_peak": _rss_mib()}
    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=base_url, models=(MODEL,), api_key="k",
                                max_concurrency=64, batch_api=True),),
        store_url=f"sqlite:///{store}", progress_interval_s=3600.0, batch_poll_initial_s=0.2)
    with InferenceClient(settings) as client:
        client.ledger.lookup_ok([], "", "")  # open the ledger before measuring
        before = _rss_mib()
        if kind == "online":
            start = _cpu()
            result = client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary")
            assert result.stats.succeeded == rows, result.stats.summary()
            return {"cpu_s": _cpu() - start, "rss_before": before, "rss_peak": _rss_mib()}
        start = _cpu()
        first = client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                             mode="batch_api", wait=False)
        submit_s = _cpu() - start
        assert first.stats.deferred == rows, first.stats.summary()
        del first  # a later run's process would not hold the first run's table
        _wait_for_batches(base_url)
        start = _cpu()
        second = client.infer(df, prompt=PROMPT, model=MODEL, output_column="summary",
                              mode="batch_api", wait=False)
        collect_s = _cpu() - start
        assert second.stats.succeeded == rows, second.stats.summary()
        return {"cpu_s": submit_s + collect_s, "submit_s": submit_s, "collect_s": collect_s,
                "rss_before": before, "rss_peak": _rss_mib()}


def _wait_for_batches(base_url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="k")
    while any(b.status not in ("completed", "failed", "expired", "cancelled")
              for b in client.batches.list(limit=100)):
        time.sleep(0.2)


def plain_openai(base_url: str, df) -> None:
    """The baseline: a hand-written batch job with the official client."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="k")
    with tempfile.TemporaryDirectory() as tmp:
        ids = []
        for start in range(0, len(df), 50_000):
            path = Path(tmp) / f"in{start}.jsonl"
            with open(path, "w") as out:
                for i, text in enumerate(df["text"].iloc[start:start + 50_000], start):
                    body = {"model": MODEL, "max_tokens": 512,
                            "messages": [{"role": "user", "content": PROMPT.format(text=text)}]}
                    out.write(json.dumps({"custom_id": str(i), "method": "POST",
                                          "url": "/v1/chat/completions", "body": body}) + "\n")
            with open(path, "rb") as handle:
                uploaded = client.files.create(file=handle, purpose="batch")
            ids.append(client.batches.create(input_file_id=uploaded.id,
                                             endpoint="/v1/chat/completions",
                                             completion_window="24h").id)
        answers = [None] * len(df)
        for batch_id in ids:
            while (batch := client.batches.retrieve(batch_id)).status != "completed":
                time.sleep(0.2)
            for line in client.files.content(batch.output_file_id).text.splitlines():
                result = json.loads(line)
                answers[int(result["custom_id"])] = (
                    result["response"]["body"]["choices"][0]["message"]["content"])
        assert all(a is not None for a in answers)


def floor(_base_url: str, df) -> None:
    """What any client must do: one canonical body, its hash and its line, per row."""
    import hashlib

    with tempfile.TemporaryFile() as out:
        for text in df["text"]:
            body = json.dumps({"model": MODEL, "max_tokens": 512, "messages": [
                {"role": "user", "content": PROMPT.format(text=text)}]},
                sort_keys=True, separators=(",", ":")).encode()
            key = hashlib.sha256(body).hexdigest()
            out.write(b'{"custom_id":"%s","method":"POST","url":"/v1/chat/completions",'
                      b'"body":%s}\n' % (key.encode(), body))


def run_one(kind: str, rows: int) -> dict:
    from dagster_batchllm.testing import SimulatedEndpoint

    with tempfile.TemporaryDirectory() as tmp, SimulatedEndpoint(
            models=(MODEL,), api_key="k", process=True) as sim:
        return run_child("bench.batch_api", timeout_s=1800, kind=kind, base_url=sim.base_url,
                         rows=rows, store=f"{tmp}/ledger.db")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kinds", default="batch_api,online,plain,floor",
                        help="comma-separated: batch_api, online, plain, floor")
    args = parser.parse_args()
    sizes = (5_000, 10_000, 20_000) if args.quick else (30_000, 60_000, 120_000)
    print(f"{'rows':>8} {'kind':>12} {'CPU ms/row':>11} {'submit':>8} {'collect':>8} "
          f"{'RSS MiB':>8} {'growth':>7}")
    for rows in sizes:
        growth: dict[str, float] = {}
        for kind in args.kinds.split(","):
            m = run_one(kind, rows)
            growth[kind] = m["rss_peak"] - m["rss_before"]
            per_row = 1000 * m["cpu_s"] / rows
            submit = f"{1000 * m['submit_s'] / rows:8.4f}" if "submit_s" in m else f"{'':8}"
            collect = f"{1000 * m['collect_s'] / rows:8.4f}" if "collect_s" in m else f"{'':8}"
            print(f"{rows:>8} {kind:>12} {per_row:11.4f} {submit} {collect} "
                  f"{m['rss_peak']:8.0f} {growth[kind]:7.0f}", flush=True)
        if "batch_api" in growth and "online" in growth:
            # The result table grows with N in both: what batch mode holds beyond it.
            print(f"{rows:>8} {'batch-online':>12} {'':11} {'':8} {'':8} {'':8} "
                  f"{growth['batch_api'] - growth['online']:7.0f}", flush=True)
    print("batch_api: this library (submit = build + book + upload, collect = poll + stream "
          "+ settle + ledger); online: the same rows answered one request each at zero "
          "latency; plain: a hand-written openai batch script (no ledger, no resume); floor: "
          "serialize + hash + write each line, no network. Target: batch_api <= 0.05 ms/row.")


if __name__ == "__main__" and not serve_child(measure):
    main()
