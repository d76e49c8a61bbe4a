"""The general CUDA path of ai.hcfuse::HyperConnectionLowRankMixNBits (kernels/src/cuda/nbits/) inside
onnxruntime CUDA sessions against hcfuse.reference_nbits. Every session here sets HCFUSE_FORCE_PATH=general (the
decode-sized 4-bit calls the glue would give the fast path's quantized kernels: test_nbits_fast_cuda.py). The
path has two routes: the CUDA-core kernels (hc_nbits.cu) below 64 rows and for the forms the GEMM route refuses,
and from 64 rows the GEMM route (hc_nbits_gemm.cu: the weights dequantized into per-call scratch as T terms whose
sum is exact, the products on cuBLASLt). Cases with at least 64 rows check which route ran (HCFUSE_DEBUG's line).

Every session here is made with session.disable_cpu_ep_fallback, so it cannot be built unless the node runs
on the CUDA provider (test_the_node_runs_on_cuda shows that the setting refuses a node left to the CPU).
Each case asserts streams_out bit for bit (S) and pre_output and post_gate element by element within
hcfuse.checking.bounds.output_bounds("cuda-general", ...): the kernel keeps every rounding point and the
dequantized fp32 weight of the reference and differs from it only in the order of its sums (the norm's sum
of squares thread-strided with a butterfly, the products' K in fixed slices of 128 added in order), the
orders the general path's bound models (docs/QUANTIZED.md, "CUDA kernel"). The bound is evaluated on the
reference's steps with the projections' dequantized weights. Inputs are the CPU kernel's tests'
(tests/kernels/test_nbits_cpu.py: random bytes for B, padding nibbles included, random scales and zero points
in every form) and onnxruntime's own quantizer's output at the real shape.
"""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hcfuse import _op_nbits
from hcfuse._op import IR_VERSION, ONNX_OPSET, QWEN_ATTRIBUTES, QWEN_SHAPE
from hcfuse.checking import bounds
from hcfuse.checking._session import CUDA, inference_session
from hcfuse.models.hc_block import random_activations
from hcfuse.models.nbits import make_nbits_node_model, random_nbits_weights
from hcfuse.reference_nbits import hc_lowrank_mix_nbits_steps, projection_f32
from tests._compare import BFLOAT16, assert_bitwise_equal, assert_within_bounds, run_bound, to_ort_value
from tests._cuda import compute_capability, device_to_host
from tests.kernels.test_kernels_cuda import _require_dtype
from tests.kernels.test_nbits_cpu import (
    ACTIVATIONS,
    DTYPE_IDS,
    DTYPES,
    ODD_ATTRS,
    QUANTIZED,
    ZP_FORMS,
    good_feeds,
    nbits_model,
    random_nbits_inputs,
)

pytestmark = pytest.mark.cuda


NO_CPU_FALLBACK = {"session.disable_cpu_ep_fallback": "1"}


@pytest.fixture(autouse=True)
def general_path(monkeypatch):
    """Sessions of this module run the general kernels (read when a session's kernel is made)."""
    monkeypatch.setenv("HCFUSE_FORCE_PATH", "general")
QWEN = QWEN_SHAPE
SLICE_K = 128  # kHcNBitsSliceK
CHUNK_ROWS = 256  # kHcNBitsChunkRows
GEMM_MIN_ROWS = 64  # kHcNBitsGemmMinRows
GEMM_ROUTE = "general path: GEMM route"
CUDA_CORE_ROUTE = "general path: CUDA-core kernels"
_SAMPLE = 40  # reference rows of a long case (the reference and the kernel are row independent)


def cuda_nbits_session(model, lib, **cuda_options) -> ort.InferenceSession:
    """A CUDA session of model with hcfuse's library that cannot leave a node to the CPU provider."""
    return inference_session(model, [(CUDA, cuda_options)], library=lib, config=NO_CPU_FALLBACK)


def run_cuda(lib, model, feeds, **cuda_options) -> dict[str, np.ndarray]:
    return run_bound(cuda_nbits_session(model, lib, **cuda_options), feeds, device="cuda")


def dense_weights(inputs: dict, C: int, bits: int, block_size: int) -> dict[str, np.ndarray]:
    """The dense op's down_weight, inject_weight and up_weight of the node: its projections in fp32
    (dequantized as the reference does), for hcfuse.checking.bounds."""
    given = {name: inputs.get(name) for name in _op_nbits.INPUTS}
    width = inputs["norm_scale"].shape[0]
    di = projection_f32(given, _op_nbits.DOWN_INJECT, width, bits, block_size)
    R = di.shape[1] - C
    return {"down_weight": di[:, :R], "inject_weight": di[:, R:],
            "up_weight": projection_f32(given, _op_nbits.UP, R, bits, block_size)}


def check_bounds(got: dict, inputs: dict, *, C: int, what: str, rows=None, bits: int = 4, block_size: int = 32,
                 **attrs) -> None:
    """streams_out bitwise; pre_output and post_gate within the cuda-general bound of each element. inputs:
    every input of the op; rows: the rows of got (flattened leading dims) to check, all by default."""
    flat = {k: v.reshape(-1, v.shape[-1]) for k, v in got.items()}
    acts = {k: v.reshape(-1, v.shape[-1]) for k, v in inputs.items() if k in ACTIVATIONS}
    if rows is not None:
        flat = {k: v[rows] for k, v in flat.items()}
        acts = {k: v[rows] for k, v in acts.items()}
    if flat["pre_output"].shape[0] == 0:
        return
    sub = {**inputs, **acts}
    steps = hc_lowrank_mix_nbits_steps(**sub, num_branches=C, bits=bits, block_size=block_size, **attrs)
    if "streams_out" in flat:
        assert_bitwise_equal(flat["streams_out"], steps["S"], f"{what}: streams_out")
    limit = bounds.output_bounds("cuda-general", {**sub, **dense_weights(sub, C, bits, block_size)}, steps,
                                 num_branches=C, **attrs)
    assert_within_bounds(steps, flat, limit, what)


def check_case(lib, feeds, *, C, dtype, streams_out=True, initializers=(), what="", **attrs) -> dict:
    """Runs one node over feeds (weights as graph inputs unless named in initializers) and checks it."""
    model = nbits_model(feeds, C=C, dtype=dtype, streams_out=streams_out, initializers=initializers, **attrs)
    got = run_cuda(lib, model, {k: v for k, v in feeds.items() if k not in initializers})
    assert list(got) == list(_op_nbits.OUTPUTS[: 3 if streams_out else 2]), f"{what}: outputs {list(got)}"
    check_bounds(got, feeds, C=C, what=what, **attrs)
    return got


def gemm_refusal(dtype, zp: str, quantized=("down_inject", "up"), constant: bool = True) -> str | None:
    """Why the GEMM route refuses a call of at least 64 rows (the glue's debug line), None where it runs it."""
    if np.dtype(dtype).itemsize == 2 and zp == "T" and quantized:
        return "zero points of T"
    if np.dtype(dtype) == np.float16 and quantized and not constant:
        return "float16 weights not known to lie in float16's range"
    return None


def assert_route(err: str, refusal: str | None, what: str) -> None:
    """err (stderr under HCFUSE_DEBUG=1) says the call took the GEMM route, or the CUDA-core kernels for refusal."""
    if refusal is None:
        assert GEMM_ROUTE in err and "HyperConnectionLowRankMixNBits GEMM route" in err, f"{what}: {err}"
    else:
        assert f"{CUDA_CORE_ROUTE} (GEMM route: {refusal}" in err, f"{what}: {err}"


# ---- every form -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", ZP_FORMS)
@pytest.mark.parametrize("quantized", list(QUANTIZED), ids=list(QUANTIZED))
def test_forms(hcfuse_lib, rng, dtype, bits, zp, quantized):
    """Every activation type, bits, zero-point form and choice of quantized projections. K = C*H = 39 is two
    full blocks of 16 and a partial one (one short slice); up's K = R = 7 one partial block; N = R + C = 10
    and C*H = 39 columns leave most of a column group idle."""
    _require_dtype(dtype)
    C, H, R = 3, 13, 7
    feeds = random_nbits_inputs(C, H, R, dtype, rng, quantized=QUANTIZED[quantized], bits=bits, block_size=16,
                                zp=zp, lead=(5,), prologue=True)
    check_case(hcfuse_lib, feeds, C=C, dtype=dtype, bits=bits, block_size=16, what=f"{bits} bits, zp {zp}, "
               f"{quantized} quantized", **ODD_ATTRS)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256, 1024])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", ["none", "packed"])
def test_block_sizes(hcfuse_lib, rng, dtype, block_size, bits, zp):
    """Blocks smaller than a slice of 128 (several a slice), as large (one) and larger (several slices a
    block, one past K): down's K = 2*300 = 600 (4.7 slices), up's K = R = 140 (1.1 slices)."""
    _require_dtype(dtype)
    C, H, R = 2, 300, 140
    feeds = random_nbits_inputs(C, H, R, dtype, rng, bits=bits, block_size=block_size, zp=zp, lead=(4,))
    check_case(hcfuse_lib, feeds, C=C, dtype=dtype, bits=bits, block_size=block_size,
               what=f"{bits} bits, block_size {block_size}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", ZP_FORMS)
@pytest.mark.parametrize("quantized", list(QUANTIZED), ids=list(QUANTIZED))
def test_gemm_route_forms(hcfuse_lib, monkeypatch, capfd, rng, dtype, bits, zp, quantized):
    """test_forms' shape at 64 rows with constant weights: the GEMM route for every form it takes (a dequantized
    down_inject's N = R + C = 10 padded to 16 columns, K = 39 ending inside a block of 16 and a chunk of 32; a
    dense projection used in place), the CUDA-core kernels, with the reason, for zero points of T in 16-bit T."""
    _require_dtype(dtype)
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    C, H, R = 3, 13, 7
    feeds = random_nbits_inputs(C, H, R, dtype, rng, quantized=QUANTIZED[quantized], bits=bits, block_size=16,
                                zp=zp, lead=(GEMM_MIN_ROWS,), prologue=True)
    weights = [n for n in feeds if n not in ACTIVATIONS]
    what = f"{bits} bits, zp {zp}, {quantized} quantized, {GEMM_MIN_ROWS} rows"
    check_case(hcfuse_lib, feeds, C=C, dtype=dtype, initializers=weights, bits=bits, block_size=16, what=what,
               **ODD_ATTRS)
    assert_route(capfd.readouterr().err, gemm_refusal(dtype, zp, QUANTIZED[quantized]), what)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256, 1024])
@pytest.mark.parametrize("bits", [4, 8])
def test_gemm_route_block_sizes(hcfuse_lib, monkeypatch, capfd, rng, dtype, block_size, bits):
    """test_block_sizes' shape (down's K = 600 and up's K = 140 end inside a block at every block size) at 100
    rows, packed zero points, on the GEMM route."""
    _require_dtype(dtype)
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    C, H, R = 2, 300, 140
    feeds = random_nbits_inputs(C, H, R, dtype, rng, bits=bits, block_size=block_size, zp="packed", lead=(100,))
    weights = [n for n in feeds if n not in ACTIVATIONS]
    what = f"{bits} bits, block_size {block_size}, 100 rows"
    check_case(hcfuse_lib, feeds, C=C, dtype=dtype, initializers=weights, bits=bits, block_size=block_size,
               what=what)
    assert_route(capfd.readouterr().err, None, what)


def test_float16_weights_the_gemm_route_cannot_hold(hcfuse_lib, monkeypatch, capfd, rng):
    """float16 terms hold a weight only within float16's range: a constant scale with |scale| * (2^bits - 1) >
    65504, and scales given as graph inputs (never read on the host), leave the call to the CUDA-core kernels,
    which take it within the bound."""
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    C, H, R = 2, 64, 8
    feeds = random_nbits_inputs(C, H, R, np.float16, rng, lead=(GEMM_MIN_ROWS,))
    feeds["up_scales"] = feeds["up_scales"].copy()
    feeds["up_scales"][0, 0] = 5000.0  # 15 * 5000 > 65504 ...
    feeds["up_weight"] = feeds["up_weight"].copy()
    feeds["up_weight"][0, 0, :] = 0x88  # ... over a block of q = 8 (weights 0, no sum overflows)
    weights = [n for n in feeds if n not in ACTIVATIONS]
    for initializers, what in ((weights, "a constant scale of 5000"), ((), "scales as graph inputs")):
        check_case(hcfuse_lib, feeds, C=C, dtype=np.float16, initializers=initializers, what=what)
        assert_route(capfd.readouterr().err, "float16 weights not known to lie in float16's range", what)


# leading dims: 0 rows (no kernel launched), one row without leading dims, 1, 3, 16, 17 rows (row tiles of 1, 2,
# 4 and 8 rows and a short last tile), 300 rows (two chunks of the products: 256 + 44) as 2-D leading dims
LEADS = [(0,), (2, 0), (), (1,), (3,), (16,), (17,), (3, 100)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("prologue", [False, True], ids=["plain", "prologue"])
@pytest.mark.parametrize("streams_out", [False, True], ids=["2-out", "3-out"])
@pytest.mark.parametrize("lead", LEADS, ids=["0", "2x0", "no-lead", "1", "3", "16", "17", "3x100"])
def test_prologue_outputs_and_rows(hcfuse_lib, rng, dtype, prologue, streams_out, lead):
    _require_dtype(dtype)
    C, H, R = 4, 96, 24
    feeds = random_nbits_inputs(C, H, R, dtype, rng, zp="T", lead=lead, prologue=prologue)
    got = check_case(hcfuse_lib, feeds, C=C, dtype=dtype, streams_out=streams_out, what=f"lead {lead}",
                     **QWEN_ATTRIBUTES)
    assert got["pre_output"].shape == (*lead, H) and got["post_gate"].shape == (*lead, C)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("C,H,R", [(1, 200, 3), (5, 37, 130), (2, 64, 300), (9, 16, 8), (3, 40, 600), (130, 2, 3)])
def test_odd_shapes(hcfuse_lib, rng, dtype, C, H, R):
    """C = 1, C > 8, H not a multiple of anything, R past one and two slices of 128 and past one staging of
    hidden (512), N past one column group; C = 130, past the branches one block of the fused up kernel holds
    (128): the sliced up product and its separate epilogue."""
    _require_dtype(dtype)
    feeds = random_nbits_inputs(C, H, R, dtype, rng, zp="packed", lead=(7,), prologue=True)
    check_case(hcfuse_lib, feeds, C=C, dtype=dtype, what=f"C={C} H={H} R={R}", **ODD_ATTRS)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("quantized", ["up", "both"])
def test_weights_as_initializers(hcfuse_lib, rng, dtype, quantized):
    """Constant weights (which a product may read before the kernel before it ends, on sm_90) give the bits
    the same weights give as graph inputs."""
    _require_dtype(dtype)
    C, H, R = 4, 200, 12
    feeds = random_nbits_inputs(C, H, R, dtype, rng, quantized=QUANTIZED[quantized], bits=8, zp="packed",
                                prologue=True)
    weights = [n for n in feeds if n not in ACTIVATIONS]
    constant = check_case(hcfuse_lib, feeds, C=C, dtype=dtype, initializers=weights, bits=8, what="constant weights")
    for name, value in check_case(hcfuse_lib, feeds, C=C, dtype=dtype, bits=8, what="weights as inputs").items():
        assert_bitwise_equal(value, constant[name], f"{name}: weights as graph inputs vs constant")


# ---- the real shape, onnxruntime's quantizer ------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _real_weights(dtype_name: str, bits: int = 4, symmetric: bool = True) -> dict:
    rng = np.random.default_rng([7, bits, int(symmetric), len(dtype_name)])
    return random_nbits_weights(**QWEN, dtype=np.dtype(dtype_name), rng=rng, bits=bits, block_size=32,
                                symmetric=symmetric)


def _real_model(dtype, weights, prologue=True):
    return make_nbits_node_model(weights, C=QWEN["C"], dtype=dtype, prologue=prologue, streams_out=True,
                                 bits=4, block_size=32, **QWEN_ATTRIBUTES)


def _sample(rows: int) -> np.ndarray:
    """Every row of a short batch; of a long one both ends, the chunk and tile edges and a spread."""
    if rows <= 64:
        return np.arange(rows)
    edges = [0, 1, 7, 8, CHUNK_ROWS - 1, CHUNK_ROWS, 2 * CHUNK_ROWS, rows - 2, rows - 1]
    spread = np.linspace(0, rows - 1, _SAMPLE - len(edges)).astype(int)
    return np.unique(np.clip(np.concatenate([edges, spread]), 0, rows - 1))


@pytest.mark.parametrize("rows", [1, 3, 16, 17])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_real_shape(hcfuse_lib, dtype, rows):
    """C=4 H=2560 R=320, int4 block 32 as MatMulNBitsQuantizer writes it, Qwen attributes, the prologue."""
    _require_dtype(dtype)
    weights = _real_weights(np.dtype(dtype).name)
    acts = random_activations((rows,), QWEN["C"], QWEN["H"], dtype, np.random.default_rng(rows), prologue=True)
    got = run_cuda(hcfuse_lib, _real_model(dtype, weights), acts)
    check_bounds(got, {**weights, **acts}, C=QWEN["C"], what=f"real shape, {rows} rows", **QWEN_ATTRIBUTES)


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float32], ids=["float16", "bfloat16", "float32"])
def test_real_shape_prefill_and_row_independence(hcfuse_lib, monkeypatch, capfd, dtype):
    """4099 rows (the GEMM route's long prefill range) against the reference on a sample of rows; the range's
    other batches (4096 rows from row 0 and from row 3) give the bits they have among 4099; two runs and a second
    session give the same bits."""
    _require_dtype(dtype)
    rows = 4099
    weights = _real_weights(np.dtype(dtype).name, symmetric=False)
    acts = random_activations((rows,), QWEN["C"], QWEN["H"], dtype, np.random.default_rng(4099), prologue=True)
    model = _real_model(dtype, weights)
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    session = cuda_nbits_session(model, hcfuse_lib)

    def run(lo, hi, s=session):
        return run_bound(s, {k: v[lo:hi] for k, v in acts.items()}, device="cuda")

    full = run(0, rows)
    err = capfd.readouterr().err
    assert_route(err, None, f"real shape, {rows} rows")
    assert "GEMM route (long prefill range)" in err, err
    check_bounds(full, {**weights, **acts}, C=QWEN["C"], what=f"real shape, {rows} rows", rows=_sample(rows),
                 **QWEN_ATTRIBUTES)
    for name, value in run(0, rows).items():
        assert_bitwise_equal(value, full[name], f"determinism (same session) {name}")
    for name, value in run(0, rows, cuda_nbits_session(model, hcfuse_lib)).items():
        assert_bitwise_equal(value, full[name], f"determinism (second session) {name}")
    for lo, hi in [(0, 4096), (3, 4099)]:
        for name, value in run(lo, hi).items():
            assert_bitwise_equal(value, full[name][lo:hi], f"rows [{lo}, {hi}) alone vs in {rows}: {name}")


# ---- determinism, row independence and CUDA graphs on a small shape -------------------------------------


# The general path's row ranges, in each of which a row keeps its bits at every row count: the CUDA-core kernels
# (1-63 rows), then the GEMM route's few-row (64-255), mid (256-1023), prefill (1024-4095) and long prefill
# ranges (kernels/src/cuda/general/hc_gemm.h: each its own K split and pinned cuBLASLt plans).
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_row_independence_and_determinism(hcfuse_lib, rng, dtype):
    """Within each row range a row gives the bits it has in that range's largest batch here (63, 255 and 300
    rows: two chunks of the CUDA-core kernels' 256 are not reached below 64 rows, so 300 covers the GEMM route's
    mid range), alone or in any batch of the range; two runs give the same bits."""
    _require_dtype(dtype)
    C, H, R, rows = 4, 160, 40, 300
    feeds = random_nbits_inputs(C, H, R, dtype, rng, zp="packed", bits=8, block_size=64, lead=(rows,), prologue=True)
    weights = [n for n in feeds if n not in ACTIVATIONS]
    model = nbits_model(feeds, C=C, dtype=dtype, initializers=weights, bits=8, block_size=64)
    session = cuda_nbits_session(model, hcfuse_lib)
    acts = {k: v for k, v in feeds.items() if k in ACTIVATIONS}

    def run(lo, hi):
        return run_bound(session, {k: v[lo:hi] for k, v in acts.items()}, device="cuda")

    full = run(0, rows)
    check_bounds(full, feeds, C=C, what="300 rows", bits=8, block_size=64)
    for name, value in run(0, rows).items():
        assert_bitwise_equal(value, full[name], f"determinism {name}")
    ranges = {63: [(0, 1), (3, 5), (10, 27), (62, 63), (0, 63)],     # CUDA-core kernels
              255: [(0, 64), (100, 200), (191, 255), (0, 255)],      # GEMM route, few-row range
              rows: [(0, 256), (44, 300), (3, 299)]}                 # GEMM route, mid range
    for largest, batches in ranges.items():
        ref = full if largest == rows else run(0, largest)
        if largest != rows:
            check_bounds(ref, {**feeds, **{k: v[:largest] for k, v in acts.items()}}, C=C, what=f"{largest} rows",
                         bits=8, block_size=64)
        for lo, hi in batches:
            for name, value in run(lo, hi).items():
                assert_bitwise_equal(value, ref[name][lo:hi], f"rows [{lo}, {hi}) alone vs in {largest}: {name}")


@pytest.mark.parametrize("rows", [4, GEMM_MIN_ROWS], ids=["cuda-core", "gemm-route"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cuda_graph_replay_equals_eager(hcfuse_lib, rng, dtype, rows):
    """The real shape under enable_cuda_graph with IO binding, on both routes: replays (also after new input
    data is copied into the bound buffers) give the bits eager execution gives."""
    _require_dtype(dtype)
    dtype = np.dtype(dtype)
    C, H = QWEN["C"], QWEN["H"]
    weights = _real_weights(dtype.name)
    model = _real_model(dtype, weights)
    inputs = [random_activations((rows,), C, H, dtype, rng, prologue=True) for _ in range(2)]
    eager_session = cuda_nbits_session(model, hcfuse_lib)
    eager = [run_bound(eager_session, x, device="cuda") for x in inputs]

    graphed = cuda_nbits_session(model, hcfuse_lib, enable_cuda_graph="1")
    binding = graphed.io_binding()
    bound = {name: to_ort_value(value, "cuda") for name, value in inputs[0].items()}
    for name, value in bound.items():
        binding.bind_ortvalue_input(name, value)
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
            BFLOAT16: TensorProto.BFLOAT16}[dtype]
    outs = {n: ort.OrtValue.ortvalue_from_shape_and_type([rows, w], elem, "cuda", 0)
            for n, w in zip(_op_nbits.OUTPUTS, (H, C, C * H))}
    for name, value in outs.items():
        binding.bind_ortvalue_output(name, value)
    for i, x in enumerate(inputs):
        for name, value in bound.items():
            value.update_inplace(x[name].view(np.uint16) if dtype == BFLOAT16 else x[name])
        for _ in range(3):  # the first runs warm up and capture; the rest replay
            graphed.run_with_iobinding(binding)
        for name, value in outs.items():
            assert_bitwise_equal(device_to_host(value, dtype), eager[i][name],
                                 f"input {i}: graph replay vs eager {name}")


# ---- placement and errors -------------------------------------------------------------------------------


def test_the_node_runs_on_cuda(hcfuse_lib, rng):
    """With CPU fallback disabled a session of the node builds (its kernel is the CUDA provider's), while a
    node the CUDA provider has no kernel for (StringNormalizer) is refused: the setting every session of this
    module uses does tell where a node runs."""
    feeds = random_nbits_inputs(2, 16, 4, np.float16, rng, lead=(2,))
    cuda_nbits_session(nbits_model(feeds, C=2, dtype=np.float16), hcfuse_lib)
    node = helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="LOWER")
    graph = helper.make_graph([node], "cpu_only", [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    model = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    with pytest.raises(Exception, match=r"(?i)fallback"):
        cuda_nbits_session(model, hcfuse_lib)


def test_debug_line_says_where_the_weights_are_read(hcfuse_lib, monkeypatch, capfd, rng):
    """HCFUSE_DEBUG=1 prints the call and, on sm_90 (programmatic dependent launch), that constant quantized
    weights are read before the wait on the kernel before and graph-input ones after it; a dense projection is
    named dense."""
    feeds = random_nbits_inputs(2, 64, 8, np.float16, rng, quantized=("down_inject",), lead=(3,))
    weights = [n for n in feeds if n not in ACTIVATIONS]
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    sm90 = compute_capability()[0] == 9
    for initializers, expected in ((weights, "constant (read before the wait)"),
                                   ((), "produced upstream (read after the wait)")):
        model = nbits_model(feeds, C=2, dtype=np.float16, initializers=initializers)
        run_cuda(hcfuse_lib, model, {k: v for k, v in feeds.items() if k not in initializers})
        err = capfd.readouterr().err
        assert "HyperConnectionLowRankMixNBits float16 rows=3 C=2 H=64 R=8 bits=4 block_size=32" in err, err
        if sm90:
            assert f"PDL on; down_inject quantized, {expected}; up dense" in err, err
        else:
            assert "PDL off; down_inject quantized; up dense" in err, err


@pytest.mark.parametrize("change, message", [
    ({"up_scales": np.zeros((31, 1), np.float32)},
     r"up_scales must be \(N, ceil\(K / block_size\)\) = \(32, 1\); got \(31, 1\)"),
    ({"down_inject_zero_points": np.zeros((7, 2), np.uint8)},
     r"down_inject_zero_points must be packed uint8 .* = \(7, 1\); got \(7, 2\)"),
    ({"norm_scale": np.ones(33, np.float32)},
     r"HyperConnectionLowRankMixNBits: norm_scale must be \(C\*H,\) = \(32,\); got \(33,\)"),
    ({"up_weight": np.zeros((32, 1, 16), np.int8)},
     r"up_weight must be the type of streams \(dense\) or uint8 .*got int8"),
])
def test_bad_shapes_are_named(hcfuse_lib, rng, change, message):
    """The CUDA kernel checks a call as the CPU kernel does (one shared check) and gives its message."""
    feeds = good_feeds(rng)
    types = {k: helper.np_dtype_to_tensor_dtype(v.dtype) for k, v in change.items()}
    session = cuda_nbits_session(nbits_model(feeds, C=2, dtype=np.float32, input_types=types), hcfuse_lib)
    with pytest.raises(Exception, match=message):
        run_bound(session, {**feeds, **change}, device="cuda")
