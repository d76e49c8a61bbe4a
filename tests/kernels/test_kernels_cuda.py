"""CUDAExecutionProvider kernels of HyperConnectionLowRankMix, on both paths.

Every test that runs the op is parametrized over path: "general" (norm kernel + cuBLASLt GEMMs +
elementwise kernels, any shape and type) and "fast" (the fused decode kernels). The path is pinned
with HCFUSE_FORCE_PATH when the session is created. A call the fast path does not support (float32,
shapes HcFastPlanFor refuses, kernels/src/cuda/fast/hc_fast_plan.h) is skipped on "fast" - except the real shape in float16
and bfloat16, which the fast path must run.

Stated bounds against hcfuse.reference, in ulps of T measured at max(|expected|, |actual|, rms(expected))
(hcfuse.checking.verification.scaled_ulp, the measure `hcfuse optimize --verify` uses; the rms floor keeps near-zero sums, where the branches cancel, from turning
an fp32 order difference into thousands of ulps):
  streams_out: bitwise (S is one multiply and one add, rounded once, as in the reference).
  pre_output, post_gate: float32 64, float16 4, bfloat16 3 (2.05 measured on an H200 at one pre_output of
  4110 rows x 640 features, the long prefill range's GEMM plan; up to 2 at every other case).
Why not bitwise: the reference sums every dot product sequentially over K; cuBLASLt (and the fast
path's K slices) sum in another fixed order, so an fp32 result can differ in its last bits and flip
the rounding to T of down, inject or up, which moves what follows by an ulp (float16/bfloat16), or a
few fp32 ulps of relative error that sigmoid and the branch sum carry to the outputs (float32).
The measured maxima are printed at the end of the module (and written to $HCFUSE_CUDA_TEST_REPORT).
"""

from __future__ import annotations

import functools
import json
import os

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

import hcfuse
from hcfuse._op import QWEN_ATTRIBUTES, QWEN_SHAPE
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights
from hcfuse.reference import hc_lowrank_mix, hc_lowrank_mix_steps
from hcfuse.checking.verification import scaled_ulp
from tests._compare import assert_bitwise_equal, max_ulp, run_bound, to_ort_value, ulp_distance
from tests._cuda import compute_capability, cuda_session, device_to_host, fused_chain_model
from tests.kernels.test_kernels_cpu import (
    POST_GATE_ATTRS,
    POST_GATE_IDS,
    assert_post_gate_at_stock_points,
    order_free_inject_case,
)

pytestmark = pytest.mark.cuda

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
PATHS = ["general", "fast"]
QWEN = QWEN_SHAPE
QWEN_ATTRS = QWEN_ATTRIBUTES
BOUND = {np.dtype(np.float32): 64, np.dtype(np.float16): 4, BF16: 3}
FAST_UNSUPPORTED = "HCFUSE_FORCE_PATH=fast, but the fast path cannot run this call"
OUTPUT_NAMES = ("pre_output", "post_gate", "streams_out")

_STATS: dict[str, dict] = {}  # "test dtype path output" -> measured maxima or distribution


@pytest.fixture(scope="module", autouse=True)
def report_measured_maxima():
    yield
    if not _STATS:
        return
    lines = [f"{key}: {', '.join(f'{k} {v}' for k, v in values.items())}" for key, values in sorted(_STATS.items())]
    print("\nmeasured vs hcfuse.reference:\n  " + "\n  ".join(lines))
    path = os.environ.get("HCFUSE_CUDA_TEST_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_STATS, f, indent=1, sort_keys=True)


def _record(key: str, raw: int, scaled: float) -> None:
    old = _STATS.setdefault(key, {"max_ulp": 0, "max_scaled_ulp": 0.0})
    old["max_ulp"] = max(old["max_ulp"], int(raw))
    old["max_scaled_ulp"] = max(old["max_scaled_ulp"], float(scaled))


def _require_dtype(dtype) -> None:
    if np.dtype(dtype) == BF16 and compute_capability() < (8, 0):
        pytest.skip(f"bfloat16 kernels need compute capability 8.0+; device has {compute_capability()}")


def _run(model, feeds, path, lib, monkeypatch, *, fast_must_run=False, **cuda_options):
    """Runs model on CUDA with the path pinned; skips "fast" where it does not support the call."""
    session = cuda_session(model, lib, path, monkeypatch, **cuda_options)
    try:
        return run_bound(session, feeds, device="cuda")
    except Exception as e:  # onnxruntime raises its own exception types
        if path == "fast" and FAST_UNSUPPORTED in str(e) and not fast_must_run:
            pytest.skip(f"fast path does not support this call: {e}")
        raise


def _check(got, ref, dtype, what, key, rows=None):
    """streams_out bitwise, pre_output/post_gate within BOUND[dtype] scaled ulps; rows selects the
    rows of got that ref holds."""
    dtype = np.dtype(dtype)
    for name in OUTPUT_NAMES:
        if name not in got or name not in ref:
            continue
        actual = got[name] if rows is None else got[name][rows]
        expected = ref[name]
        if name == "streams_out":
            assert_bitwise_equal(actual, expected, f"{what} {name}")
            continue
        scaled = scaled_ulp(expected, actual)
        worst = float(scaled.max()) if scaled.size else 0.0
        raw = max_ulp(actual, expected)
        _record(f"{key} {name}", raw, worst)
        assert worst <= BOUND[dtype], (
            f"{what} {name}: {worst:.3g} scaled ulps > bound {BOUND[dtype]} (plain max {raw} ulp) at "
            f"{np.unravel_index(np.argmax(scaled), scaled.shape)}; shape {actual.shape}, dtype {dtype}")


def _reference(feeds, weights, C, **attrs):
    pre, gate, s = hc_lowrank_mix(**weights, **feeds, num_branches=C, **attrs)
    return {"pre_output": pre, "post_gate": gate, "streams_out": s}


# ---- the real shape (C=4, H=2560, R=320), Qwen attributes, weights as graph inputs

REAL_ROWS = [1, 2, 4, 16, 128, 1000]
_MAX_REFERENCE_ROWS = 128  # beyond this the reference runs on a spread of rows (it is row independent)


@functools.lru_cache(maxsize=None)
def _real_case(dtype_name: str, rows: int, prologue: bool):
    dtype = np.dtype(dtype_name)
    rng = np.random.default_rng([rows, int(prologue), DTYPES.index(dtype)])
    weights = random_weights(**QWEN, dtype=dtype, rng=rng)
    feeds = random_activations((rows,), QWEN["C"], QWEN["H"], dtype, rng, prologue=prologue)
    model = make_fused_node_model(**QWEN, dtype=dtype, prologue=prologue, streams_out=True, **QWEN_ATTRS)
    sample = np.arange(rows) if rows <= _MAX_REFERENCE_ROWS else np.unique(np.linspace(0, rows - 1, 64).astype(int))
    ref = _reference({k: v[sample] for k, v in feeds.items()}, weights, QWEN["C"], **QWEN_ATTRS)
    return model, {**feeds, **weights}, ref, sample


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("prologue", [False, True], ids=["plain", "prologue"])
@pytest.mark.parametrize("rows", REAL_ROWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_real_shape_matches_reference(hcfuse_lib, monkeypatch, dtype, rows, prologue, path):
    _require_dtype(dtype)
    model, feeds, ref, sample = _real_case(dtype.name, rows, prologue)
    got = _run(model, feeds, path, hcfuse_lib, monkeypatch, fast_must_run=dtype.itemsize == 2)
    _check(got, ref, dtype, f"real shape rows={rows} prologue={prologue} path={path}",
           f"real-shape {dtype.name} {path}", rows=sample)


# ---- small and irregular shapes, 2-D leading dims, with and without prologue / streams_out

SMALL_SHAPES = [(1, 64, 8), (2, 33, 16), (3, 100, 24), (4, 129, 512), (8, 40, 64), (4, 7, 8), (4, 256, 320)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("full", [False, True], ids=["plain", "prologue+streams_out"])
@pytest.mark.parametrize("C,H,R", SMALL_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_small_shapes_match_reference(hcfuse_lib, monkeypatch, rng, dtype, C, H, R, full, path):
    _require_dtype(dtype)
    weights = random_weights(C, H, R, dtype, rng)
    feeds = random_activations((2, 3), C, H, dtype, rng, prologue=full)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, leading_dims=("a", "b"), prologue=full,
                                  streams_out=full)
    got = _run(model, {**feeds, **weights}, path, hcfuse_lib, monkeypatch)
    assert got["pre_output"].shape == (2, 3, H) and got["post_gate"].shape == (2, 3, C)
    _check(got, _reference(feeds, weights, C), dtype, f"C={C} H={H} R={R} full={full} path={path}",
           f"small {dtype.name} {path}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_non_default_attributes(hcfuse_lib, monkeypatch, rng, dtype, path):
    _require_dtype(dtype)
    attrs = dict(epsilon=1e-3, reduction_scale=0.5, silu_alpha=1.5, gate_div=3.0, gate_mul=0.75)
    C, H, R = 4, 256, 64
    weights = random_weights(C, H, R, dtype, rng)
    feeds = random_activations((5,), C, H, dtype, rng, prologue=True)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True, **attrs)
    got = _run(model, {**feeds, **weights}, path, hcfuse_lib, monkeypatch)
    _check(got, _reference(feeds, weights, C, **attrs), dtype, f"attributes {attrs} path={path}",
           f"attributes {dtype.name} {path}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [0, 3])
def test_zero_and_empty_leading_dims(hcfuse_lib, monkeypatch, rng, rows, path):
    """Zero rows (here (2, 0) leading dims) gives empty outputs of the right shapes, nothing launched."""
    C, H, R = QWEN["C"], 64, 16
    weights = random_weights(C, H, R, np.float16, rng)
    feeds = random_activations((rows, 0), C, H, np.float16, rng, prologue=True)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float16, leading_dims=("a", "b"), prologue=True,
                                  streams_out=True)
    got = _run(model, {**feeds, **weights}, path, hcfuse_lib, monkeypatch, fast_must_run=True)
    assert {k: v.shape for k, v in got.items()} == {
        "pre_output": (rows, 0, H), "post_gate": (rows, 0, C), "streams_out": (rows, 0, C * H)}


# ---- post_gate's rounding points: the stock Div, Sigmoid and Mul's

# the real shape in the few-row and the mid row range (both paths), and a shape only the general path runs
POST_GATE_CASES = [((4, 2560, 320), 16), ((4, 2560, 320), 300), ((3, 40, 8), 1000)]
# fp32 ulps a sigmoid may be off on the device (CUDA's expf: up to 2, carried through 1 + e and 1 / d)
SIGMOID_FP32_ULPS = 4


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("attrs", POST_GATE_ATTRS, ids=POST_GATE_IDS)
@pytest.mark.parametrize("shape, rows", POST_GATE_CASES, ids=["real-16-rows", "real-300-rows", "C3-1000-rows"])
@pytest.mark.parametrize("dtype", DTYPES[1:], ids=DTYPE_IDS[1:])
def test_post_gate_rounds_at_the_stock_points(hcfuse_lib, monkeypatch, dtype, shape, rows, attrs, path):
    """The gate logit, its sigmoid and post_gate are each rounded to T, as the stock Div, Sigmoid and Mul
    round (onnxruntime's schema of the op states the same), at gate_div and gate_mul that are not powers
    of two: the reference's post_gate bit for bit. The inputs make inject exact in any order of its sum
    (order_free_inject_case), so no accumulation order excuses a difference; only a sigmoid within
    SIGMOID_FP32_ULPS of a rounding boundary of T may round the other way."""
    _require_dtype(dtype)
    C, H, R = shape
    attrs = {**attrs, "epsilon": 0.0}
    feeds = order_free_inject_case(C, H, R, dtype, rows, np.random.default_rng([rows, C, dtype.itemsize]))
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, **attrs)
    got = _run(model, feeds, path, hcfuse_lib, monkeypatch, fast_must_run={"C": C, "H": H, "R": R} == QWEN)
    steps = hc_lowrank_mix_steps(**feeds, num_branches=C, **attrs)
    assert_post_gate_at_stock_points(got["post_gate"], steps, attrs, f"post_gate {attrs} rows={rows} path={path}",
                                     sigmoid_fp32_ulps=SIGMOID_FP32_ULPS)


# ---- chains, row independence, determinism, CUDA graphs


def _reference_chain(streams, weight_sets, num_blocks, C, **attrs):
    s, extra = streams, {}
    for k in range(num_blocks):
        pre, gate, s = hc_lowrank_mix(s, **weight_sets[k % len(weight_sets)], **extra, num_branches=C, **attrs)
        extra = {"prev_block_output": pre, "prev_post_gate": gate}
    return {"pre_output": pre, "post_gate": gate, "streams_out": s}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_two_chained_blocks(hcfuse_lib, monkeypatch, rng, dtype, path):
    """Block 1 takes block 0's streams_out, pre_output and post_gate (weights constant initializers).
    Bound: block 1 sees inputs already within the bound, so pre_output/post_gate get 4x the bound and
    streams_out (S of block 1 = block 0's S + gate * pre) the same 4x instead of bit equality."""
    _require_dtype(dtype)
    weight_sets = [random_weights(**QWEN, dtype=dtype, rng=rng) for _ in range(2)]
    streams = random_activations((4,), QWEN["C"], QWEN["H"], dtype, rng)["streams"]
    model = fused_chain_model(weight_sets, 2, C=QWEN["C"], H=QWEN["H"], dtype=dtype, **QWEN_ATTRS)
    got = _run(model, {"streams": streams}, path, hcfuse_lib, monkeypatch, fast_must_run=dtype.itemsize == 2)
    ref = _reference_chain(streams, weight_sets, 2, QWEN["C"], **QWEN_ATTRS)
    for name in OUTPUT_NAMES:
        scaled = scaled_ulp(ref[name], got[name])
        _record(f"two-blocks {dtype.name} {path} {name}", max_ulp(got[name], ref[name]), scaled.max())
        assert scaled.max() <= 4 * BOUND[dtype], f"two blocks {name} path={path}: {scaled.max():.3g} scaled ulps"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_row_independence_and_determinism(hcfuse_lib, monkeypatch, dtype, path):
    """A row gives the same bits alone and inside batches of 16, 128 and 1000 rows (the general path's
    GEMMs see M = 1 ... 1000, above and below the M their algorithm was planned for), and two runs of
    one session as well as a second session give the same bits. The general path's row ranges
    (kernels/src/cuda/general/hc_general.cu: few-row 1-255, mid 256-1023 rows) each keep a row's bits for
    every row count they serve: batches of 1 ... 255 rows are compared with 255 rows, 256 ... 1000
    with 1000; the fast path is one range (every pair against 1000 rows)."""
    _require_dtype(dtype)
    if path == "fast" and dtype.itemsize != 2:
        pytest.skip("the fast path runs float16 and bfloat16 only")
    model, feeds, _, _ = _real_case(dtype.name, 1000, True)
    session = cuda_session(model, hcfuse_lib, path, monkeypatch)
    weights = {k: v for k, v in feeds.items() if k.endswith(("_weight", "_scale"))}
    acts = {k: v for k, v in feeds.items() if k not in weights}

    def run(lo, hi, s=session):
        return run_bound(s, {**{k: v[lo:hi] for k, v in acts.items()}, **weights}, device="cuda")

    full = run(0, 1000)
    for name, value in run(0, 1000).items():
        assert_bitwise_equal(value, full[name], f"determinism (same session) {name}")
    second = cuda_session(model, hcfuse_lib, path, monkeypatch)
    for name, value in run(0, 1000, second).items():
        assert_bitwise_equal(value, full[name], f"determinism (second session) {name}")
    pairs = [(0, 1), (0, 16), (0, 128), (77, 78), (500, 628), (999, 1000)]
    if path == "general":  # the few-row range against its own 255-row batch, the mid range against 1000
        few = run(0, 255)
        for lo, hi in [(0, 1), (0, 16), (0, 128), (77, 78), (127, 255), (254, 255)]:
            for name, value in run(lo, hi).items():
                assert_bitwise_equal(value, few[name][lo:hi], f"rows [{lo}, {hi}) alone vs in 255: {name}")
        pairs = [(0, 256), (744, 1000), (3, 1000), (500, 900)]
    for lo, hi in pairs:
        part = run(lo, hi)
        for name, value in part.items():
            assert_bitwise_equal(value, full[name][lo:hi], f"rows [{lo}, {hi}) alone vs in 1000: {name}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cuda_graph_replay_equals_eager(hcfuse_lib, monkeypatch, rng, dtype, path):
    """Three chained blocks under enable_cuda_graph with IO binding: replays (also after new input
    data is copied into the bound buffers) give the bits eager execution gives."""
    _require_dtype(dtype)
    if path == "fast" and dtype.itemsize != 2:
        pytest.skip("the fast path runs float16 and bfloat16 only")
    C, H, rows = QWEN["C"], QWEN["H"], 4
    weight_sets = [random_weights(**QWEN, dtype=dtype, rng=rng) for _ in range(2)]
    model = fused_chain_model(weight_sets, 3, C=C, H=H, dtype=dtype, **QWEN_ATTRS)
    inputs = [random_activations((rows,), C, H, dtype, rng)["streams"] for _ in range(2)]
    eager_session = cuda_session(model, hcfuse_lib, path, monkeypatch)
    eager = [run_bound(eager_session, {"streams": x}, device="cuda") for x in inputs]

    graphed = cuda_session(model, hcfuse_lib, path, monkeypatch, enable_cuda_graph="1")
    binding = graphed.io_binding()
    streams_value = to_ort_value(inputs[0], "cuda")
    binding.bind_ortvalue_input("streams", streams_value)
    elem = {np.dtype(np.float32): 1, np.dtype(np.float16): 10, BF16: 16}[dtype]
    outs = {n: ort.OrtValue.ortvalue_from_shape_and_type([rows, w], elem, "cuda", 0)
            for n, w in zip(OUTPUT_NAMES, (H, C, C * H))}
    for name, value in outs.items():
        binding.bind_ortvalue_output(name, value)
    for i, x in enumerate(inputs):
        streams_value.update_inplace(x.view(np.uint16) if dtype == BF16 else x)
        for _ in range(3):  # the first runs warm up and capture; the rest replay
            graphed.run_with_iobinding(binding)
        for name, value in outs.items():
            assert_bitwise_equal(device_to_host(value, dtype), eager[i][name], f"input {i}: graph replay vs eager {name}")


# ---- against ONNX Runtime's stock unfused chain on CUDA


def _stock_sigmoid_bf16(x: np.ndarray) -> np.ndarray:
    """ORT 1.31's CUDA Sigmoid on bfloat16 (OP_Sigmoid): x > 0 ? 1 / (1 + exp(-|x|)) : 1 - 1 / (1 + exp(-|x|)),
    every elementary operation rounded to bfloat16."""
    r = lambda v: np.asarray(v, np.float32).astype(BF16).astype(np.float32)  # noqa: E731
    x = np.asarray(x, np.float32)
    q = r(np.float32(1) / r(np.float32(1) + r(np.exp(-np.abs(x).astype(np.float64)).astype(np.float32))))
    return np.where(x > 0, q, r(np.float32(1) - q))


def _stock_model_reference(feeds, weights, C, stock_silu: bool, **attrs):
    """The contract with ORT's bfloat16 Sigmoid at the Sigmoid nodes of the stock chain (g and the gate),
    the Div and Mul of the gate rounded; with stock_silu also inside ScaledSiLU (SG)."""
    import hcfuse.reference as reference

    original = reference.sigmoid_f32
    if stock_silu:
        reference.sigmoid_f32 = _stock_sigmoid_bf16
    try:
        steps = hc_lowrank_mix_steps(**weights, **feeds, num_branches=C, **attrs)
    finally:
        reference.sigmoid_f32 = original
    f32 = lambda a: np.asarray(a).astype(np.float32)  # noqa: E731
    r = lambda v: np.asarray(v, np.float32).astype(BF16)  # noqa: E731
    hn = f32(steps["hn"]).reshape(*steps["hn"].shape[:-1], C, -1)
    g = f32(r(_stock_sigmoid_bf16(f32(steps["up"])))).reshape(hn.shape)
    mix = np.zeros(hn.shape[:-2] + hn.shape[-1:], np.float32)
    for c in range(C):
        mix += hn[..., c, :] * g[..., c, :]
    pre = r(np.float32(attrs["reduction_scale"]) * mix)
    gate = f32(r(f32(steps["inject"]) / np.float32(attrs["gate_div"])))
    gate = r(f32(r(_stock_sigmoid_bf16(gate))) * np.float32(attrs["gate_mul"]))
    return {"pre_output": pre, "post_gate": gate, "streams_out": steps["S"]}


def test_one_block_bf16_differs_from_stock_only_at_sigmoid_sites(hcfuse_lib, monkeypatch, rng):
    """One real-shape bfloat16 block: the stock chain on CUDA matches the contract once ORT's bfloat16
    Sigmoid is put in (within the GEMM-order bound), so every difference between the stock chain and
    the fused op comes from the stock Sigmoid; the fused op matches the contract on both paths."""
    _require_dtype(BF16)
    weights = random_weights(**QWEN, dtype=BF16, rng=rng)
    feeds = random_activations((8,), QWEN["C"], QWEN["H"], BF16, rng, prologue=True)
    fused = make_fused_node_model(**QWEN, dtype=BF16, prologue=True, streams_out=True, weights_as_inputs=False,
                                  weights=weights, **QWEN_ATTRS)
    stock = cuda_session(hcfuse.unfuse(fused), hcfuse_lib, None, monkeypatch)
    got_stock = run_bound(stock, feeds, device="cuda")
    contract = _reference(feeds, weights, QWEN["C"], **QWEN_ATTRS)
    for path in PATHS:
        _check(_run(fused, feeds, path, hcfuse_lib, monkeypatch, fast_must_run=True), contract, BF16,
               f"fused {path} vs contract", f"one-block bf16 {path}")
    misses = {}
    for stock_silu in (False, True):
        model = _stock_model_reference(feeds, weights, QWEN["C"], stock_silu, **QWEN_ATTRS)
        misses[stock_silu] = max(float(scaled_ulp(model[n], got_stock[n]).max()) for n in ("pre_output", "post_gate"))
    differ = float(np.mean(got_stock["pre_output"].view(np.uint16) != contract["pre_output"].view(np.uint16)))
    _STATS["one-block bf16 stock chain"] = {
        "pre_output cells differing from the contract": round(differ, 4),
        "max scaled ulp vs contract with ORT's bf16 Sigmoid at g and gate": misses[False],
        "same, also at SG inside ScaledSiLU": misses[True]}
    assert min(misses.values()) <= BOUND[BF16], (
        f"the stock chain differs from the contract beyond its Sigmoid sites: {misses} scaled ulps")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_chain_vs_stock_chain(hcfuse_lib, monkeypatch, dtype, path):
    """A 96-block fused model (8 weight sets cycling, constant weights) against hcfuse.unfuse of it, the
    stock contrib-op chain, both on CUDA. Reports the ulp distribution of the last block's outputs and
    bounds the drift relative to the outputs' rms: 1e-3 (float32), 5% (float16), 25% (bfloat16, whose
    stock Sigmoid moves about half the cells of every block by an ulp; see the one-block test)."""
    _require_dtype(dtype)
    if path == "fast" and dtype.itemsize != 2:
        pytest.skip("the fast path runs float16 and bfloat16 only")
    rng = np.random.default_rng(96)
    weight_sets = [random_weights(**QWEN, dtype=dtype, rng=rng) for _ in range(8)]
    fused = fused_chain_model(weight_sets, 96, C=QWEN["C"], H=QWEN["H"], dtype=dtype, **QWEN_ATTRS)
    streams = random_activations((2,), QWEN["C"], QWEN["H"], dtype, rng)["streams"]
    got = run_bound(cuda_session(fused, hcfuse_lib, path, monkeypatch), {"streams": streams}, device="cuda")
    stock = run_bound(cuda_session(hcfuse.unfuse(fused), hcfuse_lib, None, monkeypatch), {"streams": streams},
                      device="cuda")
    tolerance = {np.dtype(np.float32): 1e-3, np.dtype(np.float16): 0.05, BF16: 0.25}[dtype]
    for name in OUTPUT_NAMES:
        d = ulp_distance(got[name], stock[name]).ravel()
        diff = np.abs(got[name].astype(np.float32) - stock[name].astype(np.float32))
        rms = np.sqrt(np.mean(np.square(stock[name].astype(np.float64))))
        _STATS[f"96-blocks-vs-stock {dtype.name} {path} {name}"] = {
            "equal": round(float(np.mean(d == 0)), 4),
            "ulp p50/p90/p99/max": np.percentile(d, [50, 90, 99, 100]).astype(int).tolist(),
            "max |diff| / rms": round(float(diff.max() / rms), 5)}
        assert diff.max() <= tolerance * rms, f"96 blocks {name}: max |fused - stock| {diff.max():.3g} > {tolerance} * rms {rms:.3g}"


# ---- the glue's contracts: path override, debug output, validation


def test_forced_fast_path_on_float32_is_a_clear_error(hcfuse_lib, monkeypatch, rng):
    model, feeds, _, _ = _real_case("float32", 1, False)
    session = cuda_session(model, hcfuse_lib, "fast", monkeypatch)
    with pytest.raises(Exception, match="HCFUSE_FORCE_PATH=fast, but the fast path cannot run this call: the fast "
                                        "path runs float16 and bfloat16 only"):
        run_bound(session, feeds, device="cuda")


def test_bad_force_path_value_fails_session_creation(hcfuse_lib, monkeypatch):
    model = make_fused_node_model(C=2, H=8, R=4, dtype=np.float32)
    with pytest.raises(Exception, match="HCFUSE_FORCE_PATH must be 'general' or 'fast' \\(or unset\\); got 'fastest'"):
        cuda_session(model, hcfuse_lib, "fastest", monkeypatch)


@pytest.mark.parametrize("rows,expected", [(1, "fast path"), (1000, "general path")])
def test_automatic_choice_and_debug_output(hcfuse_lib, monkeypatch, capfd, rows, expected):
    """HCFUSE_DEBUG=1 prints the chosen path and its grids; decode rows take the fast path, 1000 the general."""
    _require_dtype(BF16)
    model, feeds, _, _ = _real_case(BF16.name, rows, True)
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    session = cuda_session(model, hcfuse_lib, None, monkeypatch)
    run_bound(session, feeds, device="cuda")
    err = capfd.readouterr().err
    assert f"bfloat16 rows={rows} C=4 H=2560 R=320" in err and expected in err, err
    assert "grid" in err or "CTAs" in err, err


def test_validation_error_names_the_input(hcfuse_lib, monkeypatch, rng):
    C, H, R = 4, 16, 8
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32, leading_dims=("rows",), prologue=True)
    for value in model.graph.input:  # leave the shape check to the kernel, not to ORT's input check
        value.type.tensor_type.ClearField("shape")
    feeds = {**random_weights(C, H, R, np.float32, rng), **random_activations((3,), C, H, np.float32, rng, prologue=True)}
    feeds["prev_post_gate"] = feeds["prev_post_gate"][:, :2]
    session = cuda_session(model, hcfuse_lib, None, monkeypatch)
    with pytest.raises(Exception, match=r"prev_post_gate must be \(\.\.\., C\) = \(3, 4\)"):
        run_bound(session, feeds, device="cuda")
