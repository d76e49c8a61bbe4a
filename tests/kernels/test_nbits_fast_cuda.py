"""The fast path's quantized kernels (kernels/src/cuda/fast/hc_fast_quant.cuh, the QUANT kernels of
hc_fast_path.cu) running ai.hcfuse::HyperConnectionLowRankMixNBits inside onnxruntime CUDA sessions, against
hcfuse.reference_nbits.

The glue runs them by itself for float16 and bfloat16, 4 bits, both projections quantized, no zero points of T,
block_size >= 32, up to 64 rows and the shapes the planner tiles (tests/kernels/test_fast_plan.py); here every
session sets HCFUSE_FORCE_PATH=fast, so a call the fast path cannot run fails instead of silently taking the
general kernels. The bound is the one test_nbits_cuda.py asserts for the general kernels
(bounds.output_bounds("cuda-general", ...)): a weight enters the products as q - z (exact in T, so every
product is exact in fp32), each group of 32 k is summed on the tensor cores and times its block's scale in
one fmaf; against the reference that is another order of the fp32 sums and a rounding of each product moved
to the group's sum, which the bound's flip model covers (docs/QUANTIZED.md, "CUDA kernels").
"""

from __future__ import annotations

import numpy as np
import pytest

from hcfuse._op import QWEN_ATTRIBUTES
from hcfuse.models.hc_block import random_activations
from tests._compare import BFLOAT16, assert_bitwise_equal, run_bound
from tests.kernels.test_kernels_cuda import _require_dtype
from tests.kernels.test_nbits_cpu import ACTIVATIONS, ODD_ATTRS, nbits_model, random_nbits_inputs
from tests.kernels.test_nbits_cuda import (
    QWEN,
    _real_model,
    _real_weights,
    check_bounds,
    check_case,
    cuda_nbits_session,
    run_cuda,
)
from tests.kernels import test_nbits_cuda as general_tests

pytestmark = pytest.mark.cuda

DTYPES = [np.float16, BFLOAT16]
DTYPE_IDS = ["float16", "bfloat16"]


@pytest.fixture(autouse=True)
def fast_path(monkeypatch):
    """Every session of this module runs the fast path or fails (the variable is read when a session's kernel
    is made)."""
    monkeypatch.setenv("HCFUSE_FORCE_PATH", "fast")


# (C, H, R): one cluster of stage 1 CTAs (C*H / 64 = 8) with R in one and two k groups a warp half; 16 CTAs with
# sums of squares still local (2 slices a branch); the real branch count with 32 slices a branch (shared sums
# of squares, the real shape's stage 1 tiling in small); C = 8 (stage 2: 8 features a CTA)
SHAPES = [(4, 128, 32), (4, 256, 96), (4, 2048, 64), (8, 128, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("zp", ["none", "packed"])
@pytest.mark.parametrize("C,H,R", SHAPES)
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_shapes_zero_points_and_rows(hcfuse_lib, rng, dtype, zp, C, H, R, rows):
    _require_dtype(dtype)
    feeds = random_nbits_inputs(C, H, R, dtype, rng, zp=zp, lead=(rows,), prologue=True)
    check_case(hcfuse_lib, feeds, C=C, dtype=dtype, what=f"C={C} H={H} R={R} zp {zp}, {rows} rows", **ODD_ATTRS)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [32, 64, 128, 256])
def test_block_sizes(hcfuse_lib, rng, dtype, block_size):
    """Blocks of one group of 32 k and of several (a stage 1 slice of 64 inside one block from 128 on); up's
    K = R = 96 is one partial block of 128 and 256 (its padding k never read)."""
    _require_dtype(dtype)
    C, H, R = 4, 256, 96
    feeds = random_nbits_inputs(C, H, R, dtype, rng, block_size=block_size, zp="packed", lead=(3,))
    check_case(hcfuse_lib, feeds, C=C, dtype=dtype, block_size=block_size, what=f"block_size {block_size}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_odd_block_count(hcfuse_lib, rng, dtype):
    """block_size 512 at K = C * H = 1536: three blocks a column, so an odd column's scales and packed zero
    points start in the middle of the 4-byte word stage 1 copies for them."""
    _require_dtype(dtype)
    C, H, R = 4, 384, 96
    feeds = random_nbits_inputs(C, H, R, dtype, rng, block_size=512, zp="packed", lead=(3,))
    check_case(hcfuse_lib, feeds, C=C, dtype=dtype, block_size=512, what="block_size 512, 3 blocks a column")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("prologue", [False, True], ids=["plain", "prologue"])
@pytest.mark.parametrize("streams_out", [False, True], ids=["2-out", "3-out"])
def test_prologue_and_outputs(hcfuse_lib, rng, dtype, prologue, streams_out):
    _require_dtype(dtype)
    C, H, R = 4, 256, 64
    feeds = random_nbits_inputs(C, H, R, dtype, rng, lead=(2, 3), prologue=prologue)
    got = check_case(hcfuse_lib, feeds, C=C, dtype=dtype, streams_out=streams_out, what="prologue/outputs",
                     **QWEN_ATTRIBUTES)
    assert got["pre_output"].shape == (2, 3, H) and got["post_gate"].shape == (2, 3, C)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "zero-points"])
def test_real_shape(hcfuse_lib, dtype, rows, symmetric):
    """C=4 H=2560 R=320 as MatMulNBitsQuantizer writes int4 block 32 (symmetric, or with packed zero points),
    the Qwen attributes and the prologue, at every decode row count and at the 32 and 64 rows the planner
    also gives the fast path (passes of 16 rows)."""
    _require_dtype(dtype)
    weights = _real_weights(np.dtype(dtype).name, symmetric=symmetric)
    acts = random_activations((rows,), QWEN["C"], QWEN["H"], dtype, np.random.default_rng(rows), prologue=True)
    got = run_cuda(hcfuse_lib, _real_model(dtype, weights), acts)
    check_bounds(got, {**weights, **acts}, C=QWEN["C"], what=f"real shape, {rows} rows", **QWEN_ATTRIBUTES)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_row_independence_determinism_and_constant_weights(hcfuse_lib, rng, dtype):
    """Each of 40 rows (three passes of 16 rows) gives the bits it has alone and in smaller batches, two
    runs the same bits, and constant weights (read before the wait on sm_90) those of weights as graph inputs."""
    _require_dtype(dtype)
    C, H, R, rows = 4, 2048, 64, 40
    feeds = random_nbits_inputs(C, H, R, dtype, rng, zp="packed", lead=(rows,), prologue=True)
    weights = [n for n in feeds if n not in ACTIVATIONS]
    acts = {k: v for k, v in feeds.items() if k in ACTIVATIONS}
    constant = cuda_nbits_session(nbits_model(feeds, C=C, dtype=dtype, initializers=weights), hcfuse_lib)
    as_inputs = cuda_nbits_session(nbits_model(feeds, C=C, dtype=dtype), hcfuse_lib)

    def run(lo, hi, session=constant, extra=None):
        return run_bound(session, {**{k: v[lo:hi] for k, v in acts.items()}, **(extra or {})}, device="cuda")

    full = run(0, rows)
    check_bounds(full, feeds, C=C, what=f"{rows} rows")
    for name, value in run(0, rows).items():
        assert_bitwise_equal(value, full[name], f"determinism {name}")
    for name, value in run(0, rows, as_inputs, {k: feeds[k] for k in weights}).items():
        assert_bitwise_equal(value, full[name], f"weights as graph inputs vs constant: {name}")
    for lo, hi in [(0, 1), (15, 16), (16, 17), (39, 40), (3, 5), (10, 27), (0, 16), (7, 40)]:
        for name, value in run(lo, hi).items():
            assert_bitwise_equal(value, full[name][lo:hi], f"rows [{lo}, {hi}) alone vs in {rows}: {name}")


@pytest.mark.parametrize("feeds_args, reason", [
    ({"bits": 8}, "4 bits only"),
    ({"zp": "T"}, "not T"),
    ({"quantized": ("up",)}, "both projections quantized"),
    ({"block_size": 16}, "block_size >= 32"),
])
def test_forced_fast_path_names_what_it_cannot_run(hcfuse_lib, rng, feeds_args, reason):
    C, H, R = 4, 128, 32
    feeds = random_nbits_inputs(C, H, R, np.float16, rng, lead=(2,), **feeds_args)
    attrs = {k: feeds_args[k] for k in ("bits", "block_size") if k in feeds_args}
    with pytest.raises(Exception, match=f"HCFUSE_FORCE_PATH=fast, but the fast path cannot run this call: .*{reason}"):
        run_cuda(hcfuse_lib, nbits_model(feeds, C=C, dtype=np.float16, **attrs), feeds)


def test_debug_line_names_the_fast_path(hcfuse_lib, rng, monkeypatch, capfd):
    monkeypatch.setenv("HCFUSE_DEBUG", "1")
    feeds = random_nbits_inputs(4, 128, 32, np.float16, rng, lead=(3,))
    run_cuda(hcfuse_lib, nbits_model(feeds, C=4, dtype=np.float16), feeds)
    err = capfd.readouterr().err
    assert "fast path (decode-sized)" in err and "stage 1: 8 CTAs" in err, err


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cuda_graph_replay_equals_eager(hcfuse_lib, rng, dtype):
    """The general kernels' CUDA-graph test (the real shape, 4 rows) on the fast path."""
    general_tests.test_cuda_graph_replay_equals_eager(hcfuse_lib, rng, dtype, rows=4)
