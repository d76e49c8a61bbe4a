"""The CUDA general path's four row ranges (kernels/src/cuda/general/hc_general.cu, hc_gemm.h):

  few rows      rows < 256: down split into HcSplitCount(C*H) K slices (40 for the real shape), planned at 64 rows;
  mid           256 <= rows < 1024: HcMidSplitCount(C*H) slices (16), planned at 256 rows;
  prefill       1024 <= rows < 4096: HcPrefillSplitCount(C*H) slices (4), both GEMM algorithms planned at 1024 rows;
  long prefill  rows >= 4096: the same slices, both algorithms planned at 4096 rows.

All ranges share one norm kernel per shape (S, hn, inject as a fixed-order dot product per row,
post_gate, kernels/src/cuda/general/hc_norm_inject.cu): HcNormInjectResidentKernel where C = 4, T is 16-bit and
H is a multiple of 256 up to 2560 (weights in registers, rows cp.async-streamed on a persistent grid,
1 or 2 rows a group), else HcNormInjectKernel, which puts 1, 2 or 4 rows in a block and keeps S in
shared memory or forms it twice (rows too wide), without changing a bit.
Asserted here: the mid and prefill ranges against hcfuse.reference (real shape on both sides of both
boundaries, awkward shapes in every range and in both shared-memory modes: rows not a multiple of any
tile or of the rows per block, H not a multiple of 64, small R, C = 1, C > 8 (two inject passes));
row independence inside each range (across both modes in the prefill range) and determinism;
streams_out and post_gate identical across ranges. The real shape's row independence for 1 ... 1000
rows is asserted in tests/kernels/test_kernels_cuda.py. Bounds are that module's.
"""

from __future__ import annotations

import numpy as np
import pytest

from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights
from tests._compare import assert_bitwise_equal, run_bound
from tests._cuda import cuda_session
from tests.kernels import test_kernels_cuda
from tests.kernels.test_kernels_cuda import DTYPE_IDS, DTYPES, QWEN, QWEN_ATTRS, _check, _reference, _require_dtype

pytestmark = pytest.mark.cuda

MID_MIN_ROWS = 256  # kHcMidMinRows
PREFILL_MIN_ROWS = 1024  # kHcPrefillMinRows
LONG_PREFILL_MIN_ROWS = 4096  # kHcLongPrefillMinRows
_SAMPLE = 48  # reference rows per real-shape case (the reference is row independent)


@pytest.fixture(scope="module", autouse=True)
def report_measured_maxima():
    """Prints the maxima _check recorded for this module's cases (test_kernels_cuda's _STATS)."""
    yield
    mine = {k: v for k, v in test_kernels_cuda._STATS.items() if k.startswith(("prefill", "many-branches"))}
    if mine:
        print("\nmeasured vs hcfuse.reference:\n  " + "\n  ".join(
            f"{k}: {', '.join(f'{n} {v}' for n, v in values.items())}" for k, values in sorted(mine.items())))


def _real_shape(dtype, rows: int, seed: int):
    rng = np.random.default_rng([seed, rows, DTYPES.index(dtype)])
    weights = random_weights(**QWEN, dtype=dtype, rng=rng)
    feeds = random_activations((rows,), QWEN["C"], QWEN["H"], dtype, rng, prologue=True)
    model = make_fused_node_model(**QWEN, dtype=dtype, prologue=True, streams_out=True, **QWEN_ATTRS)
    return model, feeds, weights


def _sample(rows: int) -> np.ndarray:
    """Rows to check: both ends, a spread, and the rows around the 128-row chunk and 4-row group edges."""
    edges = [0, 1, 2, 3, 63, 64, 127, 128, 255, 256, 1023, 1024, 4095, 4096, rows - 2, rows - 1]
    spread = np.linspace(0, rows - 1, _SAMPLE - len(edges)).astype(int)
    return np.unique(np.clip(np.concatenate([edges, spread]), 0, rows - 1))


@pytest.mark.parametrize("rows", [255, 256, 1023, 1024, 1500, 4095, 4096, 4099])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_real_shape_both_sides_of_the_boundary(hcfuse_lib, monkeypatch, dtype, rows):
    """255 rows (the few-row range's last count), 256 (the mid range's first), 1023 (its last), 1024
    (the prefill range's first), 1500, 4095 (its last), 4096 (the long prefill range's first) and 4099
    (two row chunks of the long range's product, a short last row group and row tile) against the reference."""
    _require_dtype(dtype)
    model, feeds, weights = _real_shape(dtype, rows, 14)
    got = run_bound(cuda_session(model, hcfuse_lib, "general", monkeypatch), {**feeds, **weights}, device="cuda")
    sample = _sample(rows)
    ref = _reference({k: v[sample] for k, v in feeds.items()}, weights, QWEN["C"], **QWEN_ATTRS)
    _check(got, ref, dtype, f"prefill real shape rows={rows}", f"prefill real-shape {dtype.name}", rows=sample)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_prefill_row_independence_and_determinism(hcfuse_lib, monkeypatch, dtype):
    """In the prefill range a row gives the same bits in batches of 1024 ... 2500 rows (4 and 2 rows per
    norm block), two runs and two sessions agree; streams_out and post_gate (the norm kernel's, shared
    by both ranges) are also the same bits in few-row batches of 1 and 16 rows."""
    _require_dtype(dtype)
    model, feeds, weights = _real_shape(dtype, 2500, 15)
    session = cuda_session(model, hcfuse_lib, "general", monkeypatch)

    def run(lo, hi, s=session):
        return run_bound(s, {**{k: v[lo:hi] for k, v in feeds.items()}, **weights}, device="cuda")

    full = run(0, 2500)
    for name, value in run(0, 2500).items():
        assert_bitwise_equal(value, full[name], f"determinism (same session) {name}")
    second = cuda_session(model, hcfuse_lib, "general", monkeypatch)
    for name, value in run(0, 2500, second).items():
        assert_bitwise_equal(value, full[name], f"determinism (second session) {name}")
    for lo, hi in [(0, 1024), (1476, 2500), (700, 1800), (3, 1030)]:
        for name, value in run(lo, hi).items():
            assert_bitwise_equal(value, full[name][lo:hi], f"rows [{lo}, {hi}) alone vs in 2500: {name}")
    for lo, hi in [(0, 1), (1234, 1250)]:
        for name, value in run(lo, hi).items():
            if name in ("streams_out", "post_gate"):
                assert_bitwise_equal(value, full[name][lo:hi], f"few-row batch [{lo}, {hi}) vs prefill batch: {name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_long_prefill_row_independence(hcfuse_lib, monkeypatch, dtype):
    """In the long prefill range a row gives the same bits in batches of 4096 ... 4200 rows (the batch of
    4200: two row chunks of the down product); streams_out and post_gate are also the bits of a prefill
    batch (1100 rows)."""
    _require_dtype(dtype)
    model, feeds, weights = _real_shape(dtype, 4200, 16)
    session = cuda_session(model, hcfuse_lib, "general", monkeypatch)

    def run(lo, hi):
        return run_bound(session, {**{k: v[lo:hi] for k, v in feeds.items()}, **weights}, device="cuda")

    full = run(0, 4200)
    for lo, hi in [(0, LONG_PREFILL_MIN_ROWS), (104, 4200)]:
        for name, value in run(lo, hi).items():
            assert_bitwise_equal(value, full[name][lo:hi], f"rows [{lo}, {hi}) alone vs in 4200: {name}")
    for name, value in run(3000, 4100).items():
        if name in ("streams_out", "post_gate"):
            assert_bitwise_equal(value, full[name][3000:4100], f"prefill batch [3000, 4100) vs long batch: {name}")


# (C, H, R): K = C*H not split (300), split 4 / 10 (2560), C = 1, C > 8 (two inject passes), H = 129;
# C = 4 with 16-byte vectors: the fixed-C HcNormInjectKernel (H not a multiple of 256): (4, 640, 64),
# (4, 96, 16) and (4, 160, 24) (R not a multiple of 16); HcNormInjectResidentKernel in 16-bit T (float32:
# the fixed-C kernel): (4, 768, 40) (3 warps a block)
AWKWARD_SHAPES = [(3, 100, 24), (4, 640, 64), (1, 72, 8), (10, 40, 16), (4, 129, 512), (4, 96, 16), (4, 160, 24),
                  (4, 768, 40)]
# (leading dims, rows alone): one count per range, none a multiple of 64, and a batch inside the range;
# "long" runs 2100 rows (4 rows a block in the fixed-C kernel) and compares with 1030 rows alone (2 a block)
AWKWARD_ROWS = {"few": ((5, 40), 130), "mid": ((3, 101), 257), "prefill": ((5, 206), 1024),
                "long": ((3, 700), 1030), "longest": ((3, 1370), 4096)}


@pytest.mark.parametrize("rows_range", list(AWKWARD_ROWS))
@pytest.mark.parametrize("C,H,R", AWKWARD_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_awkward_shapes_prefill(hcfuse_lib, monkeypatch, rng, dtype, C, H, R, rows_range):
    """200, 303, 1030, 2100 or 4110 rows as 2-D leading dims (the few-row, mid, prefill and long prefill
    ranges), prologue and streams_out, against the reference on every row; the first 130, 257, 1024, 1030
    or 4096 rows alone give the same bits (row independence inside the range)."""
    _require_dtype(dtype)
    dims, alone = AWKWARD_ROWS[rows_range]
    rows = dims[0] * dims[1]
    weights = random_weights(C, H, R, dtype, rng)
    feeds = random_activations(dims, C, H, dtype, rng, prologue=True)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, leading_dims=("a", "b"), prologue=True,
                                  streams_out=True)
    session = cuda_session(model, hcfuse_lib, "general", monkeypatch)
    got = run_bound(session, {**feeds, **weights}, device="cuda")
    _check(got, _reference(feeds, weights, C), dtype, f"{rows_range} rows={rows} C={C} H={H} R={R}",
           f"prefill awkward {dtype.name}")
    flat = {k: v.reshape(rows, -1)[:alone].reshape(1, alone, -1) for k, v in feeds.items()}
    for name, value in run_bound(session, {**flat, **weights}, device="cuda").items():
        assert_bitwise_equal(value.reshape(alone, -1), got[name].reshape(rows, -1)[:alone],
                             f"C={C} H={H} R={R}: {alone} rows alone vs in {rows}: {name}")


@pytest.mark.parametrize("prologue,streams_out", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_norm_kernel_variants(hcfuse_lib, monkeypatch, rng, dtype, prologue, streams_out):
    """HcNormInjectResidentKernel's four compiled variants (with and without the prologue and streams_out;
    float32 runs HcNormInjectKernel) against the reference on 301 rows (an odd count: a short last row
    group), and 7 rows alone give the bits they have among 301."""
    _require_dtype(dtype)
    C, H, R = 4, 512, 32
    weights = random_weights(C, H, R, dtype, rng)
    feeds = random_activations((301,), C, H, dtype, rng, prologue=prologue)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=prologue, streams_out=streams_out)
    session = cuda_session(model, hcfuse_lib, "general", monkeypatch)
    got = run_bound(session, {**feeds, **weights}, device="cuda")
    assert ("streams_out" in got) == streams_out, sorted(got)
    _check(got, _reference(feeds, weights, C), dtype, f"norm variants prologue={prologue} streams_out={streams_out}",
           f"prefill norm-variants {dtype.name}")
    alone = run_bound(session, {**{k: v[100:107] for k, v in feeds.items()}, **weights}, device="cuda")
    for name, value in alone.items():
        assert_bitwise_equal(value, got[name][100:107], f"norm variants: rows [100, 107) alone vs among 301: {name}")


@pytest.mark.parametrize("rows", [3, 600])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_many_branches_few_rows(hcfuse_lib, monkeypatch, rng, dtype, rows):
    """C = 9 (two inject passes of the norm kernel) in the few-row range, 1 and 2 rows per norm block."""
    _require_dtype(dtype)
    C, H, R = 9, 48, 8
    weights = random_weights(C, H, R, dtype, rng)
    feeds = random_activations((rows,), C, H, dtype, rng, prologue=True)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True)
    got = run_bound(cuda_session(model, hcfuse_lib, "general", monkeypatch), {**feeds, **weights}, device="cuda")
    _check(got, _reference(feeds, weights, C), dtype, f"C={C} rows={rows}", f"many-branches {dtype.name}")


# (C, H): rows too wide for HcNormInjectKernel's shared memory (C*H*sizeof(T) > kMaxNormCacheBytes =
# 104 KB; every other case here fits): the fixed-C kernel (C = 4) and the generic one (C = 2) form S
# twice in every T; (3, 9000) is cached in 16-bit T (54 KB) and not in float32 (108 KB)
WIDE_ROWS = [(4, 13400), (2, 27000), (3, 9000)]
# K = C*H is 2.6-5.3x the real shape's: the order difference of the long dot products against the
# reference's sequential sums grows with K (measured on an H200 with 4-5.3x K: float32 110-268, bfloat16 3
# scaled ulps)
_WIDE_BOUND_FACTOR = 8


@pytest.mark.parametrize("C,H", WIDE_ROWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rows_too_wide_for_the_norm_cache(hcfuse_lib, monkeypatch, rng, dtype, C, H):
    """Rows the norm kernel cannot cache against the reference, and a row alone gives the bits it has among 5."""
    _require_dtype(dtype)
    R = 8
    weights = random_weights(C, H, R, dtype, rng)
    feeds = random_activations((5,), C, H, dtype, rng, prologue=True)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True)
    session = cuda_session(model, hcfuse_lib, "general", monkeypatch)
    got = run_bound(session, {**feeds, **weights}, device="cuda")
    monkeypatch.setattr(test_kernels_cuda, "BOUND", {k: v * _WIDE_BOUND_FACTOR for k, v in test_kernels_cuda.BOUND.items()})
    _check(got, _reference(feeds, weights, C), dtype, f"wide rows C={C} H={H}", f"prefill wide-rows {dtype.name}")
    alone = run_bound(session, {**{k: v[3:4] for k, v in feeds.items()}, **weights}, device="cuda")
    for name, value in alone.items():
        assert_bitwise_equal(value, got[name][3:4], f"wide rows C={C} H={H}: row 3 alone vs among 5: {name}")
