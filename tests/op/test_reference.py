"""hcfuse.reference against the stock unfused chain run by onnxruntime 1.31's own contrib ops on CPU.

Two layers. Per site: each stock node is fed the reference's own inputs of that step and compared
with the reference's output of that step, so a difference belongs to that node alone and is bounded
by what the node does differently from the numerics contract (docs/NUMERICS.md). End to end: the whole stock chain against
the reference, differences reported in ulp and asserted in ulps of the row's largest value.

Why they differ, site by site (measured at onnxruntime 1.31.1, x86-64):

- S (PostMix), hn (BranchwiseRMSNorm), pre_output (PreMix): same formula, fp32 arithmetic and
  rounding point as the contract (the norm sums squares sequentially and computes x * inv_rms * scale
  like the reference): bitwise equal in float32, float16 and bfloat16.
- down, inject, up (MatMul, MLAS GEMM): the K products are summed in a blocked order, the reference
  sums sequentially. Any order is within (K+1) * 2^-24 * sum|x*w| of the exact sum, so the two differ
  by at most twice that plus one ulp of T for the final rounding. Element ulps are large where a sum
  cancels to near zero. Measured max: float32 down 5050, inject 4920, up 588288 ulp;
  float16 down 1, inject 0, up 2 ulp.
- g (Sigmoid) and SG inside hidden (ScaledSiLU): MLAS's logistic is a rational approximation with an
  absolute error up to 1.8e-7 (< 2^-22), not the correctly rounded expf sigmoid of the contract
  (below about -16 it returns 0). Bound: 2^-22 (times |Z| for hidden) plus one ulp of T. Measured
  max: float32 g 5957 ulp (on values near 1e-6 whose ulp is tiny; 2 ulp near 1), hidden 3 ulp;
  float16 g 1 ulp, hidden 0 (bitwise: test_contrib_ops_bitwise).
- post_gate (Div, Sigmoid, Mul): the contract rounds to T where these nodes do (the gate logit, its
  sigmoid, post_gate), so Div gives the contract's logit and Mul of the contract's sigmoid its
  post_gate, bit for bit; only the Sigmoid differs (MLAS's logistic, as at g), by up to 2^-22 plus an
  ulp of T, which gate_mul carries to post_gate, plus one ulp of the final rounding. Measured max:
  float32 3 ulp, float16 0 ulp. (Run as one chain, onnxruntime's CPU provider computes a float16
  Div -> Sigmoid -> Mul in float32 and rounds only its result: measured, its post_gate is the
  one-rounding formula's on every element; node by node, as here, each node rounds.)
- End to end every difference above propagates. Measured max, in ulps of the row's largest value:
  float32 pre_output 6, post_gate 8; float16 pre_output 1, post_gate 1 (element ulps: float32
  pre_output 40960 and post_gate 8, float16 1356 and 1, the large ones on elements that cancel to
  near zero). A wider sweep (6 seeds, 5 shapes, 3 attribute sets) reached 33 / 36 (float32) and
  2 / 1 (float16) row ulps; asserted: 64 for float32, 4 for float16.
  test_report_measured_ulps prints the figures of a run (pytest -s).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from hcfuse import reference
from hcfuse._op import (
    ATTRIBUTES,
    BRANCH_NORM,
    DOMAIN,
    IR_VERSION,
    ONNX_OPSET,
    OUTPUTS,
    POST_MIX,
    PRE_MIX,
    QWEN_ATTRIBUTES,
    SCALED_SILU,
)
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights, weight_shapes
from tests._compare import BFLOAT16, assert_bitwise_equal, cpu_session, max_ulp, run_bound, run_stock
from tests.oprun import CONTRIB_OPS

# MLAS's logistic (ORT's CPU Sigmoid and ScaledSiLU's sigmoid): absolute error below 2^-22
# (measured max 1.79e-7 over [-88, 20])
LOGISTIC_ABS_ERR = 2.0**-22


# intermediate values the stock chain exposes, named like the reference's steps
STEP_SITES = ("hn", "down", "hidden", "up", "g", "inject")


def make_stock_chain(*, C, H, R, dtype, prologue, epsilon=1e-5, reduction_scale=1.0, silu_alpha=1.0,
                     gate_div=1.0, gate_mul=1.0, expose=STEP_SITES) -> onnx.ModelProto:
    """The stock unfused block: PostMix?, BranchwiseRMSNorm, MatMul, ScaledSiLU, MatMul, Sigmoid, PreMix,
    MatMul, Div?, Sigmoid, Mul?; its outputs are named like the fused op's, plus the intermediate
    steps in expose (named like hcfuse.reference's steps)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    lead = ["rows"]
    inputs = [helper.make_tensor_value_info("streams", elem, [*lead, C * H])]
    inputs += [helper.make_tensor_value_info(n, elem, list(s)) for n, s in weight_shapes(C, H, R).items()]
    nodes = []
    s = "streams"
    if prologue:
        inputs += [helper.make_tensor_value_info("prev_block_output", elem, [*lead, H]),
                   helper.make_tensor_value_info("prev_post_gate", elem, [*lead, C])]
        nodes.append(helper.make_node(POST_MIX, ["streams", "prev_block_output", "prev_post_gate"], ["S"],
                                      domain=DOMAIN, num_branches=C))
        s = "S"
    nodes += [
        helper.make_node(BRANCH_NORM, [s, "norm_scale"], ["hn"], domain=DOMAIN, num_branches=C, epsilon=epsilon),
        helper.make_node("MatMul", ["hn", "down_weight"], ["down"]),
        helper.make_node(SCALED_SILU, ["down"], ["hidden"], domain=DOMAIN, alpha=silu_alpha),
        helper.make_node("MatMul", ["hidden", "up_weight"], ["up"]),
        helper.make_node("Sigmoid", ["up"], ["g"]),
        helper.make_node(PRE_MIX, ["hn", "g"], ["pre_output"], domain=DOMAIN, num_branches=C,
                         reduction_scale=reduction_scale),
        helper.make_node("MatMul", ["hn", "inject_weight"], ["inject"]),
    ]
    x = "inject"
    inits = []
    if gate_div != 1.0:
        inits.append(helper.make_tensor("gate_div", elem, [], np.array([gate_div], dtype=dtype).tobytes(), raw=True))
        nodes.append(helper.make_node("Div", [x, "gate_div"], ["inject_div"]))
        x = "inject_div"
    nodes.append(helper.make_node("Sigmoid", [x], ["gate_sig" if gate_mul != 1.0 else "post_gate"]))
    if gate_mul != 1.0:
        inits.append(helper.make_tensor("gate_mul", elem, [], np.array([gate_mul], dtype=dtype).tobytes(), raw=True))
        nodes.append(helper.make_node("Mul", ["gate_sig", "gate_mul"], ["post_gate"]))
    outputs = [helper.make_tensor_value_info("pre_output", elem, [*lead, H]),
               helper.make_tensor_value_info("post_gate", elem, [*lead, C])]
    if prologue:
        nodes.append(helper.make_node("Identity", ["S"], ["streams_out"]))
        outputs.append(helper.make_tensor_value_info("streams_out", elem, [*lead, C * H]))
    outputs += [helper.make_tensor_value_info(n, elem, None) for n in expose]
    graph = helper.make_graph(nodes, "hc_stock_chain", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=IR_VERSION)


# stock single-node runs ----------------------------------------------------------------------


def make_node_model(op_type: str, inputs: dict[str, np.ndarray], domain: str = "", **attrs) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(next(iter(inputs.values())).dtype)
    node = helper.make_node(op_type, list(inputs), ["y"], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], f"stock_{op_type}",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=IR_VERSION)


def run_node(op_type: str, inputs: dict[str, np.ndarray], domain: str = "", **attrs) -> np.ndarray:
    """One stock node on onnxruntime's CPU provider (bfloat16 bound through its bits)."""
    return run_bound(cpu_session(make_node_model(op_type, inputs, domain, **attrs)), inputs)["y"]


def _ulp_of(x: np.ndarray) -> np.ndarray:
    """Spacing of T at |x| (as float64)."""
    return np.spacing(np.abs(x)).astype(np.float64)


def assert_within(stock: np.ndarray, ref: np.ndarray, bound: np.ndarray, what: str) -> int:
    """|stock - ref| <= bound elementwise; returns the max ulp distance for the report."""
    diff = np.abs(stock.astype(np.float64) - ref.astype(np.float64))
    bad = diff > bound
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.size} cells beyond the bound (shape {ref.shape}, dtype {ref.dtype}); "
        f"first at {tuple(np.argwhere(bad)[0])}: stock {stock[bad][0]!r}, reference {ref[bad][0]!r}, "
        f"bound {bound[bad][0]:.3g}")
    return max_ulp(stock, ref)


# the reference's own values, per test case ----------------------------------------------------

QWEN_ATTRS = QWEN_ATTRIBUTES
ODD_ATTRS = {"epsilon": 1e-3, "reduction_scale": 0.7, "silu_alpha": 1.7, "gate_div": 3.0, "gate_mul": 1.5}
CASES = [  # (C, H, R, rows, attrs)
    (4, 2560, 320, 4, QWEN_ATTRS),
    (4, 64, 16, 9, {}),
    (3, 33, 7, 5, ODD_ATTRS),
]
CASE_IDS = ["qwen", "small-defaults", "odd-attrs"]
SITE_REPORT: dict[tuple[str, str], int] = {}


def _case(dtype, C, H, R, rows, attrs, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((rows,), C, H, dtype, rng, prologue=True)}
    steps = reference.hc_lowrank_mix_steps(**feeds, num_branches=C, **attrs)
    return feeds, steps


def _record(dtype, site, ulp):
    key = (np.dtype(dtype).name, site)
    SITE_REPORT[key] = max(SITE_REPORT.get(key, 0), ulp)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("C", "H", "R", "rows", "attrs"), CASES, ids=CASE_IDS)
def test_contrib_ops_bitwise(dtype, C, H, R, rows, attrs):
    """PostMix, BranchwiseRMSNorm, ScaledSiLU (float16/bfloat16) and PreMix follow the contract exactly."""
    feeds, st = _case(dtype, C, H, R, rows, attrs)
    eps = attrs.get("epsilon", ATTRIBUTES["epsilon"])
    s = run_node(POST_MIX, {k: feeds[k] for k in ("streams", "prev_block_output", "prev_post_gate")}, DOMAIN,
                 num_branches=C)
    assert_bitwise_equal(s, st["S"], "S (HyperConnectionPostMix)")
    hn = run_node(BRANCH_NORM, {"S": st["S"], "norm_scale": feeds["norm_scale"]}, DOMAIN, num_branches=C, epsilon=eps)
    assert_bitwise_equal(hn, st["hn"], "hn (BranchwiseRMSNorm)")
    pre = run_node(PRE_MIX, {"hn": st["hn"], "g": st["g"]}, DOMAIN, num_branches=C,
                   reduction_scale=attrs.get("reduction_scale", 1.0))
    assert_bitwise_equal(pre, st["pre_output"], "pre_output (HyperConnectionPreMix)")
    if dtype != np.float32:  # in float32 its sigmoid is MLAS's (test_sigmoid_sites)
        hidden = run_node(SCALED_SILU, {"down": st["down"]}, DOMAIN, alpha=attrs.get("silu_alpha", 1.0))
        assert_bitwise_equal(hidden, st["hidden"], "hidden (ScaledSiLU)")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16], ids=["float32", "float16", "bfloat16"])
def test_oprun_matches_ort_contrib_ops(dtype):
    """tests/oprun.py's classes give ORT's bits for the forms the chain uses (ScaledSiLU: not float32;
    a norm scale of shape (H,), which the chain does not use, takes another path in ORT's float32
    kernel: up to 3 ulp apart)."""
    C, H, R, rows, attrs = CASES[2]
    feeds, st = _case(dtype, C, H, R, rows, attrs)
    nodes = [
        (POST_MIX, {k: feeds[k] for k in ("streams", "prev_block_output", "prev_post_gate")}, {"num_branches": C}),
        (BRANCH_NORM, {"S": st["S"], "norm_scale": feeds["norm_scale"]}, {"num_branches": C, "epsilon": 1e-3}),
        (PRE_MIX, {"hn": st["hn"], "g": st["g"]}, {"num_branches": C, "reduction_scale": 0.7}),
        (PRE_MIX, {"hn": st["hn"], "g": feeds["prev_post_gate"]}, {"num_branches": C}),
    ]
    if dtype != np.float32:
        nodes.append((SCALED_SILU, {"down": st["down"]}, {"alpha": 1.7}))
    for op_type, inputs, attrs in nodes:
        ev = ReferenceEvaluator(make_node_model(op_type, inputs, DOMAIN, **attrs), new_ops=CONTRIB_OPS)
        assert_bitwise_equal(ev.run(None, inputs)[0], run_node(op_type, inputs, DOMAIN, **attrs),
                             f"{op_type} {sorted(attrs)} (oprun vs onnxruntime)")


@pytest.mark.parametrize("prologue", [False, True])
def test_oprun_fused_node_is_the_reference(prologue, rng):
    C, H, R = 3, 8, 5
    feeds = {**random_weights(C, H, R, np.float16, rng), **random_activations((4,), C, H, np.float16, rng, prologue)}
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float16, prologue=prologue, streams_out=True, **ODD_ATTRS)
    got = ReferenceEvaluator(model, new_ops=CONTRIB_OPS).run(None, feeds)
    for name, a, b in zip(OUTPUTS, got, reference.hc_lowrank_mix(**feeds, num_branches=C, **ODD_ATTRS)):
        assert_bitwise_equal(a, b, name)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize(("C", "H", "R", "rows", "attrs"), CASES, ids=CASE_IDS)
def test_matmul_sites(dtype, C, H, R, rows, attrs):
    """down, inject, up: within the order-independent summation bound (module docstring)."""
    feeds, st = _case(dtype, C, H, R, rows, attrs)
    for site, x, w in (("down", st["hn"], feeds["down_weight"]), ("inject", st["hn"], feeds["inject_weight"]),
                       ("up", st["hidden"], feeds["up_weight"])):
        stock = run_node("MatMul", {"x": x, "w": w})
        k = x.shape[-1]
        bound = (2 * (k + 1) * 2.0**-24 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)))
                 + _ulp_of(np.maximum(np.abs(stock), np.abs(st[site]))))
        _record(dtype, site, assert_within(stock, st[site], bound, f"{site} (MatMul, K={k})"))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize(("C", "H", "R", "rows", "attrs"), CASES, ids=CASE_IDS)
def test_sigmoid_sites(dtype, C, H, R, rows, attrs):
    """g, hidden (float32) and the post_gate tail: MLAS logistic error; the gate logit (Div) and the
    product (Mul) round as the contract does."""
    feeds, st = _case(dtype, C, H, R, rows, attrs)
    g = run_node("Sigmoid", {"up": st["up"]})
    _record(dtype, "g", assert_within(g, st["g"], LOGISTIC_ABS_ERR + _ulp_of(st["g"]), "g (Sigmoid)"))

    z = st["Z"].astype(np.float64)
    hidden = run_node(SCALED_SILU, {"down": st["down"]}, DOMAIN, alpha=attrs.get("silu_alpha", 1.0))
    _record(dtype, "hidden", assert_within(hidden, st["hidden"], np.abs(z) * LOGISTIC_ABS_ERR + _ulp_of(st["hidden"]),
                                           "hidden (ScaledSiLU)"))

    gate_div, gate_mul = attrs.get("gate_div", 1.0), attrs.get("gate_mul", 1.0)
    logit = st["inject"]
    if gate_div != 1.0:
        logit = run_node("Div", {"inject": logit, "gate_div": np.array(gate_div, dtype=dtype)})
        want = reference.round_to(st["inject"].astype(np.float32) / np.float32(gate_div), dtype)
        assert_bitwise_equal(logit, want.astype(dtype), "gate logit (Div)")
    contract_sigmoid = reference.sigmoid_f32(logit).astype(dtype)
    sigmoid = run_node("Sigmoid", {"x": logit})
    gate, contract_gate = sigmoid, contract_sigmoid
    if gate_mul != 1.0:
        gate = run_node("Mul", {"gate": sigmoid, "gate_mul": np.array(gate_mul, dtype=dtype)})
        contract_gate = run_node("Mul", {"gate": contract_sigmoid, "gate_mul": np.array(gate_mul, dtype=dtype)})
    assert_bitwise_equal(contract_gate, st["post_gate"], "post_gate: stock Mul of the contract's sigmoid")
    bound = abs(gate_mul) * (LOGISTIC_ABS_ERR + _ulp_of(contract_sigmoid)) + _ulp_of(st["post_gate"])
    _record(dtype, "post_gate tail", assert_within(gate, st["post_gate"], bound, "post_gate (Div, Sigmoid, Mul)"))


E2E_ROW_ULPS = {"float32": 64, "float16": 4}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("prologue", [False, True], ids=["no-prologue", "prologue"])
@pytest.mark.parametrize(("C", "H", "R", "rows", "attrs"), CASES, ids=CASE_IDS)
def test_stock_chain_end_to_end(dtype, prologue, C, H, R, rows, attrs):
    rng = np.random.default_rng(1)
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((rows,), C, H, dtype, rng, prologue)}
    stock = run_stock(make_stock_chain(C=C, H=H, R=R, dtype=dtype, prologue=prologue, expose=(), **attrs), feeds)
    ref = dict(zip(OUTPUTS, reference.hc_lowrank_mix(**feeds, num_branches=C, **attrs)))
    if prologue:
        assert_bitwise_equal(stock["streams_out"], ref["streams_out"], "streams_out (S)")
    name = np.dtype(dtype).name
    for out in ("pre_output", "post_gate"):
        a, b = stock[out].astype(np.float64), ref[out].astype(np.float64)
        row_ulp = np.spacing(np.abs(ref[out]).max(axis=-1, keepdims=True)).astype(np.float64)
        row_ulps = float((np.abs(a - b) / row_ulp).max())
        _record(dtype, f"{out} end-to-end (element ulp)", max_ulp(stock[out], ref[out]))
        _record(dtype, f"{out} end-to-end (row ulp)", int(np.ceil(row_ulps)))
        assert row_ulps <= E2E_ROW_ULPS[name], (
            f"{out}: stock chain vs reference differ by {row_ulps:.1f} ulps of the row's largest value "
            f"(bound {E2E_ROW_ULPS[name]}); shape {ref[out].shape}, dtype {name}, rows {rows}")


def test_report_measured_ulps(capsys):
    """Prints the largest differences seen by the tests above (run with -s, or read the captured output)."""
    with capsys.disabled():
        for (dtype, site), ulp in sorted(SITE_REPORT.items()):
            print(f"\n  stock vs reference, {dtype:8s} {site:36s} max {ulp} ulp", end="")
        print()


# the reference on its own ---------------------------------------------------------------------


@pytest.mark.parametrize("lead", [(0,), (), (3,), (2, 3), (2, 0, 3), (1, 2, 1, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16], ids=["float32", "float16", "bfloat16"])
def test_reference_shapes_and_dtypes(lead, dtype, rng):
    C, H, R = 2, 5, 3
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations(lead, C, H, dtype, rng, prologue=True)}
    pre, gate, s = reference.hc_lowrank_mix(**feeds, num_branches=C)
    assert (pre.shape, gate.shape, s.shape) == ((*lead, H), (*lead, C), (*lead, C * H))
    assert pre.dtype == gate.dtype == s.dtype == np.dtype(dtype)


def test_reference_rows_independent(rng):
    C, H, R = 3, 7, 5
    feeds = {**random_weights(C, H, R, np.float16, rng), **random_activations((6,), C, H, np.float16, rng, True)}
    batch = reference.hc_lowrank_mix(**feeds, num_branches=C)
    for r in range(6):
        one = {k: (v[r : r + 1] if k in ("streams", "prev_block_output", "prev_post_gate") else v) for k, v in feeds.items()}
        for got, want in zip(reference.hc_lowrank_mix(**one, num_branches=C), batch):
            assert_bitwise_equal(got[0], want[r], f"row {r}")


@pytest.mark.parametrize(("change", "match"), [
    ({"norm_scale": np.ones(9, np.float32)}, r"norm_scale must be \(C\*H,\) = \(10,\); got \(9,\)"),
    ({"down_weight": np.ones((10, 3, 1), np.float32)}, r"down_weight must be \(C\*H, R\)"),
    ({"down_weight": np.ones((10, 0), np.float32)}, r"down_weight .* R >= 1"),
    ({"up_weight": np.ones((3, 9), np.float32)}, r"up_weight must be \(R, C\*H\) = \(3, 10\)"),
    ({"inject_weight": np.ones((10, 3), np.float32)}, r"inject_weight must be \(C\*H, C\) = \(10, 2\)"),
    ({"streams": np.ones((4, 9), np.float32)}, r"the last dim of streams \(C\*H = 9\) must be a positive multiple of num_branches = 2"),
    ({"streams": np.float32(1.0)}, r"streams must have rank >= 1"),
    ({"prev_block_output": np.ones((4, 5), np.float32)}, r"got only prev_block_output"),
    ({"norm_scale": None}, r"required input\(s\) norm_scale missing"),
    ({"streams": None}, r"required input\(s\) streams missing"),
    ({"prev_block_output": np.ones((4, 5), np.float32), "prev_post_gate": np.ones((1, 2), np.float32)},
     r"prev_post_gate must be \(\.\.\., C\) = \(4, 2\); got \(1, 2\)"),
    ({"prev_block_output": np.ones((4, 6), np.float32), "prev_post_gate": np.ones((4, 2), np.float32)},
     r"prev_block_output must be \(\.\.\., H\) = \(4, 5\)"),
])
def test_reference_rejects_bad_shapes(change, match, rng):
    feeds = {**random_weights(2, 5, 3, np.float32, rng), "streams": np.ones((4, 10), np.float32), **change}
    with pytest.raises(ValueError, match="^HyperConnectionLowRankMix: (.*; )?" + match):
        reference.hc_lowrank_mix(**feeds, num_branches=2)


def test_reference_rejects_mixed_dtypes_and_bad_num_branches(rng):
    feeds = {**random_weights(2, 5, 3, np.float32, rng), "streams": np.ones((4, 10), np.float16)}
    with pytest.raises(TypeError, match="norm_scale must have the dtype of streams"):
        reference.hc_lowrank_mix(**feeds, num_branches=2)
    feeds["streams"] = feeds["streams"].astype(np.float32)
    with pytest.raises(ValueError, match="num_branches must be a positive integer; got 0"):
        reference.hc_lowrank_mix(**feeds, num_branches=0)
