"""CPU benchmark of HyperConnectionLowRankMix against the stock unfused chain, on onnxruntime's CPU provider.

Real shape (C=4, H=2560, R=320, Qwen3.8-Flash-Next attributes), float32 and float16 (ORT's CPU
provider has no bfloat16 MatMul, so the stock chain cannot run in bfloat16 there). Variants, side
by side in one run, each in its own session with hcfuse's library registered and ORT's default
graph optimizations:

- node:  one block with a prologue (make_fused_node_model) vs hcfuse.unfuse of it (stock contrib ops
         + MatMul/Sigmoid/Div/Mul). Its 13-26 MB of weights stay in the cache between runs: "hot".
- chain: make_decode_model(N, sublayer="identity") (the exporter's stock graph) vs hcfuse.optimize of
         it (N fused nodes), N distinct weight sets totalling more than --chain-mb (default 320 MB,
         more than this machine's L3), so each block reads its weights from DRAM: "cold". The
         fused graph keeps the last block's PostMix and the Identity stand-ins; so does the stock one.

ms per block = median over repetitions of one session.run (divided by N for chains), for each
row count and intra-op thread count (1 and all cores). ratio = fused / stock. The floor is the
weight bytes of one block over the copy bandwidth of a large numpy array (512 MiB, bytes copied per
second; single-threaded for 1 thread, one numpy copy per core in parallel for more).

    python3 bench/bench_cpu.py                  # writes bench/out/cpu.md
    python3 bench/bench_cpu.py --rows 1 4 --threads 1 --out /tmp/cpu.md
    python3 bench/bench_cpu.py --library /tmp/old/libhcfuse_ops.so --out /tmp/old.md   # another build
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hcfuse  # noqa: E402
from hcfuse._op import DOMAIN, OP_TYPE, QWEN_ATTRIBUTES, QWEN_SHAPE  # noqa: E402
from hcfuse._session import inference_session  # noqa: E402
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights  # noqa: E402
from hcfuse.models.qwen_decode import make_decode_model  # noqa: E402

C, H, R = QWEN_SHAPE["C"], QWEN_SHAPE["H"], QWEN_SHAPE["R"]
DTYPES = {"float32": np.float32, "float16": np.float16}
COPY_BYTES = 1 << 29  # 512 MiB: twice this machine's L3


def weight_bytes(itemsize: int) -> int:
    """Bytes of one block's weights: down, up, inject, norm scale."""
    K = C * H
    return (2 * K * R + K * C + K) * itemsize


def copy_bandwidth(threads: int, reps: int = 5) -> float:
    """Bytes per second copied by `threads` concurrent numpy copies of 1/threads of a 512 MiB array (best of reps)."""
    src = np.ones(COPY_BYTES // 8, np.float64)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(p[0], p[-1] + 1) for p in parts]

    def work(lo, hi):
        np.copyto(dst[lo:hi], src[lo:hi])

    best = float("inf")
    for _ in range(reps):
        ts = [threading.Thread(target=work, args=b) for b in bounds]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = min(best, time.perf_counter() - t0)
    return src.nbytes / best


LIBRARY = None  # --library: another build of the custom-op library (default: hcfuse's own)


def session(model_bytes: bytes, threads: int):
    return inference_session(model_bytes, library=LIBRARY or True, optimize=True, intra_op_threads=threads)


def time_ms(sess, feeds: dict, budget_s: float, min_reps: int, max_reps: int) -> float:
    """Median wall time of one run, in ms, after one warm-up run; stops at max_reps or when
    budget_s is spent (but not before min_reps)."""
    sess.run(None, feeds)
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def count_ops(model, op_type: str, domain: str) -> int:
    return sum(n.op_type == op_type and n.domain == domain for n in model.graph.node)


def build_models(dtype, chain_blocks: int, rng) -> dict[str, tuple[bytes, int]]:
    """variant -> (serialized model, blocks in it)."""
    w = random_weights(C, H, R, dtype, rng)
    node = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, leading_dims=["rows"], prologue=True, streams_out=True,
                                 weights_as_inputs=False, weights=w, **QWEN_ATTRIBUTES)
    stock_node = hcfuse.unfuse(node)
    stock_chain = make_decode_model(chain_blocks, dtype=dtype, leading_dims=("rows",), sublayer="identity",
                                    tile_embeddings=False)
    fused_chain = hcfuse.optimize(stock_chain)
    fused = count_ops(fused_chain, OP_TYPE, DOMAIN)
    if fused != chain_blocks:
        raise RuntimeError(f"bench_cpu: hcfuse.optimize fused {fused} of {chain_blocks} blocks")
    return {"fused node": (node.SerializeToString(), 1), "stock node": (stock_node.SerializeToString(), 1),
            "fused chain": (fused_chain.SerializeToString(), chain_blocks),
            "stock chain": (stock_chain.SerializeToString(), chain_blocks)}


def feeds_for(kind: str, rows: int, dtype, rng) -> dict:
    if kind == "node":
        return random_activations((rows,), C, H, dtype, rng, prologue=True)
    return {"hyper_states": rng.standard_normal((rows, C * H)).astype(dtype)}


def git_label() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "kernels"], cwd=root,
                               capture_output=True, text=True).stdout
        return rev.strip() + (" + uncommitted kernel changes" if dirty.strip() else "")
    except OSError:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 16, 64])
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="intra-op threads (default: 1 and all cores)")
    ap.add_argument("--chain-mb", type=float, default=320.0, help="weights of the chain, in MB (sets N per dtype)")
    ap.add_argument("--budget-s", type=float, default=0.4, help="time spent per measurement (after min reps)")
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--max-reps", type=int, default=50)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "cpu.md")
    ap.add_argument("--library", help="custom-op library to register instead of hcfuse's (to compare builds)")
    args = ap.parse_args(argv)
    global LIBRARY
    LIBRARY = args.library

    import onnxruntime as ort

    cores = os.cpu_count() or 1
    threads = args.threads or sorted({1, cores})
    t_start = time.perf_counter()
    bandwidth = {t: copy_bandwidth(t) for t in threads}
    print("copy bandwidth: " + ", ".join(f"{t} thread(s) {b / 1e9:.1f} GB/s" for t, b in bandwidth.items()), flush=True)

    rng = np.random.default_rng(2026)
    results = []  # dicts: dtype, threads, rows, kind, fused, stock, floor
    for dt in args.dtypes:
        dtype = DTYPES[dt]
        itemsize = np.dtype(dtype).itemsize
        blocks = max(1, int(np.ceil(args.chain_mb * 1e6 / weight_bytes(itemsize))))
        t0 = time.perf_counter()
        models = build_models(dtype, blocks, rng)
        print(f"{dt}: models built ({blocks}-block chain, {blocks * weight_bytes(itemsize) / 1e6:.0f} MB of weights) "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)
        times = {}  # (variant, threads, rows) -> ms per block
        for variant, (data, n) in models.items():
            kind = variant.split()[1]
            for t in threads:
                sess = session(data, t)
                for rows in args.rows:
                    feeds = feeds_for(kind, rows, dtype, np.random.default_rng(rows))
                    times[variant, t, rows] = time_ms(sess, feeds, args.budget_s, args.min_reps, args.max_reps) / n
                del sess
                print(f"{dt} {variant:11s} threads={t}: " +
                      " ".join(f"{r}:{times[variant, t, r]:.3f}" for r in args.rows) +
                      f" ms/block ({time.perf_counter() - t_start:.0f} s)", flush=True)
        check_chain(models, dtype, rng)
        for t in threads:
            for rows in args.rows:
                for kind in ("node", "chain"):
                    results.append({"dtype": dt, "threads": t, "rows": rows, "kind": kind,
                                    "fused": times[f"fused {kind}", t, rows], "stock": times[f"stock {kind}", t, rows],
                                    "floor": weight_bytes(itemsize) / bandwidth[t] * 1e3})
        del models

    lib = f"library {args.library}" if args.library else f"hcfuse {git_label()}"
    meta = (f"onnxruntime {ort.__version__}, {cores} cores, {lib}; copy bandwidth " +
            ", ".join(f"{b / 1e9:.1f} GB/s ({t} thread{'s' if t > 1 else ''})" for t, b in bandwidth.items()))
    write_table(results, args.out, meta, args)
    print(f"bench_cpu: {time.perf_counter() - t_start:.0f} s")
    return 0


def check_chain(models, dtype, rng) -> None:
    """Sanity check: the fused and stock chains agree at 1 row (loosely: float16 rounds differently
    at the stock ops' boundaries)."""
    feeds = feeds_for("chain", 1, dtype, rng)
    fused = session(models["fused chain"][0], 1).run(None, feeds)[0].astype(np.float32)
    stock = session(models["stock chain"][0], 1).run(None, feeds)[0].astype(np.float32)
    scale = float(np.abs(stock).max()) or 1.0
    gap = float(np.abs(fused - stock).max()) / scale
    if not np.isfinite(fused).all() or gap > 0.05:
        raise RuntimeError(f"bench_cpu: fused and stock chains disagree ({np.dtype(dtype).name}: max gap {gap:.3g} "
                           "relative to the largest output)")


def write_table(results: list[dict], out: Path, meta: str, args) -> None:
    lines = [f"# HyperConnectionLowRankMix on onnxruntime CPU ({meta})", "",
             f"ms per block, median over repetitions (at least {args.min_reps}, about {args.budget_s:g} s each); "
             "node: one block, weights hot in cache; chain: decode graph with distinct weights per block "
             f"(> {args.chain_mb:g} MB, cold); ratio = fused / stock; floor = one block's weight bytes / copy bandwidth.",
             "", "| dtype | threads | rows | fused node | stock node | ratio | fused chain | stock chain | ratio | floor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_key = {(r["dtype"], r["threads"], r["rows"], r["kind"]): r for r in results}
    for dt, t, rows in sorted({(r["dtype"], r["threads"], r["rows"]) for r in results},
                              key=lambda k: (list(DTYPES).index(k[0]), k[1], k[2])):
        node, chain = by_key[dt, t, rows, "node"], by_key[dt, t, rows, "chain"]
        lines.append(f"| {dt} | {t} | {rows} | {node['fused']:.3f} | {node['stock']:.3f} | "
                     f"{node['fused'] / node['stock']:.2f} | {chain['fused']:.3f} | {chain['stock']:.3f} | "
                     f"{chain['fused'] / chain['stock']:.2f} | {node['floor']:.3f} |")
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print("bench_cpu: wrote", out)


if __name__ == "__main__":
    sys.exit(main())
