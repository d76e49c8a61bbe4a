"""The CPU kernel inside onnxruntime sessions against hcfuse.reference.

The kernel performs the reference's operations in the reference's order for float16 and bfloat16
(sequential fp32 accumulation over k for every dot product and the norm's sum of squares, branches
summed in order, sigmoid from a correctly rounded exp). Its products fuse each multiply-add (FMA)
where the instruction set has it: for float16 and bfloat16 the product of two rounded 16-bit values
is exact in fp32, so that changes no bit and those comparisons stay bitwise. For float32 FMA skips
one rounding per step, and the down product is summed in fixed slices of k (up to 8 over C*H, each
sequential, the slices added in order), so
pre_output and post_gate are held to FP32_BOUND scaled ulps of the reference
(hcfuse.checking.verification.ulp_gap); streams_out stays bitwise. Row independence and determinism are
bitwise for every type (the kernel against itself). NaN payloads in test_special_values are
compared as "both NaN".
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import reference
from hcfuse._op import OUTPUTS, QWEN_ATTRIBUTES, QWEN_SHAPE
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights
from hcfuse.checking.verification import ulp_gap
from tests._compare import BFLOAT16, UINT_OF, assert_bitwise_equal, assert_ulp_close, run_bound
from tests.op.test_reference import run_node

DTYPES = [np.float32, np.float16, BFLOAT16]
DTYPE_IDS = ["float32", "float16", "bfloat16"]
ODD_ATTRS = {"epsilon": 1e-3, "reduction_scale": 0.7, "silu_alpha": 1.7, "gate_div": 3.0, "gate_mul": 1.5}
QWEN_ATTRS = QWEN_ATTRIBUTES
ACTIVATIONS = ("streams", "prev_block_output", "prev_post_gate")
# float32 pre_output / post_gate against the reference, in scaled ulps (ulp at max(|value|, rms of the
# output)): FMA and down's sliced sum against one sequential sum of separately rounded steps. Either
# order's sum of K unit-variance products carries a rounding error of about sqrt(K) fp32 ulps of its
# rms; the down product's (K = C*H = 10240 at the Qwen size) reaches pre_output through hidden, up
# and the sigmoid. Measured at the Qwen size (1/4/16 rows, 3 seeds each, test_float32_bound_at_the_qwen_size):
# at most 16 (pre_output; FMA alone: 6) and 3 (post_gate), i.e. about 2e-6 of the output's rms.
FP32_BOUND = 32


def assert_matches_reference(actual, expected, name: str, what: str, fp32_bound: float = FP32_BOUND) -> None:
    """Bitwise, except float32 pre_output / post_gate: within fp32_bound scaled ulps."""
    if np.asarray(actual).dtype == np.float32 and name in ("pre_output", "post_gate"):
        assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
        gap = ulp_gap(expected, actual, ir.DataType.FLOAT)
        assert gap <= fp32_bound, f"{what}: {gap:.3g} scaled ulps from the reference > bound {fp32_bound}"
    else:
        assert_bitwise_equal(actual, expected, what)


def run_kernel(make_session, *, C, H, R, dtype, feeds, leading_dims=None, prologue=False, streams_out=True,
               weights_as_inputs=True, **attrs):
    lead = leading_dims if leading_dims is not None else [f"d{i}" for i in range(feeds["streams"].ndim - 1)]
    weights = None if weights_as_inputs else {k: feeds[k] for k in ("norm_scale", "down_weight", "up_weight",
                                                                      "inject_weight")}
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, leading_dims=lead, prologue=prologue,
                                  streams_out=streams_out, weights_as_inputs=weights_as_inputs, weights=weights, **attrs)
    sess = make_session(model)
    names = {i.name for i in sess.get_inputs()}
    return run_bound(sess, {k: v for k, v in feeds.items() if k in names})


def check_against_reference(make_session, *, C, H, R, dtype, lead, rng, prologue=False, streams_out=True,
                            weights_as_inputs=True, **attrs):
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations(lead, C, H, dtype, rng, prologue)}
    got = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=feeds, prologue=prologue,
                     streams_out=streams_out, weights_as_inputs=weights_as_inputs, **attrs)
    want = dict(zip(OUTPUTS, reference.hc_lowrank_mix(**feeds, num_branches=C, **attrs)))
    assert list(got) == list(OUTPUTS[: 3 if streams_out else 2])
    for name, value in got.items():
        assert_matches_reference(value, want[name], name, f"{name} (C={C}, H={H}, R={R}, lead={lead}, prologue={prologue})")
    return feeds, got


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead", [(5,), (2, 3), (2, 1, 3), (1, 2, 2, 3), ()], ids=["1d", "2d", "3d", "4d", "no-lead"])
@pytest.mark.parametrize("prologue", [False, True], ids=["plain", "prologue"])
@pytest.mark.parametrize("streams_out", [False, True], ids=["2-out", "3-out"])
def test_leading_dims_types_prologue_streams_out(make_session, rng, dtype, lead, prologue, streams_out):
    check_against_reference(make_session, C=3, H=7, R=5, dtype=dtype, lead=lead, rng=rng, prologue=prologue,
                            streams_out=streams_out)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3, 2)], ids=["0", "2x0", "0x3x2"])
@pytest.mark.parametrize("prologue", [False, True], ids=["plain", "prologue"])
def test_zero_rows(make_session, rng, dtype, lead, prologue):
    C, H = 2, 4
    feeds = {**random_weights(C, H, 3, dtype, rng), **random_activations(lead, C, H, dtype, rng, prologue)}
    got = run_kernel(make_session, C=C, H=H, R=3, dtype=dtype, feeds=feeds, prologue=prologue)
    assert [v.shape for v in got.values()] == [(*lead, H), (*lead, C), (*lead, C * H)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("attrs", [ODD_ATTRS, QWEN_ATTRS, {"epsilon": 0.0, "gate_mul": -0.5, "silu_alpha": -2.0}],
                         ids=["odd", "qwen", "negative"])
def test_non_default_attributes(make_session, rng, dtype, attrs):
    check_against_reference(make_session, C=4, H=9, R=6, dtype=dtype, lead=(6,), rng=rng, prologue=True, **attrs)


@pytest.mark.parametrize("C", range(1, 9))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_branch_counts(make_session, rng, C, dtype):
    check_against_reference(make_session, C=C, H=11, R=4, dtype=dtype, lead=(3,), rng=rng, prologue=C % 2 == 0)


@pytest.mark.parametrize("H", [1, 3, 17, 63])
@pytest.mark.parametrize("R", [1, 2, 7, 33, 64])
def test_odd_h_and_ranks(make_session, rng, H, R):
    check_against_reference(make_session, C=3, H=H, R=R, dtype=np.float16, lead=(5,), rng=rng, prologue=True,
                            **ODD_ATTRS)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_weights_as_initializers(make_session, rng, dtype):
    check_against_reference(make_session, C=4, H=8, R=5, dtype=dtype, lead=(7,), rng=rng, prologue=True,
                            weights_as_inputs=False, **ODD_ATTRS)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_qwen_size(make_session, rng, rows, dtype):
    check_against_reference(make_session, **QWEN_SHAPE, dtype=dtype, lead=(rows,), rng=rng, prologue=True,
                            **QWEN_ATTRS)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 3, 5, 70])
def test_product_chunk_edges(make_session, rng, dtype, rows):
    """R = 200 and H = 136 leave partial chunks (160 + 40 down columns, 128 + 8 features per branch);
    1-4 rows read 16-bit weights in place, more rows widen a copy first, 70 rows span two passes."""
    check_against_reference(make_session, C=2, H=136, R=200, dtype=dtype, lead=(rows,), rng=rng, prologue=True,
                            **QWEN_ATTRS)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("H, R, rows, picks", [(16, 8, 17, (0, 3, 4, 9, 16)), (24, 20, 130, (0, 63, 64, 127, 129))],
                         ids=["17-rows", "130-rows"])
def test_row_independence(make_session, rng, dtype, H, R, rows, picks):
    """A row gives the same bits alone as inside a batch. Rows share weight reads in tiles of up to 64
    (the rows of one pass): 17 rows are one partial tile; 130 rows are 2 full passes and a tail of 2,
    picked at the edges of each tile."""
    C = 4
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((rows,), C, H, dtype, rng, prologue=True)}
    batch = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=feeds, prologue=True, **ODD_ATTRS)
    want = dict(zip(OUTPUTS, reference.hc_lowrank_mix(**feeds, num_branches=C, **ODD_ATTRS)))
    for name in batch:
        assert_matches_reference(batch[name], want[name], name, f"{name} (batch of {rows})")
    for r in picks:
        one = {k: (v[r : r + 1] if k in ACTIVATIONS else v) for k, v in feeds.items()}
        alone = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=one, prologue=True, **ODD_ATTRS)
        for name in alone:
            assert_bitwise_equal(alone[name][0], batch[name][r], f"{name} row {r} alone vs in a batch of {rows}")


def check_rows_alone_among_4_and_6(make_session, rng, *, C, H, R, dtype):
    """6 rows against the reference; the first 4 rows as a batch and rows 0, 3 and 5 alone give the
    same bits as inside the 6 (1-4 rows and more rows take different code paths)."""
    rows = 6
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((rows,), C, H, dtype, rng, prologue=True)}
    want = dict(zip(OUTPUTS, reference.hc_lowrank_mix(**feeds, num_branches=C, **QWEN_ATTRS)))
    batch = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=feeds, prologue=True, **QWEN_ATTRS)
    four = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, prologue=True, **QWEN_ATTRS,
                      feeds={k: (v[:4] if k in ACTIVATIONS else v) for k, v in feeds.items()})
    for name in batch:
        assert_matches_reference(batch[name], want[name], name, f"{name} (H={H}, R={R}, batch of {rows})")
        assert_bitwise_equal(four[name], batch[name][:4], f"{name}: 4 rows vs the first 4 of {rows}")
    for r in (0, 3, 5):
        one = {k: (v[r : r + 1] if k in ACTIVATIONS else v) for k, v in feeds.items()}
        alone = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=one, prologue=True, **QWEN_ATTRS)
        for name in alone:
            assert_matches_reference(alone[name], want[name][r : r + 1], name, f"{name} row {r} alone (H={H}, R={R})")
            assert_bitwise_equal(alone[name][0], batch[name][r], f"{name} row {r} alone vs in a batch of {rows}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_row_independence_across_feature_blocks(make_session, rng, dtype):
    """1-4 rows stream up_weight in two parts of its rows and compute g and pre_output in blocks of 256
    features, more rows take up and the mix in blocks of 128 features per branch; H = 300 leaves 256 + 44
    against 2 x 128 + 44, and C = 3 chains each branch's block to the next one's prefetch."""
    check_rows_alone_among_4_and_6(make_session, rng, C=3, H=300, R=40, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("R", [7, 37])
def test_streamed_up_product(make_session, rng, dtype, R):
    """up_weight rows of C * H = 4400 columns lie 8.8-17.6 KB apart (>= 4 KB): 1-4 rows sweep them in
    two parts of 2208 and 2192 columns (runs of 4.4-8.8 KB), four rows of k at a time (R = 7 and 37
    leave tails of 3 and 1), more rows go through the tiles."""
    check_rows_alone_among_4_and_6(make_session, rng, C=4, H=1100, R=R, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("C, H, R", [(2, 3, 16), (3, 5, 8), (4, 75, 24)], ids=["6-slices", "8-slices-short-last",
                                                                             "8-slices"])
def test_sliced_products(make_session, rng, dtype, C, H, R):
    """float32 sums down over C*H in up to 8 slices of k (C*H = 6: 6 slices of 1, at 1-2 rows in two tasks
    of 4 and 2, at 3-4 rows in three of 2; 15: 7 slices of 2 and one of 1; 300: 8 slices of 38 with a
    last of 34); 1-4 rows stream the
    slices together (R a multiple of the vector width) and up in two halves of its rows, more rows
    take the slices one by one through the tiles: the same bits either way, within the bound of the
    reference (16-bit types: unsliced, bitwise)."""
    check_rows_alone_among_4_and_6(make_session, rng, C=C, H=H, R=R, dtype=dtype)


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_bound_at_the_qwen_size(make_session, rows, seed):
    """The stated float32 bound (FP32_BOUND scaled ulps) across row counts and seeds at the real shape,
    where the down product sums 10240 products in 8 slices of 1280."""
    check_against_reference(make_session, **QWEN_SHAPE, dtype=np.float32, lead=(rows,),
                            rng=np.random.default_rng(seed), prologue=True, **QWEN_ATTRS)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sigmoid_over_a_wide_range(make_session, rng, dtype):
    """up and Z reach far beyond +-87, where the kernel's vector sigmoid hands lanes to the scalar one
    (fp32 e subnormal or overflowing), and cover the range in between densely: bitwise equal to the
    reference's sigmoid (exp in float64, rounded once). In float32 the products' order differences
    reach up ~40x larger than at unit scale and the sigmoid's slope carries them into g: measured
    246-821 scaled ulps over 6 seeds (FMA alone, before down's sliced sum: 87-155), asserted <= 2048."""
    C, H, R = 2, 1000, 24
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((3,), C, H, dtype, rng, prologue=True)}
    feeds["down_weight"] = (feeds["down_weight"].astype(np.float32) * 40).astype(dtype)  # Z ~ 40 N(0, 1)
    steps = reference.hc_lowrank_mix_steps(**feeds, num_branches=C)
    up = steps["up"].astype(np.float32)
    assert np.abs(up).max() > 100 and (np.abs(up) < 87).mean() > 0.3, "inputs do not span the sigmoid's range"
    assert np.abs(steps["Z"].astype(np.float32)).max() > 100
    got = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=feeds, prologue=True)
    for name, value in got.items():
        assert_matches_reference(value, dict(zip(OUTPUTS, reference.hc_lowrank_mix(**feeds, num_branches=C)))[name],
                                 name, name, fp32_bound=2048)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_determinism_across_runs_and_threads(make_session, rng, dtype):
    C, H, R, rows = 4, 32, 16, 64
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((rows,), C, H, dtype, rng, prologue=True)}
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True, **QWEN_ATTRS)
    first = run_bound(make_session(model), feeds)
    again = run_bound(make_session(model), feeds)
    single = run_bound(make_session(model, intra_op_threads=1), feeds)
    many = run_bound(make_session(model, intra_op_threads=4), feeds)
    for name in first:
        for other, label in ((again, "second session"), (single, "1 thread"), (many, "4 threads")):
            assert_bitwise_equal(other[name], first[name], f"{name}: {label} vs first run")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 3])
def test_decode_rows_same_bits_on_any_thread_count(make_session, rng, dtype, rows):
    """A few rows have their outputs split over the thread pool (branches for the norm, column blocks
    of down/inject, feature blocks of up and pre_output): 1, 2 and 4 intra-op threads all give the
    reference's bits. H and R leave partial blocks."""
    C, H, R = 4, 300, 70
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((rows,), C, H, dtype, rng, prologue=True)}
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True, **QWEN_ATTRS)
    want = dict(zip(OUTPUTS, reference.hc_lowrank_mix(**feeds, num_branches=C, **QWEN_ATTRS)))
    single = run_bound(make_session(model, intra_op_threads=1), feeds)
    for threads in (1, 2, 4):
        got = run_bound(make_session(model, intra_op_threads=threads), feeds)
        for name in got:
            assert_matches_reference(got[name], want[name], name, f"{name}: {threads} threads, rows={rows}")
            assert_bitwise_equal(got[name], single[name], f"{name}: {threads} threads vs 1, rows={rows}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("H, R", [(8, 4), (40, 20)], ids=["narrow", "vector-width"])
def test_special_values(make_session, rng, dtype, H, R):
    """Overflowing streams, infinities, NaN and subnormals follow the reference (NaN counted equal).
    H=40, R=20 also puts them through the kernel's 8/16-lane conversions, not only its scalar tails."""
    C = 2
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((6,), C, H, dtype, rng, prologue=True)}
    big = float(ml_dtypes.finfo(dtype).max)
    s = feeds["streams"].astype(np.float32)
    s[0] *= big / 4  # S^2 overflows fp32 in the norm
    s[1, 0] = np.inf
    s[2, 3] = np.nan
    s[3] = float(ml_dtypes.finfo(dtype).smallest_subnormal) * np.sign(s[3])  # subnormal row
    s[4] = 0.0  # all-zero row: hn = 0 * 1/sqrt(epsilon)
    feeds["streams"] = s.astype(dtype)
    got = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=feeds, prologue=True)
    want = dict(zip(OUTPUTS, reference.hc_lowrank_mix(**feeds, num_branches=C)))
    for name in got:
        if dtype == np.float32 and name != "streams_out":
            assert_matches_reference(got[name], want[name], name, name)  # ulp_gap: NaN/inf where the reference has them
        else:
            assert_ulp_close(got[name], want[name], 0, name)


# ---- post_gate's rounding points: the stock Div, Sigmoid and Mul's

# gate_div and gate_mul that are not powers of two: the gate logit and the sigmoid then round to T
# where one rounding at the end would not (powers of two, such as the real model's 4 and 2, make
# both extra roundings exact)
POST_GATE_ATTRS = [{"gate_div": 3.0, "gate_mul": 1.7}, {"gate_div": -0.7, "gate_mul": 1.3},
                   {"gate_div": 5.0, "gate_mul": -0.3}]
POST_GATE_IDS = ["div3-mul1.7", "div-0.7-mul1.3", "div5-mul-0.3"]


def order_free_inject_case(C, H, R, dtype, rows, rng) -> dict:
    """The op's inputs (no prologue; run with epsilon 0) for which inject = hn @ inject_weight is exact
    in fp32 in any order of its sum, so every path, whatever its order, has the reference's inject
    and must give the reference's post_gate bits. Streams of +-1 make each branch's mean square
    exactly 1 (hn = +-norm_scale); norm_scale (multiples of 1/16 up to 2) and inject_weight (multiples
    of 1/64 up to 1, times a power of two that puts inject at a few units) have few significant bits,
    so every partial sum is a multiple of one unit and far below 2^24 of them."""
    K = C * H
    feeds = random_weights(C, H, R, dtype, rng)
    feeds["norm_scale"] = (rng.integers(-32, 33, K) / 16).astype(dtype)
    scale = 2.0 ** np.round(np.log2(6.0 / np.sqrt(K)))
    feeds["inject_weight"] = (rng.integers(-64, 65, (K, C)) / 64 * scale).astype(dtype)
    feeds["streams"] = rng.choice([-1.0, 1.0], (rows, K)).astype(dtype)
    terms = np.abs(feeds["norm_scale"].astype(np.float64)) @ np.abs(feeds["inject_weight"].astype(np.float64))
    assert terms.max() < 2.0**24 * scale / 1024, "inject's partial sums could round in fp32"
    return feeds


def sigmoid_near_a_rounding_boundary(steps, attrs, fp32_ulps: int) -> np.ndarray:
    """Where the contract's fp32 sigmoid of the gate logit lies within fp32_ulps fp32 ulps of a rounding
    boundary of T: a sigmoid whose exp is a few fp32 ulps off (CUDA's expf: up to 2) may round to the
    neighbouring value of T there, and only there."""
    dtype = steps["post_gate"].dtype
    logit = (steps["inject"].astype(np.float32) / np.float32(attrs["gate_div"])).astype(dtype)
    sigmoid = reference.sigmoid_f32(logit)
    rounded = sigmoid.astype(dtype)
    low, high = sigmoid.copy(), sigmoid.copy()
    for _ in range(fp32_ulps):
        low, high = np.nextafter(low, np.float32(-np.inf)), np.nextafter(high, np.float32(np.inf))
    u = UINT_OF[dtype]
    return (low.astype(dtype).view(u) != rounded.view(u)) | (high.astype(dtype).view(u) != rounded.view(u))


def assert_post_gate_at_stock_points(actual, steps, attrs, what: str, sigmoid_fp32_ulps: int = 0) -> None:
    """actual is the reference's post_gate bit for bit, and the case tells the rounding points apart:
    in 16-bit T, rounding once (sigmoid(inject / gate_div) * gate_mul in fp32) gives other bits on
    more than a tenth of the elements. With sigmoid_fp32_ulps (a path whose fp32 sigmoid may be that
    many ulps off), elements whose sigmoid may round the other way (sigmoid_near_a_rounding_boundary:
    a few, most of them logits near 0, where sigmoid is about 0.5 + logit / 4, half way between two
    values of T) may be up to 2 ulps of T off instead."""
    expected = steps["post_gate"]
    dtype = expected.dtype
    exempt = np.zeros(expected.shape, bool)
    if sigmoid_fp32_ulps:
        exempt = sigmoid_near_a_rounding_boundary(steps, attrs, sigmoid_fp32_ulps)
        assert exempt.mean() <= 0.05, f"{what}: {exempt.mean():.1%} of the sigmoids lie near a rounding boundary"
        assert_ulp_close(actual[exempt], expected[exempt], 2, f"{what}, sigmoids near a rounding boundary")
    assert_bitwise_equal(np.where(exempt, expected, actual), expected, what)
    if dtype.itemsize == 2:
        x = steps["inject"].astype(np.float32) / np.float32(attrs["gate_div"])
        once = (reference.sigmoid_f32(x) * np.float32(attrs["gate_mul"])).astype(dtype)
        differs = float(np.mean(once.view(np.uint16) != expected.view(np.uint16)))
        assert differs > 0.1, f"{what}: one rounding differs on only {differs:.1%} of post_gate; pick other data"


@pytest.mark.parametrize("attrs", POST_GATE_ATTRS, ids=POST_GATE_IDS)
@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16], ids=["float16", "bfloat16"])
def test_post_gate_rounds_at_the_stock_points(make_session, rng, dtype, attrs):
    """Random data: the gate logit, its sigmoid and post_gate are each rounded to T, as the stock Div,
    Sigmoid and Mul round (onnxruntime's schema of the op states the same), bit for bit."""
    C, H, R, rows = 4, 16, 4, 512
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((rows,), C, H, dtype, rng)}
    got = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=feeds, **attrs)
    steps = reference.hc_lowrank_mix_steps(**feeds, num_branches=C, **attrs)
    assert_post_gate_at_stock_points(got["post_gate"], steps, attrs, f"post_gate {attrs}")


@pytest.mark.parametrize("attrs", POST_GATE_ATTRS, ids=POST_GATE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_post_gate_bits_with_an_order_free_inject(make_session, rng, dtype, attrs):
    """With an inject that every order of its sum gets exactly (the CUDA paths' test data), post_gate
    is the reference's bit for bit in every T, float32 included."""
    C, H, R, rows = 4, 64, 8, 256
    feeds = order_free_inject_case(C, H, R, dtype, rows, rng)
    attrs = {**attrs, "epsilon": 0.0}
    got = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=feeds, **attrs)
    steps = reference.hc_lowrank_mix_steps(**feeds, num_branches=C, **attrs)
    assert_post_gate_at_stock_points(got["post_gate"], steps, attrs, f"post_gate {attrs}")


@pytest.mark.parametrize("attrs", POST_GATE_ATTRS, ids=POST_GATE_IDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_post_gate_is_the_stock_div_sigmoid_mul(make_session, rng, dtype, attrs):
    """The kernel's post_gate against onnxruntime's own Div, Sigmoid and Mul (CPU provider: float32 and
    float16), each node run on its own on the previous node's output, starting from the same inject:
    the stock Div gives the kernel's gate logit and the stock Mul of the kernel's sigmoid its post_gate,
    bit for bit. The stock Sigmoid is MLAS's (not the contract's sigmoid): where it gives the
    contract's bits, so does the whole stock chain; elsewhere post_gate moves by gate_mul times its
    difference plus one ulp of the final rounding. The stock nodes' constants are T values, so the fused
    node's attributes are those values (as the fusion writes them)."""
    C, H, R, rows = 4, 64, 8, 256
    feeds = order_free_inject_case(C, H, R, dtype, rows, rng)
    attrs = {**{k: float(dtype(v)) for k, v in attrs.items()}, "epsilon": 0.0}
    got = run_kernel(make_session, C=C, H=H, R=R, dtype=dtype, feeds=feeds, **attrs)["post_gate"]
    steps = reference.hc_lowrank_mix_steps(**feeds, num_branches=C, **attrs)
    gate_div, gate_mul = (np.array(attrs[k], dtype) for k in ("gate_div", "gate_mul"))
    logit = run_node("Div", {"inject": steps["inject"], "gate_div": gate_div})
    contract_logit = steps["inject"].astype(np.float32) / np.float32(gate_div)
    assert_bitwise_equal(logit, contract_logit.astype(dtype), "gate logit: stock Div vs the contract")
    contract_sigmoid = reference.sigmoid_f32(logit).astype(dtype)
    assert_bitwise_equal(got, run_node("Mul", {"sigmoid": contract_sigmoid, "gate_mul": gate_mul}),
                         "post_gate: kernel vs the stock Mul of the contract's sigmoid")
    sigmoid = run_node("Sigmoid", {"logit": logit})
    stock = run_node("Mul", {"sigmoid": sigmoid, "gate_mul": gate_mul})
    same = sigmoid.astype(np.float64) == contract_sigmoid.astype(np.float64)
    assert_bitwise_equal(np.where(same, got, stock), stock,
                         "post_gate where the stock Sigmoid gives the contract's bits")
    gap = np.abs(got.astype(np.float64) - stock.astype(np.float64))
    bound = (abs(float(gate_mul)) * np.abs(sigmoid.astype(np.float64) - contract_sigmoid.astype(np.float64))
             + np.spacing(np.abs(got)).astype(np.float64))
    assert (gap <= bound).all(), f"post_gate vs the stock chain: {int((gap > bound).sum())} elements beyond the bound"
    if dtype == np.float16:  # MLAS's error (< 2^-22) rarely reaches a float16 rounding
        assert same.mean() > 0.95, f"the stock Sigmoid differs from the contract on {1 - same.mean():.1%} of the logits"


def test_rejects_bad_input_without_computing(make_session, rng):
    """A shape error leaves no partial work: the next good run equals the reference."""
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    C, H, R = 2, 4, 3
    feeds = {**random_weights(C, H, R, np.float32, rng), **random_activations((3,), C, H, np.float32, rng)}
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32, leading_dims=["rows"])
    for vi in model.graph.input:
        vi.type.tensor_type.ClearField("shape")
    sess = make_session(model)
    bad = dict(feeds, up_weight=np.ones((R, C * H + 1), np.float32))
    with pytest.raises(InvalidArgument, match=r"up_weight must be \(R, C\*H\) = \(3, 8\); got \(3, 9\)"):
        sess.run(None, bad)
    got = sess.run(None, feeds)
    for name, a, b in zip(OUTPUTS, got, reference.hc_lowrank_mix(**feeds, num_branches=C)):
        assert_matches_reference(a, b, name, name)
