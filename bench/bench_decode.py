"""Decode benchmark of HyperConnectionLowRankMix and its quantized form on onnxruntime-gpu.

A chain of N blocks of the real shape (C=4, H=2560, R=320, Qwen3.8-Flash-Next attributes) with distinct weight
sets cycling as constant initializers, enough that they do not stay in the L2 (dense: 8 sets, 105 MB in bf16;
int4: 32 sets of 3.7 MB, 119 MB; --weight-sets changes the counts). Block k+1 takes streams = streams_out of
block k, prev_post_gate = post_gate of block k and, as the stand-in for the sublayer between two blocks,
prev_block_output = pre_output of block k itself (no node in between, so the timing is the blocks' alone).
Block 0 has no prologue.

Variants, all in one run (names keep their meaning; --variants picks):
  fast, general  com.microsoft.HyperConnectionLowRankMix (hcfuse's kernel) pinned to a path by HCFUSE_FORCE_PATH
                 (read when the session creates its kernels), dense weights;
  auto           the same op on the path it picks (the fast path up to 16 rows, the general path above);
  stock          hcfuse.unfuse of the dense chain: the contrib ops and MatMul/Sigmoid/Div/Mul on CUDA;
  nbits          ai.hcfuse.HyperConnectionLowRankMixNBits (hcfuse's kernel) on the path it picks (the fast
                 path's quantized kernels up to 16 rows, its general kernels above), both projections int4 as
                 onnxruntime-genai's int4 build writes them: MatMulNBitsQuantizer(block_size=32,
                 is_symmetric=True, accuracy_level=4), down+inject packed (N = R + C), scales T [N, k_blocks], no
                 zero points (hcfuse.models.nbits.nbits_weights runs that quantizer's routine);
  nbits-fast, nbits-general  the same pinned to a path (HCFUSE_FORCE_PATH=fast or general);
  stock-int4     hcfuse.unfuse of the nbits chain: the same quantized bytes, its two MatMuls per block
                 com.microsoft.MatMulNBits run by onnxruntime's CUDA provider, the rest as stock;
  matmul         (--sublayer only) the sublayer MatMuls alone.
A variant whose session cannot run every node on CUDAExecutionProvider (e.g. an op without a CUDA kernel, which
onnxruntime would run on the CPU) is not timed: the table shows n/a and a line under it says why. Sessions are
created with CPU fallback disabled and, where onnxruntime records it, every node's provider is checked.

Each session runs under CUDA graphs with IO binding (one captured graph per row count, `gpu_graph_id`). us per
block = slope between the 96- and 48-block chains, each the best of `--reps` repetitions of `--replays` replays
(3 repetitions where one replay takes over --slow-ms; fewer replays where a repetition would take over --rep-ms,
at least 2); both chains' sessions are open together and their repetitions alternate, so both are timed in the
same state of the process (the general path's chains were measured 7-10% slower once another session's MatMul
had run in the process; see bench/README.md). The SM clock is printed after each variant. Writes a markdown
table, a CSV and a PNG plot (us per block vs rows, with the memory floor of each weight format - its weights and
the activations once at 4.24 TB/s - and the compute floor - 2 (2 K R + K C) flops per row at the matrix rate)
into --out.

    python3 bench/bench_decode.py --out bench/out   # decode: 1-64 rows, fast/general/stock/nbits/stock-int4
    python3 bench/bench_decode.py --out bench/prefill --dtypes bf16 fp16 fp32 --variants auto stock \
        --rows 1 2 4 8 16 32 64 128 256 512 1024 2048 4096 8192 16384   # the prefill curve
    python3 bench/bench_decode.py --dry-run         # no GPU: builds and checks every variant's models
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
from onnx import TensorProto

from decode_chains import C, DTYPES, FUSED_INT4, H, K, R, STOCK, WEIGHT_SETS, chain_model, sublayer_weights, \
    variant_format, variant_model, weight_bytes, weight_sets
import hcfuse

MEMORY_BANDWIDTH = 4.24e12  # bytes/s, device-to-device copy on the H200 measured (read + write)
# Matrix rate of the products, flop/s: dense bf16/fp16 with fp32 accumulation as measured on the H200;
# float32 runs cuBLASLt's fp32 (no TF32) GEMMs: the H200's fp32 vector peak.
MATRIX_RATE = {"bf16": 790e12, "fp16": 790e12, "fp32": 67e12}
VARIANTS = ("fast", "general", "stock", "nbits", "nbits-fast", "nbits-general", "stock-int4")
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


CUDA = "CUDAExecutionProvider"
CPU_FALLBACK_OFF = "session.disable_cpu_ep_fallback"  # session creation fails where a node would run on the CPU
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"  # get_provider_graph_assignment_info's records


class VariantUnavailable(Exception):
    """A variant's chain cannot run on the GPU as asked (the message says why); it is reported, not timed."""


def variant_setup(variant: str) -> tuple[bool, dict[str, str]]:
    """(whether the variant's session registers hcfuse's library, the variables its kernels read)."""
    if variant in STOCK or variant == "matmul":
        return False, {}
    if variant in FUSED_INT4:
        return True, {"HCFUSE_FORCE_PATH": variant.partition("-")[2]}  # "": the path it picks
    path, _, tuning = variant.partition("@")
    path, _, choice = path.partition("/")
    env = {"HCFUSE_FORCE_PATH": "" if path == "auto" else path, **switch_env(choice)}
    if tuning:
        env.update(zip(TUNING_ENV, tuning.split(",")))
    return True, env


def nodes_off_cuda(sess) -> dict[str, int] | None:
    """The session's nodes not on CUDAExecutionProvider, counted by "op_type on provider"; None where this
    onnxruntime records no assignment (get_provider_graph_assignment_info: onnxruntime 1.24 and later)."""
    if not hasattr(sess, "get_provider_graph_assignment_info"):
        return None
    counts: dict[str, int] = {}
    for subgraph in sess.get_provider_graph_assignment_info():
        if subgraph.ep_name != CUDA:
            for node in subgraph.get_nodes():
                key = f"{node.domain + '.' if node.domain else ''}{node.op_type} on {subgraph.ep_name}"
                counts[key] = counts.get(key, 0) + 1
    return counts


def describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {key}" for key, n in sorted(counts.items()))


def refused_because(ort, model: bytes, library: bool, error: Exception) -> str:
    """Why a session with CPU fallback disabled was refused: the nodes onnxruntime puts off CUDA when fallback is
    allowed (a probe session without CUDA graphs), else onnxruntime's own message."""
    so = ort.SessionOptions()
    so.add_session_config_entry(RECORD_ASSIGNMENT, "1")
    if library:
        so.register_custom_ops_library(hcfuse.get_library_path())
    try:
        off = nodes_off_cuda(ort.InferenceSession(model, so, providers=[CUDA]))
    except Exception as probe_error:  # onnxruntime's error: the model cannot run at all
        return f"no session: {first_line(probe_error)}"
    if off:
        return f"not all on {CUDA}: {describe(off)} (no CUDA kernel)"
    return f"no session: {first_line(error)}"


def first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class ChainRunner:
    """One session (one variant, dtype and chain length) with a CUDA graph per row count; every node on CUDA
    (VariantUnavailable otherwise)."""

    def __init__(self, ort, model: onnx.ModelProto, variant: str, elem: int, dtype):
        library, env = variant_setup(variant)
        so = ort.SessionOptions()
        so.add_session_config_entry(CPU_FALLBACK_OFF, "1")
        so.add_session_config_entry(RECORD_ASSIGNMENT, "1")
        if library:
            so.register_custom_ops_library(hcfuse.get_library_path())
        serialized = model.SerializeToString()
        os.environ.update(env)  # read when the session creates its kernels
        try:
            self.sess = ort.InferenceSession(serialized, so, providers=[(CUDA, {"enable_cuda_graph": "1"})])
        except Exception as e:  # onnxruntime's error: a node off CUDA, no kernel at all, a failed kernel creation
            raise VariantUnavailable(refused_because(ort, serialized, library, e)) from e
        finally:
            for name in env:
                os.environ.pop(name, None)
        off = nodes_off_cuda(self.sess)
        if off:
            raise VariantUnavailable(f"not all on {CUDA}: {describe(off)}")
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


FLOORS = {"dense": "floor", "int4": "floor_int4"}  # the memory floor's key in a result row, per weight format
NOT_VARIANTS = ("dtype", "rows", *FLOORS.values(), "compute_floor")


def floor_us(rows: int, itemsize: int, fmt: str = "dense") -> float:
    """Bytes one block must move (its format's weights once; streams in/out, prev/pre, gates) at the copy
    bandwidth."""
    acts = rows * (2 * K + 2 * H + 2 * C) * itemsize
    return (weight_bytes(fmt, itemsize) + acts) / MEMORY_BANDWIDTH * 1e6


def compute_floor_us(rows: int, dt: str) -> float:
    """The block's products (down, up, inject: 2 (2 K R + K C) flops a row, 13.2 M) at the matrix rate."""
    return rows * 2 * (2 * K * R + K * C) / MATRIX_RATE[dt] * 1e6


def ours(r: dict) -> float:
    """hcfuse's figure of a result row: auto where measured, else fast, else general."""
    for key in OURS:
        if key in r and not np.isnan(r[key]):
            return r[key]
    return float("nan")


def us(v: float) -> str:
    return "n/a" if np.isnan(v) else f"{v:.2f}"


def ratio(a: float, b: float, fmt: str, suffix: str = "") -> str:
    return "n/a" if np.isnan(a) or np.isnan(b) or b == 0 else format(a / b, fmt) + suffix


def table_lines(results: list[dict], meta: str, notes: list[str]) -> list[str]:
    """The markdown table: each variant's us per block, the floors, and per weight format hcfuse's fraction of
    its floor and speedup over the stock chain of the same weights."""
    first = results[0]
    variants = [k for k in first if k not in NOT_VARIANTS and k != "matmul"]
    dense = any(k in first for k in OURS)
    int4 = "nbits" in first
    head = [f" {k} |" for k in variants] + [" memory floor |"] + [" int4 memory floor |"] * ("floor_int4" in first)
    head += [" compute floor |"]
    head += [" fraction of floor | speedup vs stock |"] * dense
    head += [" nbits fraction of int4 floor | nbits speedup vs stock-int4 |"] * int4
    over = [k for k in ("hcfuse", "stock", "nbits", "stock-int4") if k in first or (k == "hcfuse" and dense)]
    if "matmul" in first:  # real-model variant: what the blocks add to the MatMuls alone
        head += [" matmul |"] + [f" {k} over matmul |" for k in over]
    lines = [f"# HyperConnectionLowRankMix benchmark ({meta})", "",
             "us per block (slope between the long and the short chain); memory floor = the block's weights + "
             "activations once at 4.24 TB/s (int4: B and scales of both projections); compute floor = the products "
             "at the matrix rate;",
             "hcfuse = auto, else fast, else general; fraction = max(floors) / hcfuse; speedup = stock / hcfuse "
             "(int4: the same with nbits, stock-int4 and the int4 floor).", "",
             "| dtype | rows |" + "".join(head), "|---|---|" + "---|" * "".join(head).count("|")]
    for r in results:
        mine, compute = ours(r), r["compute_floor"]
        cells = [us(r[k]) for k in variants] + [f"{r['floor']:.2f}"]
        cells += [f"{r['floor_int4']:.2f}"] * ("floor_int4" in r) + [f"{compute:.2f}"]
        if dense:
            cells += [ratio(max(r["floor"], compute), mine, ".0%"), ratio(r.get("stock", np.nan), mine, ".2f", "x")]
        if int4:
            cells += [ratio(max(r["floor_int4"], compute), r["nbits"], ".0%"),
                      ratio(r.get("stock-int4", np.nan), r["nbits"], ".2f", "x")]
        if "matmul" in r:
            cells += [us(r["matmul"])] + [us((mine if k == "hcfuse" else r[k]) - r["matmul"]) for k in over]
        lines.append(f"| {r['dtype']} | {r['rows']} |" + "".join(f" {c} |" for c in cells))
    return lines + ([""] + [f"- {note}" for note in notes] if notes else [])


def write_outputs(results: list[dict], out: Path, meta: str, notes: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "decode.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(results[0]))
        w.writeheader()
        w.writerows(results)
    lines = table_lines(results, meta, notes)
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
    variants = [k for k in results[0] if k not in NOT_VARIANTS]
    styles = {"stock": "s-", "general": "^-", "fast": "o-", "auto": "o-", "matmul": "x-", "nbits": "v-", "nbits-fast": "v:", "nbits-general": "v--",
              "stock-int4": "P-"}
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
    for ax, dt in zip(axes[0], dtypes):
        rs = [r for r in results if r["dtype"] == dt]
        rows = [r["rows"] for r in rs]
        for key in variants:
            if not all(np.isnan(r[key]) for r in rs):
                ax.plot(rows, [r[key] for r in rs], styles.get(key, ".-"),
                        label=key if key in STOCK or key == "matmul" else f"hcfuse {key}")
        published = [(n, PUBLISHED_BF16[n]) for n in rows if dt == "bf16" and n in PUBLISHED_BF16]
        if published:
            ax.plot(*zip(*published), "D--", color="gray", label="ONNX Runtime 1.32 fused op (published)")
        ax.plot(rows, [r["floor"] for r in rs], "k--", label="memory floor (4.24 TB/s)")
        if "floor_int4" in rs[0]:
            ax.plot(rows, [r["floor_int4"] for r in rs], "--", color="gray", label="int4 memory floor")
        ax.plot(rows, [r["compute_floor"] for r in rs], "k:", label="compute floor")
        ax.set_xscale("log", base=2)
        ax.set_xticks(rows, [str(x) for x in rows], rotation=45 if len(rows) > 8 else 0)
        if max(rows) / min(rows) > 64:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("rows")
        ax.set_ylabel("us per block")
        ax.set_title(f"{dt}: C={C}, H={H}, R={R}, CUDA graphs")
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
                    help="real-model variant: an H x H MatMul between blocks (dense, the same for every variant); "
                         "adds the 'matmul' variant (the MatMuls alone) and the blocks' cost over it")
    ap.add_argument("--weight-sets", type=int, nargs=2, default=[WEIGHT_SETS["dense"], WEIGHT_SETS["int4"]],
                    metavar=("DENSE", "INT4"), help="distinct weight sets cycling through a chain, per weight format")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: build every variant's models at 2 and 4 blocks, check them (onnx.checker, the "
                         "int4 chain's unfusion and refusion) and compare fused "
                         "and stock chains of 2 blocks on onnxruntime's CPU provider")
    ap.add_argument("--plot-from", type=Path, help="only plot an existing decode.csv")
    args = ap.parse_args()
    if args.plot_from:
        with open(args.plot_from) as f:
            rows = [{k: (v if k == "dtype" else int(v) if k == "rows" else float(v)) for k, v in r.items()}
                    for r in csv.DictReader(f)]
        plot(rows, args.plot_from.with_suffix(".png"))
        return
    for v in args.variants:
        if "/" in v or "@" in v:
            switch_env(v.partition("@")[0].partition("/")[2])  # an unknown choice stops here
        elif v not in (*VARIANTS, "auto"):
            raise SystemExit(f"bench_decode: unknown variant {v!r}: one of {', '.join(VARIANTS)}, auto, PATH/CHOICE, "
                             "fast@SS,HID")
    if args.dry_run:
        from decode_dry_run import dry_run

        dry_run(args.dtypes, args.variants, args.sublayer, dict(zip(("dense", "int4"), args.weight_sets)))
        return
    measure(args)


def measure(args: argparse.Namespace) -> None:
    import onnxruntime as ort

    if CUDA not in ort.get_available_providers():
        raise SystemExit(f"bench_decode: this onnxruntime ({ort.__version__}) has no {CUDA}; --dry-run builds and "
                         "checks the models without a GPU")
    switched = [v for v in args.variants if "/" in v or "@" in v]
    if switched and not library_reads_switches(ort):
        raise SystemExit(f"bench_decode: the variants {' '.join(switched)} set benchmark switches, but "
                         f"{hcfuse.get_library_path()} was built without them: build the library with "
                         "-DHCFUSE_DEV_KNOBS=ON (bench/build_kernels.sh SRC DIR LOG -DHCFUSE_DEV_KNOBS=ON)")
    rng = np.random.default_rng(6)
    short, long_ = args.blocks
    set_counts = dict(zip(("dense", "int4"), args.weight_sets))
    results, notes = [], []
    variants = [*args.variants, "matmul"] if args.sublayer else list(args.variants)
    formats = sorted({variant_format(v) for v in variants if v != "matmul"})
    for dt in args.dtypes:
        dtype, elem = DTYPES[dt]
        sublayers = sublayer_weights(dtype, rng, WEIGHT_SETS["dense"]) if args.sublayer else None
        fused = {}  # (format, blocks) -> the fused chain
        for fmt in formats:
            sets = weight_sets(fmt, set_counts[fmt], dtype, rng)
            fused.update({(fmt, n): chain_model(n, elem, sets, sublayers) for n in (short, long_)})
            del sets
        times = {}  # (variant, blocks, rows) -> us per chain replay
        for variant in variants:
            t0 = time.perf_counter()
            fmt = variant_format(variant)
            try:
                runners = {n: ChainRunner(ort, variant_model(variant, fused.get((fmt, n)), elem, n, sublayers), variant,
                                          elem, dtype) for n in (short, long_)}
            except VariantUnavailable as e:
                notes.append(f"{dt} {variant}: n/a, not timed: {e}")
                print(f"{dt} {variant:10s} n/a, not timed: {e}", flush=True)
                times.update({(variant, n, rows): float("nan") for n in (short, long_) for rows in args.rows})
                continue
            for gid, rows in enumerate(args.rows):
                try:
                    t = time_chains(runners, rows, gid, args.reps, args.replays, args.slow_ms * 1e-3,
                                    args.rep_ms * 1e-3, rng)
                    for n in runners:
                        runners[n].check_finite(rows)
                except Exception as e:  # onnxruntime's run or capture error, non-finite outputs: the rest n/a
                    notes.append(f"{dt} {variant}: n/a from {rows} rows on (in --rows order): {first_line(e)}")
                    print(f"{dt} {variant:10s} failed at {rows} rows: {e}", flush=True)
                    times.update({(variant, n, r): float("nan") for n in runners for r in args.rows[gid:]})
                    break
                times.update({(variant, n, rows): replay_us for n, replay_us in t.items()})
            for n in (short, long_):
                print(f"{dt} {variant:10s} {n:3d} blocks: " +
                      " ".join(f"{r}:{times[variant, n, r]:.0f}" for r in args.rows) + " us/replay", flush=True)
            print(f"{dt} {variant:10s} ({time.perf_counter() - t0:.1f} s, SM clock after it {sm_clock_mhz()} MHz)",
                  flush=True)
            del runners
        del fused
        itemsize = np.dtype(dtype).itemsize
        for rows in args.rows:
            rec = {"dtype": dt, "rows": rows}
            for variant in variants:
                rec[variant] = (times[variant, long_, rows] - times[variant, short, rows]) / (long_ - short)
            rec["floor"] = floor_us(rows, itemsize)
            if "int4" in formats:
                rec["floor_int4"] = floor_us(rows, itemsize, "int4")
            rec["compute_floor"] = compute_floor_us(rows, dt)
            results.append(rec)
        meta = (("real-model variant (H x H MatMul between blocks; 'matmul' = the MatMuls alone), " if args.sublayer
                 else "") + f"onnxruntime {ort.__version__}, {short}/{long_} blocks, "
                f"{' and '.join(f'{set_counts[f]} {f} weight sets' for f in formats)}, best of {args.reps} x "
                f"{args.replays} replays ({SLOW_REPS} x where a replay takes over {args.slow_ms:g} ms; replays cut to "
                f"fit {args.rep_ms:g} ms a repetition, at least 2)")
        write_outputs(results, args.out, meta, notes)  # after each dtype, so a cut-short run keeps what it measured


if __name__ == "__main__":
    main()
