"""CPU benchmark of HyperConnectionLowRankMix against the stock unfused chain, on onnxruntime's CPU provider.

Real shape (C=4, H=2560, R=320, Qwen3.8-Flash-Next attributes), float32, float16 and bfloat16.
ORT's CPU provider has no bfloat16 MatMul, Sigmoid, Div or Mul, so a bfloat16 stock chain cannot run
there: bfloat16's fused figures stand next to the float16 stock chain of the same shape (the same
bytes of weights: the stock graph a bfloat16 model would have to be converted to), measured in the
same run and labelled so. Variants, side by side in one run, each in its own session with hcfuse's
library registered and ORT's default graph optimizations:

- node:  one block with a prologue (make_fused_node_model) vs hcfuse.unfuse of it (stock contrib ops
         + MatMul/Sigmoid/Div/Mul), the same weights every run: "hot" (in the cache where it holds
         their 13-26 MB).
- chain: make_decode_model(N, sublayer="identity") (the exporter's stock graph) vs hcfuse.optimize of
         it (N fused nodes), N distinct weight sets totalling more than --chain-mb (default 320 MB,
         more than this machine's L3), so each block reads its weights from DRAM: "cold". The
         fused graph keeps the last block's PostMix and the Identity stand-ins; so does the stock one.

ms per block = median over repetitions of one run (inputs bound once through IO binding; divided
by N for chains), for each row count (default 1, 4, 16, 256) and intra-op thread count (default 1
and 2). Fused and stock take turns run by run, so a change in a shared machine's load moves both
alike. ratio = fused / stock. The floor is the weight bytes of one block over the copy bandwidth of
a large numpy array (512 MiB, bytes copied per second; one numpy copy per thread in parallel).

    python3 bench/bench_cpu.py                  # writes bench/out/cpu.md
    python3 bench/bench_cpu.py --rows 1 4 --threads 1 --dtypes bfloat16 --out /tmp/cpu.md
    python3 bench/bench_cpu.py --library /tmp/old/libhcfuse_ops.so --out /tmp/old.md   # another build
    python3 bench/bench_cpu.py --threads 2 --no-spinning     # pool threads sleep between runs

Quantized blocks (the int4 table, float32 and float16; --no-quantized skips it): one block as
onnxruntime-genai's int4 builds quantize it (hcfuse.unfuse of the node, then MatMulNBitsQuantizer with
4 bits, block 32, symmetric, accuracy_level 4: every projection a MatMulNBits) against hcfuse.optimize of
that (one ai.hcfuse::HyperConnectionLowRankMixNBits node reading the same bytes) and against the fused
dense node of the same weights, the three taking turns in one run, weights hot; each floor is that
variant's weight bytes over the copy bandwidth. onnxruntime's MatMulNBits at accuracy_level 4 multiplies
int8-quantized activations by the int4 weights (VNNI), where the fused op keeps the dense op's fp32
products of the exactly dequantized weights. On a shared 2-core machine every figure moves with the
other tenants' load: compare within a row, and rerun.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hcfuse  # noqa: E402
from hcfuse._op import DOMAIN, OP_TYPE, QWEN_ATTRIBUTES, QWEN_SHAPE  # noqa: E402
from hcfuse.checking._ort_io import from_ort_value, to_ort_value  # noqa: E402
from hcfuse.checking._session import inference_session  # noqa: E402
from hcfuse import _op_nbits  # noqa: E402
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights  # noqa: E402
from hcfuse.models.quantized import GENAI_INT4, quantize_model  # noqa: E402
from hcfuse.models.qwen_decode import make_decode_model  # noqa: E402

C, H, R = QWEN_SHAPE["C"], QWEN_SHAPE["H"], QWEN_SHAPE["R"]
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# the dtype whose stock chain stands in where ORT's CPU provider cannot run the stock chain
STOCK_STAND_IN = {"bfloat16": "float16"}
COPY_BYTES = 1 << 29  # 512 MiB: twice this machine's L3


def weight_bytes(itemsize: int) -> int:
    """Bytes of one block's weights: down, up, inject, norm scale."""
    K = C * H
    return (2 * K * R + K * C + K) * itemsize


INT4_DTYPES = ("float32", "float16")  # ORT's CPU MatMulNBits takes no bfloat16 activations


def int4_weight_bytes(itemsize: int) -> int:
    """Bytes of one block's int4 weights: B and scales of down+inject (N = R+C) and up (N = C*H), norm scale."""
    bits, bs = GENAI_INT4["bits"], GENAI_INT4["block_size"]
    K = C * H

    def projection(k: int, n: int) -> int:
        blocks = _op_nbits.k_blocks(k, bs)
        return n * blocks * (_op_nbits.blob_size(bits, bs) + itemsize)

    return projection(K, R + C) + projection(R, K) + K * itemsize


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


@dataclasses.dataclass(frozen=True)
class Sessions:
    """Makes the benchmark's sessions: `library` another build of the custom-op library (--library;
    None: hcfuse's own), `spinning` False for --no-spinning."""
    library: str | None = None
    spinning: bool = True

    def __call__(self, model_bytes: bytes, threads: int):
        # ORT's pool threads spin for a while after each parallel section; the fused and stock sessions
        # take turns, so on a 2-core machine one session's spinning worker competes with the other's run
        config = None if self.spinning else {"session.intra_op.allow_spinning": "0"}
        return inference_session(model_bytes, library=self.library or True, optimize=True,
                                 intra_op_threads=threads, config=config)


def bind(sess, feeds: dict):
    """sess's IO binding with feeds bound once (bfloat16 travels as its bits) and outputs on the CPU."""
    binding = sess.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, to_ort_value(array))
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cpu")
    return binding


def time_pair_ms(runs: list, budget_s: float, min_reps: int, max_reps: int) -> list[float]:
    """Median wall time of one run of each of runs ((session, feeds) pairs), in ms. They take turns
    (one warm-up run each, then a, b, a, b, ...), so a change in the machine's load between them
    shifts both alike; stops at max_reps or when budget_s is spent (but not before min_reps)."""
    bound = [(sess, bind(sess, feeds)) for sess, feeds in runs]
    for sess, binding in bound:
        sess.run_with_iobinding(binding)
    times = [[] for _ in bound]
    start = time.perf_counter()
    while len(times[0]) < max_reps and (len(times[0]) < min_reps or time.perf_counter() - start < budget_s):
        for (sess, binding), out in zip(bound, times):
            t0 = time.perf_counter()
            sess.run_with_iobinding(binding)
            out.append(time.perf_counter() - t0)
    return [float(np.median(t)) * 1e3 for t in times]


def count_ops(model, op_type: str, domain: str) -> int:
    return sum(n.op_type == op_type and n.domain == domain for n in model.graph.node)


def decode_chain(blocks: int, dtype):
    """The exporter's stock decode graph of `blocks` blocks (distinct weights, fixed seed) over `rows` rows."""
    return make_decode_model(blocks, dtype=dtype, leading_dims=("rows",), sublayer="identity", tile_embeddings=False)


def build_models(dtype, chain_blocks: int, rng, kinds=("fused", "stock")) -> dict[str, tuple[bytes, int]]:
    """variant ("fused node", "stock chain", ...; those of `kinds`) -> (serialized model, blocks in it)."""
    w = random_weights(C, H, R, dtype, rng)
    node = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, leading_dims=["rows"], prologue=True, streams_out=True,
                                 weights_as_inputs=False, weights=w, **QWEN_ATTRIBUTES)
    stock_node = hcfuse.unfuse(node)
    stock_chain = decode_chain(chain_blocks, dtype)
    fused_chain = hcfuse.optimize(stock_chain)
    fused = count_ops(fused_chain, OP_TYPE, DOMAIN)
    if fused != chain_blocks:
        raise RuntimeError(f"bench_cpu: hcfuse.optimize fused {fused} of {chain_blocks} blocks")
    models = {"fused node": (node.SerializeToString(), 1), "stock node": (stock_node.SerializeToString(), 1),
              "fused chain": (fused_chain.SerializeToString(), chain_blocks),
              "stock chain": (stock_chain.SerializeToString(), chain_blocks)}
    return {k: v for k, v in models.items() if k.split()[0] in kinds}


def build_int4_models(dtype, rng) -> dict[str, bytes]:
    """variant -> serialized model of one block with a prologue: "fused int4" (hcfuse.optimize of the
    quantized stock node: one HyperConnectionLowRankMixNBits), "stock int4" (the quantized stock node),
    "fused dense" (the dense node of the same weights)."""
    w = random_weights(C, H, R, dtype, rng)
    node = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, leading_dims=["rows"], prologue=True, streams_out=True,
                                 weights_as_inputs=False, weights=w, **QWEN_ATTRIBUTES)
    stock = quantize_model(hcfuse.unfuse(node), **GENAI_INT4)  # the int4 table's quantization
    fused = hcfuse.optimize(stock)
    if count_ops(fused, _op_nbits.OP_TYPE, _op_nbits.DOMAIN) != 1 or len(fused.graph.node) != 1:
        raise RuntimeError(f"bench_cpu: hcfuse.optimize left the int4 block as {[n.op_type for n in fused.graph.node]}")
    return {"fused int4": fused.SerializeToString(), "stock int4": stock.SerializeToString(),
            "fused dense": node.SerializeToString()}


def run_int4(session, args, threads: list[int], bandwidth: dict, t_start: float) -> list[dict]:
    """The int4 table's measurements: dicts of dtype, threads, rows and ms per variant."""
    results = []
    for dt in [d for d in args.dtypes if d in INT4_DTYPES]:
        dtype = DTYPES[dt]
        models = build_int4_models(dtype, np.random.default_rng(2026))
        for t in threads:
            sessions = {name: session(data, t) for name, data in models.items()}
            line = []
            for rows in args.rows:
                feeds = feeds_for("node", rows, dtype, np.random.default_rng(rows))
                times = time_pair_ms([(sess, feeds) for sess in sessions.values()], args.budget_s, args.min_reps,
                                     args.max_reps)
                results.append({"dtype": dt, "threads": t, "rows": rows, **dict(zip(sessions, times)),
                                "floor int4": int4_weight_bytes(np.dtype(dtype).itemsize) / bandwidth[t] * 1e3,
                                "floor dense": weight_bytes(np.dtype(dtype).itemsize) / bandwidth[t] * 1e3})
                line.append(f"{rows}:" + "/".join(f"{ms:.3f}" for ms in times))
            del sessions
            print(f"{dt} int4  threads={t} fused int4/stock int4/fused dense ms per block: {' '.join(line)} "
                  f"({time.perf_counter() - t_start:.0f} s)", flush=True)
    return results


def int4_table(results: list[dict]) -> list[str]:
    lines = ["", "## Quantized blocks (int4, block 32, symmetric, accuracy_level 4)", "",
             "ms per block, one block with weights hot; stock int4 = the block's chain with its projections as "
             "MatMulNBits (as onnxruntime-genai's int4 builds write it); fused int4 = hcfuse.optimize of it (one "
             "HyperConnectionLowRankMixNBits reading the same bytes); fused dense = the dense op on the unquantized "
             "weights; floors = weight bytes / copy bandwidth.", "",
             "| dtype | threads | rows | fused int4 | stock int4 | ratio | fused dense | int4 / dense | floor int4 | "
             "floor dense |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['dtype']} | {r['threads']} | {r['rows']} | {r['fused int4']:.3f} | {r['stock int4']:.3f} | "
                     f"{r['fused int4'] / r['stock int4']:.2f} | {r['fused dense']:.3f} | "
                     f"{r['fused int4'] / r['fused dense']:.2f} | {r['floor int4']:.3f} | {r['floor dense']:.3f} |")
    return lines


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
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 256])
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="intra-op threads (default: 1 and 2)")
    ap.add_argument("--chain-mb", type=float, default=320.0, help="weights of the chain, in MB (sets N per dtype)")
    ap.add_argument("--budget-s", type=float, default=0.4, help="time spent per measurement (after min reps)")
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--max-reps", type=int, default=50)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "cpu.md")
    ap.add_argument("--library", help="custom-op library to register instead of hcfuse's (to compare builds)")
    ap.add_argument("--no-quantized", action="store_true", help="skip the int4 table")
    ap.add_argument("--no-dense", action="store_true", help="skip the dense table (node and chain)")
    ap.add_argument("--no-spinning", action="store_true",
                    help="session.intra_op.allow_spinning=0 for both sessions (their pools sleep between runs)")
    args = ap.parse_args(argv)
    session = Sessions(library=args.library, spinning=not args.no_spinning)

    import onnxruntime as ort

    cores = os.cpu_count() or 1
    threads = args.threads or [1, 2]
    t_start = time.perf_counter()
    bandwidth = {t: copy_bandwidth(t) for t in threads}
    print("copy bandwidth: " + ", ".join(f"{t} thread(s) {b / 1e9:.1f} GB/s" for t, b in bandwidth.items()), flush=True)

    rng = np.random.default_rng(2026)
    results = []  # dicts: dtype, stock_dtype, threads, rows, kind, fused, stock, floor
    for dt in [] if args.no_dense else args.dtypes:
        dtype, stock_dt = DTYPES[dt], STOCK_STAND_IN.get(dt, dt)
        itemsize = np.dtype(dtype).itemsize
        blocks = max(1, int(np.ceil(args.chain_mb * 1e6 / weight_bytes(itemsize))))
        t0 = time.perf_counter()
        if stock_dt == dt:
            models = build_models(dtype, blocks, rng)
        else:  # a chain of as many blocks of the same weights (same seed) in the stand-in dtype
            models = {**build_models(dtype, blocks, rng, kinds=("fused",)),
                      **build_models(DTYPES[stock_dt], blocks, rng, kinds=("stock",))}
        print(f"{dt}: models built ({blocks}-block chain, {blocks * weight_bytes(itemsize) / 1e6:.0f} MB of weights"
              f"{'' if stock_dt == dt else f'; stock chain in {stock_dt}'}) in {time.perf_counter() - t0:.1f} s",
              flush=True)
        for kind in ("node", "chain"):
            (fused_data, n), (stock_data, _) = models[f"fused {kind}"], models[f"stock {kind}"]
            for t in threads:
                fused_sess, stock_sess = session(fused_data, t), session(stock_data, t)
                line = []
                for rows in args.rows:
                    feeds = {d: feeds_for(kind, rows, DTYPES[d], np.random.default_rng(rows)) for d in {dt, stock_dt}}
                    fused, stock = (ms / n for ms in time_pair_ms([(fused_sess, feeds[dt]), (stock_sess, feeds[stock_dt])],
                                                                  args.budget_s, args.min_reps, args.max_reps))
                    results.append({"dtype": dt, "stock_dtype": stock_dt, "threads": t, "rows": rows, "kind": kind,
                                    "fused": fused, "stock": stock,
                                    "floor": weight_bytes(itemsize) / bandwidth[t] * 1e3})
                    line.append(f"{rows}:{fused:.3f}/{stock:.3f}")
                del fused_sess, stock_sess
                print(f"{dt} {kind:5s} threads={t} fused/stock ms per block: {' '.join(line)} "
                      f"({time.perf_counter() - t_start:.0f} s)", flush=True)
        check_chain(session, models["fused chain"][0], models["stock chain"][0], dtype, DTYPES[stock_dt], rng)
        del models

    int4 = [] if args.no_quantized else run_int4(session, args, threads, bandwidth, t_start)

    lib = f"library {args.library}" if args.library else f"hcfuse {git_label()}"
    meta = (f"onnxruntime {ort.__version__}, {cores} cores, {lib}{'' if session.spinning else ', pool spinning off'}; "
            "copy bandwidth " +
            ", ".join(f"{b / 1e9:.1f} GB/s ({t} thread{'s' if t > 1 else ''})" for t, b in bandwidth.items()))
    write_table(results, int4, args.out, meta, args)
    print(f"bench_cpu: {time.perf_counter() - t_start:.0f} s")
    return 0


def check_chain(session: Sessions, fused_model: bytes, stock_model: bytes, dtype, stock_dtype, rng) -> None:
    """Sanity check: the fused and stock chains agree at 1 row (loosely: float16 rounds differently at
    the stock ops' boundaries; a bfloat16 chain is checked against the float16 stock chain of the same
    weights, to bfloat16's precision)."""
    x = rng.standard_normal((1, C * H))
    outs = []
    for model, dt in ((fused_model, dtype), (stock_model, stock_dtype)):
        sess = session(model, 1)
        binding = bind(sess, {"hyper_states": x.astype(dt)})
        sess.run_with_iobinding(binding)
        outs.append(from_ort_value(binding.get_outputs()[0]).astype(np.float32))
    fused, stock = outs
    scale = float(np.abs(stock).max()) or 1.0
    gap = float(np.abs(fused - stock).max()) / scale
    bound = 0.05 if np.dtype(dtype) == np.dtype(stock_dtype) else 0.2
    if not np.isfinite(fused).all() or gap > bound:
        raise RuntimeError(f"bench_cpu: fused and stock chains disagree ({np.dtype(dtype).name} vs "
                           f"{np.dtype(stock_dtype).name}: max gap {gap:.3g} relative to the largest output)")


def write_table(results: list[dict], int4: list[dict], out: Path, meta: str, args) -> None:
    lines = [f"# HyperConnectionLowRankMix on onnxruntime CPU ({meta})", "",
             f"ms per block, median over repetitions (at least {args.min_reps}, about {args.budget_s:g} s each); "
             "node: one block, weights hot in cache; chain: decode graph with distinct weights per block "
             f"(> {args.chain_mb:g} MB, cold); ratio = fused / stock; floor = one block's weight bytes / copy bandwidth. "
             "stock = the stock chain in the dtype named (bfloat16: float16's, since ORT's CPU provider cannot run "
             "a bfloat16 stock chain).",
             "", "| dtype | threads | rows | fused node | stock node | ratio | fused chain | stock chain | ratio | floor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_key = {(r["dtype"], r["threads"], r["rows"], r["kind"]): r for r in results}
    for dt, t, rows in sorted({(r["dtype"], r["threads"], r["rows"]) for r in results},
                              key=lambda k: (list(DTYPES).index(k[0]), k[1], k[2])):
        node, chain = by_key[dt, t, rows, "node"], by_key[dt, t, rows, "chain"]
        stock = "" if node["stock_dtype"] == dt else f" ({node['stock_dtype']})"
        lines.append(f"| {dt} | {t} | {rows} | {node['fused']:.3f} | {node['stock']:.3f}{stock} | "
                     f"{node['fused'] / node['stock']:.2f} | {chain['fused']:.3f} | {chain['stock']:.3f}{stock} | "
                     f"{chain['fused'] / chain['stock']:.2f} | {node['floor']:.3f} |")
    if int4:
        lines += int4_table(int4)
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print("bench_cpu: wrote", out)


if __name__ == "__main__":
    sys.exit(main())
