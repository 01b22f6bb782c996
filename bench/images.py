"""Image inputs: rows/s and peak RSS of ``infer(images=...)`` over N page images of ~200 KB.

From the repository root::

    .venv/bin/python -m bench.images          # 1,000, 2,000, 4,000 rows; chunk_rows 4096, 256
    .venv/bin/python -m bench.images --quick  # 300, 1,200 and 2,400 rows

Each row sends one of 32 distinct random-pixel PNG files (~200 KB each, incompressible) by
path, with a prompt naming the row, so every request is distinct and carries its image: the
total image bytes sent is N x 200 KB. The simulated endpoint runs in its own process at zero
latency (its memory is not counted). Each measurement runs in a fresh subprocess: RSS before
(imports, the table of paths, an open ledger), the peak during ``infer``, and the growth.

Flat memory means the growth does not scale with N. The engine renders ``chunk_rows`` rows
at a time (core/engine.py) and each rendered image request holds its base64 body (~270 KB),
so the growth is about ``min(N, chunk_rows)`` bodies (up to two chunks while one is sent and
the next rendered): with the default chunk_rows (4096) it grows ~270 KiB per row up to about a
gigabyte; with chunk_rows=256 it stays flat at ~150 MiB past 1,200 rows (measured on 2 cores:
146, 161 and 156 MiB at 1,200, 2,400 and 3,600 rows).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import zlib
from pathlib import Path

from bench.child import run_child, serve_child
from bench.peak_memory import peak_resident_mib

DISTINCT_FILES = 32
SIDE = (256, 260)  # width x height: 256 * 260 * 3 = 199,680 bytes of random pixels


def random_png(seed: int) -> bytes:
    """An incompressible PNG of ~200 KB (so the bytes sent are what the figure says)."""
    import random
    import struct

    rng = random.Random(seed)
    width, height = SIDE
    rows = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (struct.pack(">I", len(payload)) + kind + payload
                + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows, 1)) + chunk(b"IEND", b""))


def write_images(folder: Path, count: int = DISTINCT_FILES) -> float:
    """``count`` distinct ``random_png`` files, ``page00.png`` on, in ``folder`` (made here);
    the size of one, in KB."""
    folder.mkdir()
    for i in range(count):
        (folder / f"page{i:02d}.png").write_bytes(random_png(i))
    return (folder / "page00.png").stat().st_size / 1000


def measure(base_url: str, rows: int, chunk_rows: int, image_dir: str, store: str) -> dict:
    """Runs in the fresh subprocess (peak RSS: VmHWM, since ru_maxrss would be the parent's)."""
    import pandas as pd

    from dagster_batchllm.core.client import InferenceClient
    from dagster_batchllm.core.settings import EndpointSpec, InferenceSettings

    files = sorted(str(p) for p in Path(image_dir).glob("*.png"))
    df = pd.DataFrame({"name": [f"row {i}" for i in range(rows)],
                       "page": [files[i % len(files)] for i in range(rows)]})
    settings = InferenceSettings(
        endpoints=(EndpointSpec(name="sim", base_url=base_url, models=("sim-model",),
                                max_concurrency=64),),
        store_url=f"sqlite:///{store}", chunk_rows=chunk_rows, progress_interval_s=3600.0)
    with InferenceClient(settings) as client:
        client.ledger.lookup_ok([], "", "")  # open the ledger before measuring
        before = peak_resident_mib()
        start = time.perf_counter()
        result = client.infer(df, prompt="Extract the fields of {name}", images="page",
                              model="sim-model", output_column="fields", max_tokens=16)
        wall = time.perf_counter() - start
    assert result.stats.succeeded == rows, result.stats.summary()
    return {"rows": rows, "chunk_rows": chunk_rows, "before": before, "peak": peak_resident_mib(),
            "wall": wall, "image_mib": rows * os.path.getsize(files[0]) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    from dagster_batchllm.testing import SimulatedEndpoint

    sizes = (300, 1200, 2400) if args.quick else (1000, 2000, 4000)
    with tempfile.TemporaryDirectory() as work, SimulatedEndpoint(
            models=("sim-model",), latency_s=0.0, max_concurrency=256, process=True) as sim:
        image_dir = Path(work, "images")
        size_kb = write_images(image_dir)
        print(f"{DISTINCT_FILES} distinct PNGs of {size_kb:.0f} KB, sent by path\n")
        print(f"  {'rows':>6} {'chunk_rows':>10} {'images MiB':>10} {'rows/s':>8} "
              f"{'RSS before':>10} {'RSS peak':>9} {'growth':>8} {'KiB/row':>8}")
        results = []
        for chunk_rows in (4096, 256):
            for rows in sizes:
                store = str(Path(work, f"ledger-{chunk_rows}-{rows}.db"))
                r = run_child("bench.images", base_url=sim.base_url, rows=rows,
                              chunk_rows=chunk_rows, image_dir=str(image_dir), store=store)
                growth = r["peak"] - r["before"]
                results.append((chunk_rows, rows, growth))
                print(f"  {rows:>6} {chunk_rows:>10} {r['image_mib']:>10.0f} "
                      f"{rows / r['wall']:>8.0f} {r['before']:>8.1f}Mi {r['peak']:>7.1f}Mi "
                      f"{growth:>6.1f}Mi {growth * 1024 / rows:>8.1f}")
        print()
        for chunk_rows in (4096, 256):
            (_, small, g_small), (_, large, g_large) = [
                r for r in results if r[0] == chunk_rows][-2:]
            per_row = (g_large - g_small) * 1024 / (large - small)
            print(f"  chunk_rows={chunk_rows}: from {small} to {large} rows the peak grows "
                  f"{per_row:.1f} KiB per extra row")


if __name__ == "__main__" and not serve_child(measure):
    main()
