"""hcfuse.reference_nbits against onnxruntime's own MatMulNBits and MatMulNBitsQuantizer, and against the dense
reference.

- quantize_nbits writes what MatMulNBitsQuantizer writes into a quantized model (bytes, shapes, types).
- dequantize is MatMulNBits' weight: a CPU session's MatMulNBits (accuracy_level 0, float32 A) fed the identity
  returns its dequantized weight, every product 1 * w or 0 * w and every sum exact, so the two must be
  bitwise equal (but for the sign of a zero weight: the sum 0 + -0 is +0, so -0 is compared as +0). B, scales
  and zero points are random bytes and values (every nibble, padding included). With zero points of T it
  computes the weight differently (see the test).
- the quantized op's reference is the dense reference run on the dequantized weights, with a quantized projection's
  sums in lane order (matmul_lanes_f32, itself checked against its definition): with weights that T holds exactly
  (power-of-two scales), the dense reference's steps fed them as T weights give the same bits.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hcfuse import _op_nbits, reference
from hcfuse._op import IR_VERSION, ONNX_OPSET
from hcfuse.checking._session import CPU, inference_session
from hcfuse.models.nbits import quantize_nbits
from hcfuse.reference_nbits import (
    LANES,
    dequantize,
    hc_lowrank_mix_nbits,
    hc_lowrank_mix_nbits_steps,
    matmul_lanes_f32,
    unpack_nbits,
    unpack_zero_points,
)
from tests._compare import assert_bitwise_equal

MS = "com.microsoft"


def _matmul_nbits_model(K: int, N: int, bits: int, block_size: int, B, scales, zero_points) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["A", "B", "scales"]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "zero_points"))
        inputs.append("zero_points")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain=MS, K=K, N=N, bits=bits, block_size=block_size,
                            accuracy_level=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(MS, 1)],
                             ir_version=IR_VERSION)


def _sum_view(w: np.ndarray) -> np.ndarray:
    """w as a sum of products returns it: -0 as +0."""
    return w + np.float32(0.0)


def _ort_weight(K, N, bits, block_size, B, scales, zero_points) -> np.ndarray:
    """MatMulNBits' weight as onnxruntime computes it: identity @ W."""
    session = inference_session(_matmul_nbits_model(K, N, bits, block_size, B, scales, zero_points), [CPU])
    return session.run(None, {"A": np.eye(K, dtype=np.float32)})[0]


def _random_nbits(rng, K, N, bits, block_size, zp_form, dtype=np.float32):
    """Random B bytes, scales and zero points of MatMulNBits' shapes (zp_form None, "packed" or "T")."""
    nkb = _op_nbits.k_blocks(K, block_size)
    B = rng.integers(0, 256, (N, nkb, _op_nbits.blob_size(bits, block_size)), dtype=np.uint8)
    scales = (rng.standard_normal((N, nkb)) * 0.1).astype(dtype)
    if zp_form == "packed":
        zp = rng.integers(0, 256, (N, _op_nbits.packed_zero_point_cols(nkb, bits)), dtype=np.uint8)
    elif zp_form == "T":
        zp = rng.integers(0, 1 << bits, (N, nkb)).astype(dtype)
    else:
        zp = None
    return B, scales, zp


# ---- packing -------------------------------------------------------------------------------------------


def test_unpack_nbits_follows_the_definition():
    """Element (k, n): block k // block_size, position i; bits 4: byte i // 2, low nibble for even i."""
    block_size, K = 16, 20
    B = np.zeros((1, 2, 8), dtype=np.uint8)
    B[0, 0, 0] = 0x21  # k = 0 -> 1 (low), k = 1 -> 2 (high)
    B[0, 1, 1] = 0x43  # block 1, i = 2 -> 3, i = 3 -> 4: k = 18, 19
    B[0, 1, 2] = 0xFF  # i = 4, 5: k = 20, 21 are padding
    q = unpack_nbits(B, 4, block_size, K)
    expected = np.zeros((K, 1), dtype=np.uint8)
    expected[[0, 1, 18, 19], 0] = [1, 2, 3, 4]
    np.testing.assert_array_equal(q, expected)
    B8 = np.arange(2 * 16, dtype=np.uint8).reshape(1, 2, 16)
    np.testing.assert_array_equal(unpack_nbits(B8, 8, 16, 20)[:, 0], np.arange(20))


def test_dequantize_default_zero_point_and_packed_zero_points():
    B = np.full((1, 3, 8), 0x99, dtype=np.uint8)  # every q = 9
    scales = np.array([[1.0, 2.0, 4.0]], dtype=np.float16)
    w = dequantize(B, scales, None, 4, 16, 40)  # zero point 8
    np.testing.assert_array_equal(w[:, 0], np.repeat([1.0, 2.0, 4.0], 16)[:40])
    zp = np.array([[0x21, 0x03]], dtype=np.uint8)  # blocks 0, 1, 2 -> 1, 2, 3
    w = dequantize(B, scales, zp, 4, 16, 40)
    np.testing.assert_array_equal(w[:, 0], np.repeat([8.0, 14.0, 24.0], 16)[:40])
    assert w.dtype == np.float32


# ---- against onnxruntime -------------------------------------------------------------------------------


@pytest.mark.parametrize("zp_form", [None, "packed"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block_size,K", [(16, 16), (16, 70), (32, 100), (64, 64), (64, 200), (128, 130)])
def test_dequantize_matches_onnxruntime_matmul_nbits(rng, bits, block_size, K, zp_form):
    N = 6
    B, scales, zp = _random_nbits(rng, K, N, bits, block_size, zp_form)
    expected = _ort_weight(K, N, bits, block_size, B, scales, zp)
    assert_bitwise_equal(_sum_view(dequantize(B, scales, zp, bits, block_size, K)), expected, "dequantized weight")


@pytest.mark.parametrize("fractional", [False, True], ids=["integer", "fractional"])
@pytest.mark.parametrize("block_size,K", [(16, 70), (32, 100), (128, 130)])
def test_dequantize_with_float_zero_points_against_onnxruntime(rng, block_size, K, fractional):
    """With zero points of T, onnxruntime's CPU MatMulNBits computes q * scale - zp * scale (three fp32
    roundings), the definition (q - zp) * scale (one, when q - zp is exact). With float32 scales the two differ
    by at most an ulp of each product, |q * scale| and |zp * scale|, plus the result's; with 16-bit scales and
    zero points both products are exact and the two agree bit for bit. (onnxruntime's CPU MatMulNBits takes
    zero points of T with 4 bits only.)"""
    N, bits = 6, 4
    B, scales, zp = _random_nbits(rng, K, N, bits, block_size, "T")
    if fractional:
        zp = (rng.random(scales.shape) * ((1 << bits) - 1)).astype(np.float32)
    expected = _ort_weight(K, N, bits, block_size, B, scales, zp)
    got = _sum_view(dequantize(B, scales, zp, bits, block_size, K))
    block = np.arange(K) // block_size
    q = unpack_nbits(B, bits, block_size, K).astype(np.float32)
    qs, zs = q * scales.T[block], zp.T[block] * scales.T[block]
    assert_bitwise_equal(_sum_view(qs - zs), expected, "q * scale - zp * scale")
    bound = np.spacing(np.abs(qs)) + np.spacing(np.abs(zs)) + np.spacing(np.abs(got))
    assert (np.abs(got - expected) <= bound).all()
    assert (got != expected).any(), "float32 scales and zero points should show onnxruntime's other rounding"
    # the same weights with 16-bit scales and zero points: the products are exact, so the forms agree
    s16, z16 = (x.astype(np.float16).astype(np.float32).T[block] for x in (scales, zp))
    assert_bitwise_equal(_sum_view(dequantize(B, scales.astype(np.float16), zp.astype(np.float16), bits,
                                              block_size, K)),
                         _sum_view(q * s16 - z16 * s16), "dequantized weight, 16-bit scales and zero points")


def _quantize_with_onnxruntime(W: np.ndarray, bits: int, block_size: int, symmetric: bool) -> dict[str, np.ndarray]:
    """MatMulNBitsQuantizer run over a one-MatMul model; the MatMulNBits node's inputs by role."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    dtype = helper.np_dtype_to_tensor_dtype(W.dtype)
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["Y"])], "g",
                              [helper.make_tensor_value_info("A", dtype, ["M", W.shape[0]])],
                              [helper.make_tensor_value_info("Y", dtype, ["M", W.shape[1]])],
                              [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], ir_version=IR_VERSION)
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=symmetric)
    quantizer.process()
    out = quantizer.model.model
    (node,) = out.graph.node
    assert node.op_type == "MatMulNBits" and node.domain == MS
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]) == (*W.shape, bits, block_size)
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    return dict(zip(("B", "scales", "zero_points"), (inits[name] for name in node.input[1:])))


def _assert_same_array(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert (got.dtype, got.shape) == (expected.dtype, expected.shape), what
    assert got.tobytes() == expected.tobytes(), f"{what}: bytes differ"


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits,block_size,K", [(4, 32, 64), (4, 16, 70), (8, 32, 100), (4, 128, 130)])
def test_quantize_nbits_writes_what_matmul_nbits_quantizer_writes(rng, bits, block_size, K, symmetric, dtype):
    W = rng.standard_normal((K, 12)).astype(dtype)
    expected = _quantize_with_onnxruntime(W, bits, block_size, symmetric)
    got = quantize_nbits(W, bits, block_size, symmetric)
    assert (got.K, got.N, got.bits, got.block_size) == (K, 12, bits, block_size)
    _assert_same_array(got.B, expected["B"], "B")
    _assert_same_array(got.scales, expected["scales"], "scales")
    if symmetric:
        assert "zero_points" not in expected and got.zero_points is None
    else:
        _assert_same_array(got.zero_points, expected["zero_points"], "zero_points")


@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_nbits_zero_point_forms_dequantize_alike(rng, bits):
    """Absent, packed and T zero points of one quantization are the same weight (and close to W)."""
    W = rng.standard_normal((70, 9)).astype(np.float32)
    weights = {}
    for symmetric, zp_form in ((True, None), (True, "packed"), (True, "T"), (False, "packed"), (False, "T")):
        q = quantize_nbits(W, bits, 16, symmetric, zp_form)
        weights[symmetric, zp_form] = dequantize(q.B, q.scales, q.zero_points, bits, 16, 70)
    for symmetric in (True, False):
        forms = [w for (s, _), w in weights.items() if s == symmetric]
        for w in forms[1:]:
            assert_bitwise_equal(w, forms[0], "dequantized weight")
        step = np.abs(W).max() / (1 << (bits - 1)) * (1.0 if symmetric else 0.5)
        assert np.abs(forms[0] - W).max() <= step


def test_quantize_nbits_rejects_bad_arguments():
    W = np.zeros((32, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="bits must be one of 4, 8; got 2"):
        quantize_nbits(W, bits=2)
    with pytest.raises(ValueError, match="block_size must be a power of two >= 16; got 24"):
        quantize_nbits(W, block_size=24)
    with pytest.raises(ValueError, match="zp_form must be"):
        quantize_nbits(W, zp_form="int")


# ---- against the dense reference ------------------------------------------------------------------------

C, H, R = 2, 16, 8
BF16 = np.dtype(ml_dtypes.bfloat16)


def _exact_nbits(rng, K, N, bits, block_size, zp_form, dtype):
    """Random quantized weight whose dequantized values T holds exactly: power-of-two scales."""
    B, _, zp = _random_nbits(rng, K, N, bits, block_size, zp_form, dtype)
    scales = (2.0 ** rng.integers(-8, -3, (N, _op_nbits.k_blocks(K, block_size)))).astype(dtype)
    return B, scales, zp


def _case(rng, dtype, quantized, zp_form, prologue, lead=(2, 3), bits=4, block_size=16):
    """Inputs of the quantized op (keyword names) and the dense op's equivalent T weights."""
    CH = C * H
    inputs = {"streams": rng.standard_normal((*lead, CH)).astype(dtype),
              "norm_scale": (1 + 0.1 * rng.standard_normal(CH)).astype(dtype)}
    dense = {}
    for proj, K, N in ((_op_nbits.DOWN_INJECT, CH, R + C), (_op_nbits.UP, R, CH)):
        names = [_op_nbits.INPUTS[i] for i in (proj.weight, proj.scales, proj.zero_points)]
        if proj.name in quantized:
            B, scales, zp = _exact_nbits(rng, K, N, bits, block_size, zp_form, dtype)
            inputs.update(zip(names, (B, scales, zp)))
            w = dequantize(B, scales, zp, bits, block_size, K)
            assert_bitwise_equal(w.astype(dtype).astype(np.float32), w, f"{proj.name} weight held by T")
        else:
            w = (0.1 * rng.standard_normal((K, N))).astype(dtype).astype(np.float32)
            inputs[names[0]] = w.astype(dtype)
        dense[proj.name] = w.astype(dtype)
    if prologue:
        inputs["prev_block_output"] = rng.standard_normal((*lead, H)).astype(dtype)
        inputs["prev_post_gate"] = rng.random((*lead, C)).astype(dtype)
    return inputs, dense


def _dense_steps(inputs, dense, quantized, attrs) -> dict:
    """The dense op's steps on the dense equivalent weights, with the quantized projections' sums in lane order."""
    prologue = None
    if "prev_block_output" in inputs:
        prologue = (inputs["prev_block_output"], inputs["prev_post_gate"])
    orders = {name: matmul_lanes_f32 if name in quantized else reference.matmul_seq_f32 for name in ("down_inject", "up")}
    return reference.steps_f32_weights(inputs["streams"], inputs["norm_scale"], dense["down_inject"].astype(np.float32),
                                       dense["up"].astype(np.float32), prologue, **attrs,
                                       down_inject_matmul=orders["down_inject"], up_matmul=orders["up"])


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("quantized", [("down_inject", "up"), ("down_inject",), ("up",)], ids="+".join)
@pytest.mark.parametrize("zp_form", [None, "packed", "T"])
@pytest.mark.parametrize("prologue", [False, True])
def test_reference_is_the_dense_reference_on_the_dequantized_weights(rng, dtype, quantized, zp_form, prologue):
    """Every step is the dense op's on the dequantized weights; only a quantized projection's sums run in lane
    order (a dense one's keep the dense order, which the dense op's own reference gives)."""
    inputs, dense = _case(rng, dtype, quantized, zp_form, prologue)
    attrs = {"num_branches": C, "epsilon": 1e-6, "reduction_scale": 0.25, "silu_alpha": 0.25, "gate_div": 4.0,
             "gate_mul": 2.0}
    got = hc_lowrank_mix_nbits_steps(**inputs, **attrs, bits=4, block_size=16, accuracy_level=4)
    expected = _dense_steps(inputs, dense, quantized, attrs)
    assert got.keys() == expected.keys()
    for name in expected:
        assert_bitwise_equal(got[name], expected[name], name)
    outputs = hc_lowrank_mix_nbits(**inputs, **attrs, bits=4, block_size=16)
    for out, name in zip(outputs, ("pre_output", "post_gate", "S")):
        assert_bitwise_equal(out, expected[name], name)
    # the steps before the first quantized projection are the dense op's reference's, bit for bit
    di = dense["down_inject"]
    dense_op = reference.hc_lowrank_mix_steps(
        inputs["streams"], inputs["norm_scale"], di[:, :R], dense["up"], di[:, R:],
        inputs.get("prev_block_output"), inputs.get("prev_post_gate"), **attrs)
    same = ("S", "hn") if "down_inject" in quantized else ("S", "hn", "down", "Z", "SG", "hidden", "inject", "post_gate")
    for name in same:
        assert_bitwise_equal(got[name], dense_op[name], name)


@pytest.mark.parametrize("bits,block_size", [(8, 16), (4, 64), (8, 128)])
def test_reference_with_8_bits_and_wide_blocks(rng, bits, block_size):
    inputs, dense = _case(rng, np.dtype(np.float16), ("down_inject", "up"), "packed", False, lead=(5,),
                          bits=bits, block_size=block_size)
    got = hc_lowrank_mix_nbits(**inputs, num_branches=C, bits=bits, block_size=block_size)
    defaults = {name: _op_nbits.ATTRIBUTES[name] for name in _op_nbits.FLOAT_ATTRIBUTES}
    expected = _dense_steps(inputs, dense, ("down_inject", "up"), {"num_branches": C, **defaults})
    for a, name in zip(got, ("pre_output", "post_gate", "S")):
        assert_bitwise_equal(a, expected[name], name)


def _lane_order_by_definition(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """matmul_lanes_f32 element by element, in fp32 scalars: lane j sums k = j (mod 32) in ascending k, then
    u[l] = s[2l] + s[2l+1] and halving."""
    f32 = np.float32
    out = np.zeros((x.shape[0], w.shape[1]), dtype=f32)
    for r in range(x.shape[0]):
        for n in range(w.shape[1]):
            s = [f32(0.0)] * LANES
            for k in range(x.shape[1]):
                s[k % LANES] = f32(s[k % LANES] + f32(x[r, k] * w[k, n]))
            u = [f32(s[2 * i] + s[2 * i + 1]) for i in range(LANES // 2)]
            while len(u) > 1:
                half = len(u) // 2
                u = [f32(u[i] + u[i + half]) for i in range(half)]
            out[r, n] = u[0]
    return out


@pytest.mark.parametrize("K", [1, 5, 16, 31, 32, 33, 70, 96])
def test_lane_order_follows_its_definition(rng, K, monkeypatch):
    """In row chunks too (a small chunk size makes three of them)."""
    import hcfuse.reference_nbits as reference_nbits

    x = rng.standard_normal((5, K)).astype(np.float32)
    w = rng.standard_normal((K, 3)).astype(np.float32)
    expected = _lane_order_by_definition(x, w)
    assert_bitwise_equal(matmul_lanes_f32(x, w), expected, "lane order")
    monkeypatch.setattr(reference_nbits, "_MATMUL_CHUNK_FLOATS", 2 * LANES * 3)
    assert_bitwise_equal(matmul_lanes_f32(x, w), expected, "lane order, rows in chunks")


def test_lane_order_differs_from_the_dense_order(rng):
    """The orders are different sums (a check that the quantized op's does not silently fall back to the other)."""
    x = rng.standard_normal((8, 300)).astype(np.float32)
    w = rng.standard_normal((300, 16)).astype(np.float32)
    assert (matmul_lanes_f32(x, w) != reference.matmul_seq_f32(x, w)).any()


def test_reference_zero_rows(rng):
    inputs, _ = _case(rng, np.dtype(np.float16), ("down_inject", "up"), None, True, lead=(0, 3))
    pre, gate, out = hc_lowrank_mix_nbits(**inputs, num_branches=C, block_size=16)
    assert pre.shape == (0, 3, H) and gate.shape == (0, 3, C) and out.shape == (0, 3, C * H)


# ---- input validation -------------------------------------------------------------------------------------


def _bad(inputs, **changes):
    return {**inputs, **changes}


@pytest.mark.parametrize("mutate,error,match", [
    (lambda x: _bad(x, up_weight=None), ValueError, r"required input\(s\) up_weight missing"),
    (lambda x: _bad(x, streams=x["streams"].astype(np.int32)), TypeError, "streams must be float32"),
    (lambda x: _bad(x, norm_scale=x["norm_scale"][:-1]), ValueError, r"norm_scale must be \(C\*H,\) = \(32,\)"),
    (lambda x: _bad(x, down_inject_weight=x["down_inject_weight"].astype(np.int8)), TypeError,
     "down_inject_weight must be uint8 .quantized. or the dtype of streams"),
    (lambda x: _bad(x, down_inject_weight=x["down_inject_weight"][:, :1]), ValueError,
     r"down_inject_weight must be uint8 \(N, k_blocks, blob_size\) = \(10, 2, 8\)"),
    (lambda x: _bad(x, down_inject_weight=x["down_inject_weight"][:2]), ValueError,
     r"quantized down_inject_weight must be uint8 \(R\+C, k_blocks, blob_size\) with R >= 1"),
    (lambda x: _bad(x, down_inject_scales=None), ValueError,
     "down_inject_scales is required with a quantized .uint8. down_inject_weight"),
    (lambda x: _bad(x, up_scales=x["up_scales"].astype(np.float32)), TypeError,
     r"up_scales must have the dtype of streams \(float16\); got float32"),
    (lambda x: _bad(x, up_scales=x["up_scales"][:, :0]), ValueError, r"up_scales must be \(N, k_blocks\) = \(32, 1\)"),
    (lambda x: _bad(x, up_weight=x["up_weight"][:, :, :4]), ValueError,
     r"up_weight must be uint8 \(N, k_blocks, blob_size\) = \(32, 1, 8\) \(K = R = 8, N = C\*H = 32, bits 4"),
    (lambda x: _bad(x, down_inject_zero_points=np.zeros((10, 2), np.uint8)), ValueError,
     r"packed uint8 down_inject_zero_points must be \(N, ceil\(k_blocks\*bits/8\)\) = \(10, 1\)"),
    (lambda x: _bad(x, down_inject_zero_points=np.zeros((10, 1), np.float16)), ValueError,
     r"down_inject_zero_points of T must be \(N, k_blocks\) = \(10, 2\)"),
    (lambda x: _bad(x, up_zero_points=np.zeros((32, 1), np.int32)), TypeError,
     "up_zero_points must be uint8 .packed. or the dtype of streams"),
    (lambda x: _bad(x, prev_post_gate=None), ValueError, "given together or not at all; got only prev_block_output"),
    (lambda x: _bad(x, prev_block_output=x["prev_block_output"][..., :-1]), ValueError,
     r"prev_block_output must be \(..., H\) = \(2, 3, 16\)"),
    (lambda x: _bad(x, prev_post_gate=x["prev_post_gate"].astype(np.float32)), TypeError,
     "prev_post_gate must have the dtype of streams"),
])
def test_reference_rejects_bad_inputs(rng, mutate, error, match):
    inputs, _ = _case(rng, np.dtype(np.float16), ("down_inject", "up"), None, True)
    with pytest.raises(error, match=match):
        hc_lowrank_mix_nbits(**mutate(inputs), num_branches=C, block_size=16)


def test_reference_rejects_bad_forms(rng):
    inputs, dense = _case(rng, np.dtype(np.float16), ("up",), None, False)
    op = _op_nbits.OP_TYPE
    with pytest.raises(ValueError, match=f"{op}: down_inject_scales is given but down_inject_weight is dense"):
        hc_lowrank_mix_nbits(**_bad(inputs, down_inject_scales=inputs["up_scales"]), num_branches=C, block_size=16)
    with pytest.raises(ValueError, match="down_inject_weight or up_weight must be quantized"):
        hc_lowrank_mix_nbits(**_bad(inputs, up_weight=dense["up"], up_scales=None), num_branches=C, block_size=16)
    with pytest.raises(ValueError, match=r"up_weight must be uint8 \(N, k_blocks, blob_size\) = \(32, 2, 8\) "
                                         r"\(K = R = 24"):
        hc_lowrank_mix_nbits(**_bad(inputs, down_inject_weight=np.zeros((C * H, 24 + C), np.float16)),
                             num_branches=C, block_size=16)
    with pytest.raises(ValueError, match="attribute bits must be one of 4, 8; got 2"):
        hc_lowrank_mix_nbits(**inputs, num_branches=C, bits=2, block_size=16)
    with pytest.raises(ValueError, match="attribute block_size must be a power of two >= 16; got 8"):
        hc_lowrank_mix_nbits(**inputs, num_branches=C, block_size=8)
    with pytest.raises(ValueError, match="num_branches must be a positive integer"):
        hc_lowrank_mix_nbits(**inputs, num_branches=0, block_size=16)


# ---- the numerics docs/QUANTIZED.md states ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp_form", [None, "packed", "T"])
def test_weight_is_exact_with_16_bit_scales_and_integer_zero_points(rng, dtype, bits, zp_form):
    q = quantize_nbits(rng.standard_normal((96, 16)).astype(dtype), bits, 32, zp_form is None, zp_form)
    w = dequantize(q.B, q.scales, q.zero_points, bits, 32, 96)
    zp = q.zero_points
    if zp is None:
        zp = np.full(q.scales.shape, 1 << (bits - 1))
    elif zp.dtype == np.uint8:
        zp = unpack_zero_points(zp, bits, q.scales.shape[1])
    block = np.arange(96) // 32
    exact = (unpack_nbits(q.B, bits, 32, 96) - zp.astype(np.float64).T[block]) * q.scales.astype(np.float64).T[block]
    np.testing.assert_array_equal(w.astype(np.float64), exact)


@pytest.mark.parametrize("dtype,exact", [(BF16, True), (np.dtype(np.float16), False), (np.dtype(np.float32), False)],
                         ids=["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("bits", [4, 8])
def test_which_products_are_exact_in_fp32(rng, dtype, exact, bits):
    """bfloat16 activations times weights of bfloat16 scales and integer zero points fit fp32's 24 bits; float16
    and float32 ones do not (so fused multiply-adds change their bits)."""
    q = quantize_nbits(rng.standard_normal((256, 64)).astype(dtype), bits, 32, symmetric=False)
    w = dequantize(q.B, q.scales, q.zero_points, bits, 32, 256).astype(np.float64)
    a = rng.standard_normal((256, 64)).astype(dtype).astype(np.float64)
    assert bool(((a * w).astype(np.float32) == a * w).all()) is exact
