"""Per-kernel times of one real-shape block on the CUDA general path, for the prefill table in bench/README.md.

    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        --csv --log-file k.csv python3 bench/prefill_kernels.py --rows 256 1024 4096
    python3 bench/prefill_kernels.py --summarize k.csv       # one line per kernel and row count

The run: per row count, one session-created block (C=4, H=2560, R=320, prologue and streams_out,
Qwen attributes, weights as initializers) run --runs times; the summary keeps the last run of each row
count (ncu serializes kernels, so these are standalone kernel times, not the overlapped chain).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(rows_list: list[int], dtype_name: str, runs: int) -> None:
    import ml_dtypes
    import numpy as np

    from fused_node_session import cuda_fused_node_session
    from hcfuse._op import QWEN_ATTRIBUTES, QWEN_SHAPE
    from hcfuse.checking._ort_io import run_bound
    from hcfuse.models.hc_block import random_activations

    dtype = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}[dtype_name]
    rng = np.random.default_rng(0)
    session = cuda_fused_node_session(QWEN_SHAPE, dtype, rng, QWEN_ATTRIBUTES)
    for rows in rows_list:
        feeds = random_activations((rows,), QWEN_SHAPE["C"], QWEN_SHAPE["H"], dtype, rng, prologue=True)
        for _ in range(runs):
            run_bound(session, feeds, device="cuda")
        print(f"prefill_kernels: {rows} rows x {runs} runs", flush=True)


_UNITS = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
          "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}


def summarize(path: Path, rows_list: list[int], runs: int) -> None:
    """ncu's CSV (one line per kernel and metric) -> per row count, the kernels of its last run (a run
    starts at the norm kernel)."""
    launches: dict[int, dict] = defaultdict(dict)  # ncu ID -> {name, metrics}
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    for rec in csv.DictReader(lines):
        k = launches[int(rec["ID"])]
        k["name"] = rec["Kernel Name"]
        scale = _UNITS.get(rec["Metric Unit"].lower(), 1.0)  # to ns and bytes
        k[rec["Metric Name"]] = float(rec["Metric Value"].replace(",", "")) * scale
    calls: list[list[dict]] = []
    for kid in sorted(launches):
        if "HcNorm" in launches[kid]["name"] or not calls:
            calls.append([])
        calls[-1].append(launches[kid])
    if len(calls) != len(rows_list) * runs:
        print(f"prefill_kernels: {len(calls)} runs in {path}, expected {len(rows_list) * runs}")
    for i, rows in enumerate(rows_list):
        if (i + 1) * runs > len(calls):
            break
        total_us = total_mb = 0.0
        print(f"rows {rows}:")
        for k in calls[(i + 1) * runs - 1]:
            us = k.get("gpu__time_duration.sum", 0.0) / 1e3  # ns
            mb = (k.get("dram__bytes_read.sum", 0.0) + k.get("dram__bytes_write.sum", 0.0)) / 1e6
            total_us, total_mb = total_us + us, total_mb + mb
            print(f"  {us:8.1f} us {mb:8.1f} MB  {k['name'][:110]}")
        print(f"  {total_us:8.1f} us {total_mb:8.1f} MB  total ({len(calls[(i + 1) * runs - 1])} kernels)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--summarize", type=Path, help="an ncu --csv log of a run with the same --rows/--runs")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize, args.rows, args.runs)
    else:
        run(args.rows, args.dtype, args.runs)


if __name__ == "__main__":
    main()
