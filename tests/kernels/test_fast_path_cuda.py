"""The fused CUDA fast path (kernels/src/cuda/fast/hc_fast_path.cu), pinned with HCFUSE_FORCE_PATH=fast.

Against hcfuse.reference on the real bf16/fp16 shape (the real shape's kernels, stage 1's down weights in
registers) and on small shapes the fast path supports (the generic kernels, a shared-memory weight
tile), with constant weights (initializers: weights read before the PDL wait) and weights fed as graph
inputs (read after it); bitwise determinism, row independence across row-chunk sizes, agreement with
the general path, and a chain of fused nodes under CUDA graph replay equal to eager execution. The
HCFUSE_FAST_* switches exist only in a library built with HCFUSE_DEV_KNOBS: their tests run there, and
a default build is checked to ignore them.

Bounds (stated, in T): streams_out exact; post_gate within 2 ulp of the reference; pre_output within
2 ulp measured at the scale of its terms, reduction_scale * sum_c |hn_c| (pre_output sums C terms
that can cancel, so its own ulp is no yardstick where they do), and bit-exact in at least 95% of the
cells. The reference sums each dot product sequentially over all K; the fast path sums K in fixed
slices (tensor-core k steps within a CTA's slice, then cluster ranks, then clusters), so an fp32 sum
can differ in its last bits and flip a rounding to T of down or inject; g then moves by an ulp.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from hcfuse._op import QWEN_ATTRIBUTES, QWEN_SHAPE
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights
from hcfuse.reference import hc_lowrank_mix_steps
from tests._compare import assert_bitwise_equal, assert_ulp_close, run_bound, to_ort_value
from tests._cuda import compute_capability, cuda_session, device_to_host, fused_chain_model
from tests.kernels.test_kernels_cpu import (
    POST_GATE_ATTRS,
    POST_GATE_IDS,
    assert_post_gate_at_stock_points,
    order_free_inject_case,
)
from tests.kernels.test_kernels_cuda import SIGMOID_FP32_ULPS

pytestmark = pytest.mark.cuda

BF16 = ml_dtypes.bfloat16
QWEN = QWEN_SHAPE
ATTRS = QWEN_ATTRIBUTES
ULP_BOUND = 2


@pytest.fixture(scope="module", autouse=True)
def needs_sm80():
    if "CUDAExecutionProvider" in ort.get_available_providers() and compute_capability() < (8, 0):
        pytest.skip("the fast path needs compute capability 8.0+ (fp16/bf16 kernels, cp.async)")


@pytest.fixture
def fast_session(hcfuse_lib, monkeypatch):
    """fast_session(model, force="fast", **cuda_options): the path pinned (read at kernel creation)."""

    def make(model, force: str = "fast", **cuda_options):
        return cuda_session(model, hcfuse_lib, force, monkeypatch, **cuda_options)

    return make


def _case(C, H, R, dtype, rows, prologue, rng, *, constant_weights=True):
    weights = random_weights(C, H, R, dtype, rng)
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=prologue, streams_out=True,
                                  weights_as_inputs=not constant_weights, weights=weights, **ATTRS)
    feeds = random_activations((rows,), C, H, dtype, rng, prologue=prologue)
    if not constant_weights:
        feeds.update(weights)
    return model, weights, feeds


def _reference(feeds, weights, C):
    args = {**weights, **{k: v for k, v in feeds.items() if k not in weights}}
    steps = hc_lowrank_mix_steps(**args, num_branches=C, **ATTRS)
    hn = steps["hn"].astype(np.float32).reshape(*steps["pre_output"].shape[:-1], C, -1)
    scale = ATTRS["reduction_scale"] * np.abs(hn).sum(axis=-2)
    return {"pre_output": steps["pre_output"], "post_gate": steps["post_gate"], "streams_out": steps["S"],
            "pre_scale": scale}


# The share of pre_output cells the fast path gives bit for bit, where its sums' order flips a rounding to T now and
# then: measured down to 94.9% (float16, 1 row, H = 1024, H100); a missing or extra rounding to T gives far fewer.
MIN_EXACT = 0.9


def _assert_pre_output_close(got, expected, scale, what, bound=ULP_BOUND, min_exact=MIN_EXACT):
    """|got - expected| <= bound ulp of T at the terms' scale, and >= min_exact of the cells bit-exact."""
    eps = float(ml_dtypes.finfo(expected.dtype).eps)
    tiny = float(ml_dtypes.finfo(expected.dtype).tiny)
    unit = np.exp2(np.floor(np.log2(np.maximum(scale, tiny)))) * eps
    err = np.abs(got.astype(np.float32) - expected.astype(np.float32))
    bad = err > bound * unit
    worst = float((err / unit).max()) if err.size else 0.0
    assert not bad.any(), (f"{what}: {int(bad.sum())} cells beyond {bound} ulp at the terms' scale "
                           f"(worst {worst:.1f}); first at {tuple(np.argwhere(bad)[0])}")
    exact = float((got.view(np.uint16) == expected.view(np.uint16)).mean()) if got.size else 1.0
    assert exact >= min_exact, f"{what}: only {exact:.1%} of the cells bit-exact"
    return worst, exact


def _check_against_reference(got, ref, what):
    assert_bitwise_equal(got["streams_out"], ref["streams_out"], f"{what} streams_out")
    worst = {"post_gate": assert_ulp_close(got["post_gate"], ref["post_gate"], ULP_BOUND, f"{what} post_gate")}
    worst["pre_output (scale ulp, exact share)"] = _assert_pre_output_close(
        got["pre_output"], ref["pre_output"], ref["pre_scale"], f"{what} pre_output")
    return worst


@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, 16, 33, 64])
@pytest.mark.parametrize("prologue", [False, True], ids=["no-prologue", "prologue"])
def test_real_shape_matches_reference(fast_session, rng, dtype, rows, prologue):
    model, weights, feeds = _case(**QWEN, dtype=dtype, rows=rows, prologue=prologue, rng=rng)
    got = run_bound(fast_session(model), feeds, device="cuda")
    worst = _check_against_reference(got, _reference(feeds, weights, QWEN["C"]),
                                     f"{np.dtype(dtype)} rows={rows} prologue={prologue}")
    print(f"max ulp vs reference: {worst}")


@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("shape", [QWEN, dict(C=4, H=1024, R=64)], ids=["registers", "tile"])
def test_weights_from_the_graph(fast_session, rng, dtype, rows, shape):
    """Weights as graph inputs (not constant): the kernels read them only after the PDL wait, into
    registers (the real shape's stage 1) or a shared-memory tile (the generic kernels)."""
    model, weights, feeds = _case(**shape, dtype=dtype, rows=rows, prologue=True, rng=rng, constant_weights=False)
    got = run_bound(fast_session(model), feeds, device="cuda")
    _check_against_reference(got, _reference(feeds, weights, shape["C"]), f"graph-input weights rows={rows}")


@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("C,H,R", [(4, 64, 8), (8, 32, 16), (4, 256, 512), (4, 1024, 64)])
@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("prologue", [False, True], ids=["no-prologue", "prologue"])
def test_small_shapes_match_reference(fast_session, rng, dtype, C, H, R, rows, prologue):
    """The generic kernels (stage 1's weights in a shared-memory tile), one pass and several."""
    model, weights, feeds = _case(C, H, R, dtype, rows, prologue, rng)
    got = run_bound(fast_session(model), feeds, device="cuda")
    _check_against_reference(got, _reference(feeds, weights, C), f"C={C} H={H} R={R} rows={rows}")


@pytest.mark.parametrize("attrs", POST_GATE_ATTRS, ids=POST_GATE_IDS)
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rows", [8, 16])
@pytest.mark.parametrize("shape", [QWEN, dict(C=4, H=1024, R=64)], ids=["registers", "tile"])
def test_post_gate_rounds_at_the_stock_points(fast_session, dtype, rows, shape, attrs):
    """Constant weights (read before the PDL wait; in registers at the real shape, a shared-memory tile
    at the other): the gate logit, its sigmoid and post_gate are each rounded to T, as the stock Div,
    Sigmoid and Mul round, bit for bit, with an inject that every order of its sum gets exactly
    (test_kernels_cuda.py runs the same with weights as graph inputs)."""
    C, H, R = shape["C"], shape["H"], shape["R"]
    attrs = {**attrs, "epsilon": 0.0}
    inputs = order_free_inject_case(C, H, R, dtype, rows, np.random.default_rng([rows, C, H]))
    weights = {k: v for k, v in inputs.items() if k != "streams"}
    model = make_fused_node_model(**shape, dtype=dtype, weights_as_inputs=False, weights=weights, **attrs)
    got = run_bound(fast_session(model), {"streams": inputs["streams"]}, device="cuda")
    steps = hc_lowrank_mix_steps(**inputs, num_branches=C, **attrs)
    assert_post_gate_at_stock_points(got["post_gate"], steps, attrs, f"post_gate {attrs} rows={rows} C={C} H={H}",
                                     sigmoid_fp32_ulps=SIGMOID_FP32_ULPS)


def test_row_independence_and_determinism(fast_session, rng):
    """A row gives the same bits alone, in a batch of 16 and in a batch of 33 (other row chunks)."""
    model, weights, feeds = _case(**QWEN, dtype=BF16, rows=33, prologue=True, rng=rng)
    session = fast_session(model)
    batch = run_bound(session, feeds, device="cuda")
    again = run_bound(session, feeds, device="cuda")
    for name in batch:
        assert_bitwise_equal(again[name], batch[name], f"determinism {name}")
    sub16 = run_bound(session, {k: v[:16] for k, v in feeds.items()}, device="cuda")
    for i in (0, 5, 15, 32):
        alone = run_bound(session, {k: v[i:i + 1] for k, v in feeds.items()}, device="cuda")
        for name in batch:
            assert_bitwise_equal(alone[name][0], batch[name][i], f"row {i} alone vs in 33: {name}")
            if i < 16:
                assert_bitwise_equal(sub16[name][i], batch[name][i], f"row {i} in 16 vs in 33: {name}")


@pytest.mark.parametrize("rows", [1, 4, 16])
def test_fast_agrees_with_general(fast_session, rng, rows):
    model, weights, feeds = _case(**QWEN, dtype=BF16, rows=rows, prologue=True, rng=rng)
    fast = run_bound(fast_session(model, "fast"), feeds, device="cuda")
    general = run_bound(fast_session(model, "general"), feeds, device="cuda")
    ref = _reference(feeds, weights, QWEN["C"])
    assert_bitwise_equal(fast["streams_out"], general["streams_out"], f"rows={rows} streams_out")
    assert_ulp_close(fast["post_gate"], general["post_gate"], 2 * ULP_BOUND, f"fast vs general rows={rows} post_gate")
    _assert_pre_output_close(fast["pre_output"], general["pre_output"], ref["pre_scale"],
                             f"fast vs general rows={rows} pre_output", bound=2 * ULP_BOUND, min_exact=0.9)


@pytest.mark.parametrize("rows", [1, 3])
def test_chain_under_cuda_graph(fast_session, rng, rows):
    """Four chained blocks (PDL between their kernels): CUDA graph replay == eager, bit for bit, and the
    chain stays within the bound of the reference applied block by block."""
    C, H, R = QWEN["C"], QWEN["H"], QWEN["R"]
    weights = random_weights(C, H, R, BF16, rng)
    model = fused_chain_model([weights], 4, C=C, H=H, dtype=BF16, **ATTRS)
    streams = rng.standard_normal((rows, C * H)).astype(BF16)
    eager = run_bound(fast_session(model), {"streams": streams}, device="cuda")

    graphed = fast_session(model, enable_cuda_graph="1")
    binding = graphed.io_binding()
    binding.bind_ortvalue_input("streams", to_ort_value(streams, "cuda"))
    names = [o.name for o in graphed.get_outputs()]
    outs = [ort.OrtValue.ortvalue_from_shape_and_type([rows, d], 16, "cuda", 0) for d in (H, C, C * H)]
    for name, value in zip(names, outs):
        binding.bind_ortvalue_output(name, value)
    for _ in range(3):  # capture, then two replays
        graphed.run_with_iobinding(binding)
    for name, value in zip(names, outs):
        assert_bitwise_equal(device_to_host(value, BF16), eager[name], f"graph replay vs eager {name}")

    feeds = {"streams": streams}
    for _ in range(4):
        ref = _reference(feeds, weights, C)
        feeds = {"streams": ref["streams_out"], "prev_block_output": ref["pre_output"],
                 "prev_post_gate": ref["post_gate"]}
    _assert_pre_output_close(eager[names[0]], ref["pre_output"], ref["pre_scale"], "4-block chain pre_output",
                             bound=8 * ULP_BOUND, min_exact=0.5)


# ---- the HCFUSE_FAST_* switches (HcFastTuning): a library built with HCFUSE_DEV_KNOBS reads them


@pytest.fixture(scope="module")
def dev_knobs(hcfuse_lib) -> bool:
    """Whether the library reads the switches: it refuses an invalid HCFUSE_FAST_AHEAD only then."""
    model, _, _ = _case(**QWEN, dtype=BF16, rows=1, prologue=False, rng=np.random.default_rng(0))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HCFUSE_FAST_AHEAD", "-1")
        try:
            cuda_session(model, hcfuse_lib, "fast", patch)
        except Exception as e:  # onnxruntime's error type for a failed kernel creation
            assert "HCFUSE_FAST_AHEAD must be an integer >= 0" in str(e), e
            return True
    return False


@pytest.fixture
def needs_dev_knobs(dev_knobs):
    if not dev_knobs:
        pytest.skip("the library was built without HCFUSE_DEV_KNOBS (it reads no HCFUSE_FAST_* switch)")


# Every variable an earlier library read besides HCFUSE_FORCE_PATH and HCFUSE_DEBUG, at a value other than
# its default (invalid ones included).
FORMER_SWITCHES = {
    "HCFUSE_FAST_SS_LOCAL_ROWS": "64", "HCFUSE_FAST_HIDDEN_LOCAL_ROWS": "64", "HCFUSE_FAST_CLUSTER": "4",
    "HCFUSE_FAST_DESIGN": "plain", "HCFUSE_FAST_BULK": "0", "HCFUSE_FAST_BATCH": "0",
    "HCFUSE_FAST_REG_WEIGHTS": "0", "HCFUSE_FAST_REAL_SHAPE": "0", "HCFUSE_FAST_AHEAD": "-1",
    "HCFUSE_FAST_STAGE2_CTAS": "80", "HCFUSE_UP_GATE": "yes",
}


@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("path,rows", [("fast", 1), ("fast", 16), ("fast", 33), ("general", 4), ("general", 300)])
def test_default_build_ignores_every_switch(fast_session, rng, monkeypatch, dev_knobs, dtype, path, rows):
    """A library built without HCFUSE_DEV_KNOBS gives the same bits whatever the switches say."""
    if dev_knobs:
        pytest.skip("the library was built with HCFUSE_DEV_KNOBS")
    model, _, feeds = _case(**QWEN, dtype=dtype, rows=rows, prologue=True, rng=rng)
    default = run_bound(fast_session(model, path), feeds, device="cuda")
    for name, value in FORMER_SWITCHES.items():
        monkeypatch.setenv(name, value)
    switched = run_bound(fast_session(model, path), feeds, device="cuda")
    for name in default:
        assert_bitwise_equal(switched[name], default[name], f"{path} rows={rows} {name}: switches set vs unset")


@pytest.mark.usefixtures("needs_dev_knobs")
@pytest.mark.parametrize("rows", [1, 3, 16, 33])
def test_work_split_never_changes_a_result(fast_session, rng, monkeypatch, rows):
    """The tuning knobs move work between cluster ranks (local sums of squares and hidden values, or
    shared through distributed shared memory); every split sums in the same order, so bits agree."""
    model, _, feeds = _case(**QWEN, dtype=BF16, rows=rows, prologue=True, rng=rng)
    results = []
    for local_rows in ("0", "64"):
        monkeypatch.setenv("HCFUSE_FAST_SS_LOCAL_ROWS", local_rows)
        monkeypatch.setenv("HCFUSE_FAST_HIDDEN_LOCAL_ROWS", local_rows)
        results.append(run_bound(fast_session(model), feeds, device="cuda"))
    for name in results[0]:
        assert_bitwise_equal(results[1][name], results[0][name], f"rows={rows} {name}: shared vs local split")


# Shapes and row counts of the same-bits tests: one pass, several passes (33 rows), small shapes.
SAME_BITS_CASES = pytest.mark.parametrize(
    "shape,rows", [(QWEN, 1), (QWEN, 2), (QWEN, 3), (QWEN, 16), (QWEN, 33),
                   (dict(C=4, H=256, R=512), 7), (dict(C=4, H=1024, R=64), 5)],
    ids=["qwen-1", "qwen-2", "qwen-3", "qwen-16", "qwen-33", "4x256x512-7", "4x1024x64-5"])


def _assert_same_bits(fast_session, monkeypatch, rng, shape, dtype, rows, prologue, env_name, base, other):
    """Every output with env_name=other equals env_name=base bit for bit, and keeps the bound."""
    model, weights, feeds = _case(**shape, dtype=dtype, rows=rows, prologue=prologue, rng=rng)
    results = {}
    for value in (base, other):
        monkeypatch.setenv(env_name, value)
        results[value] = run_bound(fast_session(model), feeds, device="cuda")
    for name in results[other]:
        assert_bitwise_equal(results[other][name], results[base][name],
                             f"rows={rows} {name}: {env_name}={other} vs {base}")
    _check_against_reference(results[other], _reference(feeds, weights, shape["C"]), f"{env_name}={other} rows={rows}")


@pytest.mark.usefixtures("needs_dev_knobs")
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@SAME_BITS_CASES
@pytest.mark.parametrize("prologue", [True, False], ids=["prologue", "no-prologue"])
def test_real_shape_kernels_give_the_same_bits(fast_session, rng, monkeypatch, dtype, shape, rows, prologue):
    """The real shape's kernels (its tiling as compile-time constants, RealShapeDims in hc_fast_path.cu,
    stage 1's down weights in registers) sum every value in the generic kernels' order (DownWeightRegs:
    WarpMma's k steps), so HCFUSE_FAST_REAL_SHAPE=1 (the default) and =0 agree bit for bit; for the small
    shapes both settings run the generic kernels."""
    _assert_same_bits(fast_session, monkeypatch, rng, shape, dtype, rows, prologue, "HCFUSE_FAST_REAL_SHAPE", "0", "1")


@pytest.mark.usefixtures("needs_dev_knobs")
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rows", [1, 16])
def test_kernels_ahead_gives_the_same_bits(fast_session, rng, monkeypatch, dtype, rows):
    """HCFUSE_FAST_AHEAD (how many later kernels may wait next to the real shape's kernels: 1, the
    default, pads their shared memory; 0 does not) changes only where CTAs run, never a bit."""
    _assert_same_bits(fast_session, monkeypatch, rng, QWEN, dtype, rows, True, "HCFUSE_FAST_AHEAD", "0", "1")


@pytest.mark.usefixtures("needs_dev_knobs")
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@SAME_BITS_CASES
def test_fewer_stage2_ctas_give_the_same_bits(fast_session, rng, monkeypatch, dtype, shape, rows):
    """HCFUSE_FAST_STAGE2_CTAS=80 (the real shape: 80 stage 2 CTAs of 32 features instead of 160 of 16)
    only regroups stage 2's columns: each up column, g and pre_output feature is computed by the same
    operations, so every output equals the default's bit for bit."""
    _assert_same_bits(fast_session, monkeypatch, rng, shape, dtype, rows, True, "HCFUSE_FAST_STAGE2_CTAS", "0", "80")


@pytest.mark.parametrize("name,value,message", [
    ("HCFUSE_FAST_SS_LOCAL_ROWS", "many", "HCFUSE_FAST_SS_LOCAL_ROWS must be an integer >= 0"),
    ("HCFUSE_FAST_STAGE2_CTAS", "-8", "HCFUSE_FAST_STAGE2_CTAS must be an integer >= 0"),
    ("HCFUSE_FAST_AHEAD", "-1", "HCFUSE_FAST_AHEAD must be an integer >= 0"),
    ("HCFUSE_FAST_REAL_SHAPE", "2", "HCFUSE_FAST_REAL_SHAPE must be 0 or 1"),
])
@pytest.mark.usefixtures("needs_dev_knobs")
def test_bad_tuning_value_is_a_clear_error(fast_session, rng, monkeypatch, name, value, message):
    model, _, _ = _case(**QWEN, dtype=BF16, rows=1, prologue=False, rng=rng)
    monkeypatch.setenv(name, value)
    with pytest.raises(Exception, match=message):
        fast_session(model)
