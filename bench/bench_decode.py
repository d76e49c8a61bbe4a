"""Decode benchmark of HyperConnectionLowRankMix on onnxruntime-gpu.

A chain of N blocks of the real shape (C=4, H=2560, R=320, Qwen3.8-Flash-Next attributes) with 8
distinct weight sets cycling (constant initializers, 105 MB in bf16: they do not stay in the 60 MB
L2). Block k+1 takes streams = streams_out of block k, prev_post_gate = post_gate of block k and,
as the stand-in for the sublayer between two blocks, prev_block_output = pre_output of block k
itself (no node in between, so the timing is the blocks' alone). Block 0 has no prologue.

Variants, all in one run: the fused op on its fast path and on its general path
(HCFUSE_FORCE_PATH, read when the session creates its kernels), on the path it picks itself ("auto":
the fast path up to 16 rows, the general path's few-row or prefill range above), and the stock unfused
chain (hcfuse.unfuse of the same model: the contrib ops and MatMul/Sigmoid/Div/Mul on CUDA).
Each session runs under CUDA graphs with IO binding (one captured graph per row count,
`gpu_graph_id`). us per block = slope between the 96- and 48-block chains, each the best of
`--reps` repetitions of `--replays` replays (3 repetitions where one replay takes over --slow-ms;
fewer replays where a repetition would take over --rep-ms, at least 2); both chains' sessions are
open together and their repetitions alternate, so both are timed in the same state of the process (the
general path's chains were measured 7-10% slower once another session's MatMul had run in the process;
see bench/README.md). The SM clock is printed after each variant. Writes a markdown table, a CSV
and a PNG plot (us per block vs rows, with the memory floor - weights and activations once at
4.24 TB/s - and the compute floor - 2 (2 K R + K C) flops per row at the matrix rate) into --out.

    python3 bench/bench_decode.py --out bench/out   # decode: 1-64 rows, fast/general/stock
    python3 bench/bench_decode.py --out bench/prefill --dtypes bf16 fp16 fp32 --variants auto stock \
        --rows 1 2 4 8 16 32 64 128 256 512 1024 2048 4096 8192 16384   # the prefill curve
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hcfuse  # noqa: E402
from hcfuse._op import DOMAIN, IR_VERSION, OP_TYPE, QWEN_CONFIG  # noqa: E402
from hcfuse._op import ONNX_OPSET as OPSET  # noqa: E402
from hcfuse.models.hc_block import random_weights  # noqa: E402

C, H, R = QWEN_CONFIG["num_branches"], QWEN_CONFIG["hidden"], QWEN_CONFIG["rank"]
ATTRS = {k: QWEN_CONFIG[k] for k in ("epsilon", "reduction_scale", "silu_alpha", "gate_div", "gate_mul")}
WEIGHT_SETS = 8
MEMORY_BANDWIDTH = 4.24e12  # bytes/s, device-to-device copy on the H200 measured (read + write)
# Matrix rate of the products, flop/s: dense bf16/fp16 with fp32 accumulation as measured on the H200;
# float32 runs cuBLASLt's fp32 (no TF32) GEMMs: the H200's fp32 vector peak.
MATRIX_RATE = {"bf16": 790e12, "fp16": 790e12, "fp32": 67e12}
DTYPES = {"bf16": (ml_dtypes.bfloat16, TensorProto.BFLOAT16), "fp16": (np.float16, TensorProto.FLOAT16),
          "fp32": (np.float32, TensorProto.FLOAT)}
VARIANTS = ("fast", "general", "stock")
OURS = ("auto", "fast", "general")  # the first of these a row has is hcfuse's figure in the table
# Variants that set the library's benchmark switches, which only a library built with
# -DHCFUSE_DEV_KNOBS=ON reads: PATH/CHOICE (CHOICE below) and fast@SS,HID (the fast path with
# HCFUSE_FAST_SS_LOCAL_ROWS=SS and HCFUSE_FAST_HIDDEN_LOCAL_ROWS=HID: how its work is split).
TUNING_ENV = ("HCFUSE_FAST_SS_LOCAL_ROWS", "HCFUSE_FAST_HIDDEN_LOCAL_ROWS")
SWITCH_CHOICES = {
    "generic": "the fast path's generic kernels where the real shape's would run (HCFUSE_FAST_REAL_SHAPE=0)",
    "aheadN": "at most N kernels wait next to a running one (HCFUSE_FAST_AHEAD=N; 0: any)",
    "stage2-N": "at most N stage 2 CTAs (HCFUSE_FAST_STAGE2_CTAS=N; the real shape: 80 or 160)",
    "fused-up": "the general path's up product and gate epilogue in one kernel (HCFUSE_UP_GATE=1)",
    "lt-up": "the general path's up product on cuBLASLt, then the gate epilogue (HCFUSE_UP_GATE=0)",
}
SLOW_REPS = 3  # repetitions for chains whose replay takes longer than --slow-ms
# ONNX Runtime 1.32's own fused op (its two-kernel CUDA design), bf16, H200: its published us per block by
# rows, drawn next to the measured curves (not measured here: onnxruntime-gpu 1.32 is not published yet)
PUBLISHED_BF16 = {1: 10.2, 2: 12.9, 4: 21.1, 8: 33.2, 16: 32.8}


def chain_model(num_blocks: int, dtype, elem: int, weights: list[dict[str, np.ndarray]],
                sublayers: list[np.ndarray] | None = None) -> onnx.ModelProto:
    """num_blocks fused nodes chained as the module docstring says; rows is a symbolic dim. With
    sublayers (H x H matrices), prev_block_output of block k+1 is MatMul(pre_output of block k, W[k % n]):
    the "real model" variant, a sublayer kernel (which does not trigger dependents early) between blocks."""
    inits = [numpy_helper.from_array(w[name].astype(dtype), f"w{s}_{name}")
             for s, w in enumerate(weights) for name in w]
    inits += [numpy_helper.from_array(m.astype(dtype), f"sub{s}") for s, m in enumerate(sublayers or [])]
    nodes = []
    prev = None  # (pre_output, post_gate, streams_out) of the previous block
    for k in range(num_blocks):
        s = k % len(weights)
        wnames = [f"w{s}_{n}" for n in ("norm_scale", "down_weight", "up_weight", "inject_weight")]
        if prev is not None and sublayers:
            nodes.append(helper.make_node("MatMul", [prev[0], f"sub{(k - 1) % len(sublayers)}"], [f"sub_out_{k}"],
                                          name=f"sublayer_{k}"))
            prev = [f"sub_out_{k}", prev[1], prev[2]]
        ins = ["streams", *wnames] if prev is None else [prev[2], *wnames, prev[0], prev[1]]
        outs = [f"pre_{k}", f"gate_{k}", f"streams_{k}"]
        nodes.append(helper.make_node(OP_TYPE, ins, outs, domain=DOMAIN, name=f"block_{k}", num_branches=C, **ATTRS))
        prev = outs
    last = num_blocks - 1
    graph = helper.make_graph(
        nodes, f"hc_chain_{num_blocks}",
        [helper.make_tensor_value_info("streams", elem, ["rows", C * H])],
        [helper.make_tensor_value_info(f"pre_{last}", elem, ["rows", H]),
         helper.make_tensor_value_info(f"gate_{last}", elem, ["rows", C]),
         helper.make_tensor_value_info(f"streams_{last}", elem, ["rows", C * H])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=IR_VERSION)


def matmul_chain_model(num_blocks: int, elem: int, dtype, sublayers: list[np.ndarray]) -> onnx.ModelProto:
    """The sublayers alone: x_{k+1} = MatMul(x_k, W[k % n]) for num_blocks - 1 steps (the real-model
    variant's MatMuls without the blocks), so the blocks' share of that variant can be told apart."""
    inits = [numpy_helper.from_array(m.astype(dtype), f"sub{s}") for s, m in enumerate(sublayers)]
    nodes = [helper.make_node("MatMul", [f"x_{k}", f"sub{k % len(sublayers)}"], [f"x_{k + 1}"])
             for k in range(num_blocks - 1)]
    nodes[0].input[0] = "streams"
    graph = helper.make_graph(nodes, f"matmul_chain_{num_blocks}",
                              [helper.make_tensor_value_info("streams", elem, ["rows", H])],
                              [helper.make_tensor_value_info(f"x_{num_blocks - 1}", elem, ["rows", H])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def ortvalue(ort, shape, elem: int, host: np.ndarray | None = None):
    """A CUDA OrtValue of the given type (bf16 through a uint16 view: ORT's Python API lacks ml_dtypes)."""
    v = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), elem, "cuda", 0)
    if host is not None:
        v.update_inplace(np.ascontiguousarray(host).view(np.uint16) if host.dtype == ml_dtypes.bfloat16 else host)
    return v


def switch_env(choice: str) -> dict[str, str]:
    """The variables a variant's CHOICE (SWITCH_CHOICES) sets; empty for none."""
    if not choice:
        return {}
    if choice == "generic":
        return {"HCFUSE_FAST_REAL_SHAPE": "0"}
    if choice.startswith("ahead") and choice[len("ahead"):].isdigit():
        return {"HCFUSE_FAST_AHEAD": choice[len("ahead"):]}
    if choice.startswith("stage2-") and choice[len("stage2-"):].isdigit():
        return {"HCFUSE_FAST_STAGE2_CTAS": choice[len("stage2-"):]}
    if choice in ("fused-up", "lt-up"):
        return {"HCFUSE_UP_GATE": "1" if choice == "fused-up" else "0"}
    raise SystemExit(f"bench_decode: unknown variant choice '/{choice}': one of {', '.join(SWITCH_CHOICES)}")


def library_reads_switches(ort) -> bool:
    """Whether the library was built with HCFUSE_DEV_KNOBS: only such a library refuses a bad HCFUSE_UP_GATE."""
    from hcfuse.models.hc_block import make_fused_node_model

    model = make_fused_node_model(C=4, H=64, R=8, dtype=np.float16)
    so = ort.SessionOptions()
    so.register_custom_ops_library(hcfuse.get_library_path())
    os.environ["HCFUSE_UP_GATE"] = "invalid"
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=["CUDAExecutionProvider"])
    except Exception as e:  # onnxruntime's error for a failed kernel creation
        return "HCFUSE_UP_GATE" in str(e)
    finally:
        del os.environ["HCFUSE_UP_GATE"]
    return False


class ChainRunner:
    """One session (one variant, dtype and chain length) with a CUDA graph per row count."""

    def __init__(self, ort, model: onnx.ModelProto, variant: str, elem: int, dtype):
        so = ort.SessionOptions()
        env = {}
        if variant not in ("stock", "matmul"):
            so.register_custom_ops_library(hcfuse.get_library_path())
            path, _, tuning = variant.partition("@")
            path, _, choice = path.partition("/")
            env["HCFUSE_FORCE_PATH"] = "" if path == "auto" else path  # empty: the op picks
            env.update(switch_env(choice))
            if tuning:
                env.update(zip(TUNING_ENV, tuning.split(",")))
        os.environ.update(env)  # read when the session creates its kernels
        try:
            self.sess = ort.InferenceSession(model.SerializeToString(), so,
                                             providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
        finally:
            for name in env:
                os.environ.pop(name, None)
        self.ort, self.elem, self.dtype = ort, elem, dtype
        self.outputs = [o.name for o in self.sess.get_outputs()]
        self.bindings: dict[int, tuple] = {}

    def prepare(self, rows: int, graph_id: int, reps: int, replays: int, slow_s: float, rep_s: float,
                rng) -> tuple[int, int]:
        """Binds rows, captures the graph and warms it; returns (repetitions, replays per repetition)."""
        ort = self.ort
        if rows not in self.bindings:
            width = self.sess.get_inputs()[0].shape[-1]
            streams = ortvalue(ort, (rows, width), self.elem, rng.standard_normal((rows, width)).astype(self.dtype))
            outs = [ortvalue(ort, (rows, o.shape[-1]), self.elem) for o in self.sess.get_outputs()]
            io = self.sess.io_binding()
            io.bind_ortvalue_input("streams", streams)
            for name, v in zip(self.outputs, outs):
                io.bind_ortvalue_output(name, v)
            opts = ort.RunOptions()
            opts.add_run_config_entry("gpu_graph_id", str(graph_id))
            self.bindings[rows] = (io, streams, outs, opts)
        for _ in range(3):  # capture, then warm replays
            self.replay_s(rows, 1)
        one = self.replay_s(rows, 1)
        if one > slow_s:  # keeps the whole run within a few minutes
            reps = min(reps, SLOW_REPS)
        return reps, max(2, min(replays, int(rep_s / one)))

    def replay_s(self, rows: int, replays: int) -> float:
        """Mean seconds of one replay over `replays` back to back (prepare first)."""
        io, _, _, opts = self.bindings[rows]
        t0 = time.perf_counter()
        for _ in range(replays):
            self.sess.run_with_iobinding(io, opts)
        return (time.perf_counter() - t0) / replays

    def check_finite(self, rows: int) -> None:
        """Sanity check of the last pre_output (fp16 only: the Python API reads no bf16 device tensor)."""
        value = self.bindings[rows][2][0]
        if value.element_type() == TensorProto.BFLOAT16:
            return
        if not np.isfinite(value.numpy().astype(np.float32)).all():
            raise RuntimeError(f"bench_decode: non-finite pre_output at rows={rows}")


def time_chains(runners: dict[int, ChainRunner], rows: int, graph_id: int, reps: int, replays: int, slow_s: float,
                rep_s: float, rng) -> dict[int, float]:
    """Best over repetitions of each chain's mean replay time, in us. The chains' repetitions are taken in
    turn, so that the short and the long chain of a slope are timed in the same state: on the H200 the
    same captured graph of the general path ran 7-10% slower once another session's MatMul had run in the
    process (at a steady 1980 MHz SM clock; bench/README.md), which a slope of a long chain timed after
    that and its short one before would count as per-block cost."""
    plans = {n: r.prepare(rows, graph_id, reps, replays, slow_s, rep_s, rng) for n, r in runners.items()}
    best = dict.fromkeys(runners, float("inf"))
    for _ in range(min(p[0] for p in plans.values())):
        for n, r in runners.items():
            best[n] = min(best[n], r.replay_s(rows, plans[n][1]))
    return {n: b * 1e6 for n, b in best.items()}


def sm_clock_mhz() -> str:
    """The GPU's SM clock now (nvidia-smi), for the log; '?' where it cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return out[0] if out else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def floor_us(rows: int, itemsize: int) -> float:
    """Bytes one block must move (weights once; streams in/out, prev/pre, gates) at the copy bandwidth."""
    K = C * H
    weights = (2 * K * R + K * C + K) * itemsize
    acts = rows * (2 * K + 2 * H + 2 * C) * itemsize
    return (weights + acts) / MEMORY_BANDWIDTH * 1e6


def compute_floor_us(rows: int, dt: str) -> float:
    """The block's products (down, up, inject: 2 (2 K R + K C) flops a row, 13.2 M) at the matrix rate."""
    K = C * H
    return rows * 2 * (2 * K * R + K * C) / MATRIX_RATE[dt] * 1e6


def ours(r: dict) -> float:
    """hcfuse's figure of a result row: auto where measured, else fast, else general."""
    for key in OURS:
        if key in r and not np.isnan(r[key]):
            return r[key]
    return float("nan")


def write_outputs(results: list[dict], out: Path, meta: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "decode.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(results[0]))
        w.writeheader()
        w.writerows(results)
    variants = [k for k in results[0] if k not in ("dtype", "rows", "floor", "compute_floor", "matmul")]
    lines = [f"# HyperConnectionLowRankMix benchmark ({meta})", "",
             "us per block (slope 96 vs 48 blocks); memory floor = weights + activations once at 4.24 TB/s;",
             "compute floor = the products at the matrix rate; hcfuse = auto, else fast, else general;",
             "fraction = max(floors) / hcfuse; speedup = stock / hcfuse.", "",
             "| dtype | rows |" + "".join(f" {k} |" for k in variants)
             + " memory floor | compute floor | fraction of floor | speedup vs stock |",
             "|---|---|" + "---|" * len(variants) + "---|---|---|---|"]

    def us(v: float) -> str:
        return "n/a" if np.isnan(v) else f"{v:.2f}"

    if "matmul" in results[0]:  # real-model variant: what the blocks add to the MatMuls alone
        lines[-2] += " matmul | hcfuse over matmul | stock over matmul |"
        lines[-1] += "---|---|---|"
    for r in results:
        mine, stock = ours(r), r.get("stock", float("nan"))
        over = (f" {us(r['matmul'])} | {us(mine - r['matmul'])} | {us(stock - r['matmul'])} |"
                if "matmul" in r else "")
        bound = max(r["floor"], r["compute_floor"])
        lines.append(f"| {r['dtype']} | {r['rows']} |" + "".join(f" {us(r[k])} |" for k in variants)
                     + f" {r['floor']:.2f} | {r['compute_floor']:.2f} | {bound / mine:.0%} | {stock / mine:.2f}x |"
                     + over)
    (out / "decode.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(results, out / "decode.png")


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_decode: matplotlib missing; plot later with --plot-from", path.parent / "decode.csv")
        return
    dtypes = sorted({r["dtype"] for r in results})
    variants = [k for k in results[0] if k not in ("dtype", "rows", "floor", "compute_floor")]
    styles = {"stock": "s-", "general": "^-", "fast": "o-", "auto": "o-", "matmul": "x-"}
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
    for ax, dt in zip(axes[0], dtypes):
        rs = [r for r in results if r["dtype"] == dt]
        rows = [r["rows"] for r in rs]
        for key in variants:
            if not all(np.isnan(r[key]) for r in rs):
                ax.plot(rows, [r[key] for r in rs], styles.get(key, ".-"), label=f"hcfuse {key}" if key != "stock" else key)
        published = [(n, PUBLISHED_BF16[n]) for n in rows if dt == "bf16" and n in PUBLISHED_BF16]
        if published:
            ax.plot(*zip(*published), "D--", color="gray", label="ONNX Runtime 1.32 fused op (published)")
        ax.plot(rows, [r["floor"] for r in rs], "k--", label="memory floor (4.24 TB/s)")
        ax.plot(rows, [r["compute_floor"] for r in rs], "k:", label="compute floor")
        ax.set_xscale("log", base=2)
        ax.set_xticks(rows, [str(x) for x in rows], rotation=45 if len(rows) > 8 else 0)
        if max(rows) / min(rows) > 64:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("rows")
        ax.set_ylabel("us per block")
        ax.set_title(f"{dt}: C={C}, H={H}, R={R}, H200, CUDA graphs")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print("bench_decode: wrote", path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=list(DTYPES))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS),
                    help=f"any of {', '.join(VARIANTS)}, auto, or (libraries built with -DHCFUSE_DEV_KNOBS=ON) "
                         f"PATH/CHOICE with CHOICE one of {', '.join(SWITCH_CHOICES)}, or fast@SS,HID (the fast "
                         "path with a work split)")
    ap.add_argument("--blocks", type=int, nargs=2, default=[48, 96], metavar=("SHORT", "LONG"))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--slow-ms", type=float, default=3.0, help=f"replays slower than this get {SLOW_REPS} repetitions")
    ap.add_argument("--rep-ms", type=float, default=1e9,
                    help="fewer replays (at least 2) where one repetition would take longer than this")
    ap.add_argument("--sublayer", action="store_true",
                    help="real-model variant: an H x H MatMul between blocks; adds the 'matmul' variant (the "
                         "MatMuls alone) and the blocks' cost over it")
    ap.add_argument("--plot-from", type=Path, help="only plot an existing decode.csv")
    args = ap.parse_args()
    if args.plot_from:
        with open(args.plot_from) as f:
            rows = [{k: (v if k == "dtype" else int(v) if k == "rows" else float(v)) for k, v in r.items()}
                    for r in csv.DictReader(f)]
        plot(rows, args.plot_from.with_suffix(".png"))
        return

    import onnxruntime as ort

    switched = [v for v in args.variants if "/" in v or "@" in v]
    for v in switched:
        switch_env(v.partition("@")[0].partition("/")[2])  # an unknown choice stops here
    if switched and not library_reads_switches(ort):
        raise SystemExit(f"bench_decode: the variants {' '.join(switched)} set benchmark switches, but "
                         f"{hcfuse.get_library_path()} was built without them: build the library with "
                         "-DHCFUSE_DEV_KNOBS=ON (bench/build_kernels.sh SRC DIR LOG -DHCFUSE_DEV_KNOBS=ON)")
    rng = np.random.default_rng(6)
    short, long_ = args.blocks
    results = []
    for dt in args.dtypes:
        dtype, elem = DTYPES[dt]
        weights = [random_weights(C, H, R, dtype, rng) for _ in range(WEIGHT_SETS)]
        sublayers = ([(rng.standard_normal((H, H)) / np.sqrt(H)).astype(dtype) for _ in range(WEIGHT_SETS)]
                     if args.sublayer else None)
        variants = [*args.variants, "matmul"] if args.sublayer else args.variants
        times = {}  # (variant, blocks, rows) -> us per chain replay
        fused = {n: chain_model(n, dtype, elem, weights, sublayers) for n in (short, long_)}
        for variant in variants:
            t0 = time.perf_counter()
            runners = {}
            for n in (short, long_):
                if variant == "matmul":
                    model = matmul_chain_model(n, elem, dtype, sublayers)
                else:
                    model = hcfuse.unfuse(fused[n]) if variant == "stock" else fused[n]
                runners[n] = ChainRunner(ort, model, variant, elem, dtype)
            for gid, rows in enumerate(args.rows):
                t = time_chains(runners, rows, gid, args.reps, args.replays, args.slow_ms * 1e-3, args.rep_ms * 1e-3, rng)
                for n, us in t.items():
                    times[variant, n, rows] = us
                    runners[n].check_finite(rows)
            for n in (short, long_):
                print(f"{dt} {variant:7s} {n:3d} blocks: " +
                      " ".join(f"{r}:{times[variant, n, r]:.0f}" for r in args.rows) + " us/replay", flush=True)
            print(f"{dt} {variant:7s} ({time.perf_counter() - t0:.1f} s, SM clock after it {sm_clock_mhz()} MHz)",
                  flush=True)
            del runners
        for rows in args.rows:
            rec = {"dtype": dt, "rows": rows}
            for variant in variants:
                rec[variant] = (times[variant, long_, rows] - times[variant, short, rows]) / (long_ - short)
            rec["floor"] = floor_us(rows, np.dtype(dtype).itemsize)
            rec["compute_floor"] = compute_floor_us(rows, dt)
            results.append(rec)
        meta = (("real-model variant (H x H MatMul between blocks; 'matmul' = the MatMuls alone), " if args.sublayer
                 else "") + f"onnxruntime {ort.__version__}, {short}/{long_} blocks, best of {args.reps} x {args.replays} replays "
                f"({SLOW_REPS} x where a replay takes over {args.slow_ms:g} ms; replays cut to fit {args.rep_ms:g} ms "
                "a repetition, at least 2)")
        write_outputs(results, args.out, meta)  # after each dtype, so a cut-short run keeps what it measured


if __name__ == "__main__":
    main()
