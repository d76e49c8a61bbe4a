"""The CPU kernel of ai.hcfuse::HyperConnectionLowRankMixNBits inside onnxruntime sessions against
hcfuse.reference_nbits.

The kernel dequantizes each weight as the reference does ((q - zero_point) * scale, one fp32 subtraction
and one fp32 multiplication) and keeps the reference's order with a separately rounded multiply and add
in every product (no FMA: a T activation times an fp32 weight is not exact in fp32), so every output is
bitwise equal to the reference for every T, form, row count and thread count. Random weights here are
random bytes (padding nibbles of a last partial block included, which must never reach a result),
random scales and random zero points; one case takes onnxruntime's own quantizer's output at the real
shape.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from hcfuse import _op_nbits
from hcfuse._op import IR_VERSION, ONNX_OPSET, QWEN_ATTRIBUTES, QWEN_SHAPE
from hcfuse.models.hc_block import random_activations, random_weights
from hcfuse.models.nbits import quantize_nbits
from hcfuse.reference_nbits import hc_lowrank_mix_nbits
from tests._compare import BFLOAT16, assert_bitwise_equal, run_bound

DTYPES = [np.float32, np.float16, BFLOAT16]
DTYPE_IDS = ["float32", "float16", "bfloat16"]
ZP_FORMS = ["none", "packed", "T"]
QUANTIZED = {"both": ("down_inject", "up"), "down_inject": ("down_inject",), "up": ("up",)}
ODD_ATTRS = {"epsilon": 1e-3, "reduction_scale": 0.7, "silu_alpha": 1.7, "gate_div": 3.0, "gate_mul": 1.5}
ACTIVATIONS = ("streams", "prev_block_output", "prev_post_gate")


def random_projection(K: int, N: int, std: float, dtype, rng, *, bits: int, block_size: int, zp: str) -> dict:
    """A quantized [K, N] projection as MatMulNBits takes it: random bytes for B (every value, padding
    included), scales giving weights of about `std`, zero points in form zp ("none", "packed" uint8, "T":
    for float32 not integers, so (q - zp) rounds)."""
    kb = _op_nbits.k_blocks(K, block_size)
    out = {"B": rng.integers(0, 256, (N, kb, _op_nbits.blob_size(bits, block_size)), dtype=np.uint8)}
    spread = (1 << bits) / np.sqrt(12.0)  # std of q - zp over uniform q
    out["scales"] = (std / spread * (1.0 + 0.2 * rng.standard_normal((N, kb)))).astype(dtype)
    if zp == "packed":
        out["zero_points"] = rng.integers(0, 256, (N, _op_nbits.packed_zero_point_cols(kb, bits)), dtype=np.uint8)
    elif zp == "T":
        values = rng.integers(0, 1 << bits, (N, kb)).astype(np.float32)
        if np.dtype(dtype) == np.float32:
            values += rng.uniform(-0.5, 0.5, (N, kb)).astype(np.float32)
        out["zero_points"] = values.astype(dtype)
    return out


def random_nbits_inputs(C, H, R, dtype, rng, *, quantized=("down_inject", "up"), bits=4, block_size=32, zp="none",
                        lead=(3,), prologue=False) -> dict[str, np.ndarray]:
    """Every input of the op keyed by name (absent optional ones left out)."""
    dense = random_weights(C, H, R, dtype, rng)
    feeds = {"norm_scale": dense["norm_scale"]}
    matrices = {_op_nbits.DOWN_INJECT: np.concatenate([dense["down_weight"], dense["inject_weight"]], axis=1),
                _op_nbits.UP: dense["up_weight"]}
    stds = {_op_nbits.DOWN_INJECT: 1.0 / np.sqrt(C * H), _op_nbits.UP: 2.0 / np.sqrt(R)}
    for proj, matrix in matrices.items():
        names = [_op_nbits.INPUTS[i] for i in (proj.weight, proj.scales, proj.zero_points)]
        if proj.name not in quantized:
            feeds[names[0]] = matrix
            continue
        q = random_projection(*matrix.shape, stds[proj], dtype, rng, bits=bits, block_size=block_size, zp=zp)
        feeds.update({name: q[key] for name, key in zip(names, ("B", "scales", "zero_points")) if key in q})
    feeds.update(random_activations(lead, C, H, dtype, rng, prologue))
    return feeds


def nbits_model(feeds: dict, *, C: int, dtype, streams_out=True, initializers=(), input_types=None, **attrs):
    """One HyperConnectionLowRankMixNBits node over feeds' names (absent optional inputs as empty names);
    those in initializers are constant initializers, the rest graph inputs of unknown shape (so a test
    can feed bad shapes). input_types overrides an input's declared element type."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node_inputs = [name if name in feeds else "" for name in _op_nbits.INPUTS]
    while not node_inputs[-1]:
        node_inputs.pop()
    outputs = list(_op_nbits.OUTPUTS[: 3 if streams_out else 2])
    node = helper.make_node(_op_nbits.OP_TYPE, node_inputs, outputs, domain=_op_nbits.DOMAIN, name="hc_nbits_node",
                            num_branches=C, **attrs)
    types = {name: helper.np_dtype_to_tensor_dtype(feeds[name].dtype) for name in feeds} | (input_types or {})
    graph = helper.make_graph(
        [node], "nbits",
        [helper.make_tensor_value_info(n, types[n], None) for n in feeds if n not in initializers],
        [helper.make_tensor_value_info(n, elem, None) for n in outputs],
        [numpy_helper.from_array(feeds[n], n) for n in initializers])
    return helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[
        helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(_op_nbits.DOMAIN, _op_nbits.SINCE_VERSION)])


def run_nbits(make_session, feeds, *, C, dtype, streams_out=True, intra_op_threads=0, initializers=(), **attrs):
    model = nbits_model(feeds, C=C, dtype=dtype, streams_out=streams_out, initializers=initializers, **attrs)
    sess = make_session(model, intra_op_threads=intra_op_threads)
    return run_bound(sess, {k: v for k, v in feeds.items() if k not in initializers})


def reference(feeds, *, C, **attrs) -> dict[str, np.ndarray]:
    return dict(zip(_op_nbits.OUTPUTS, hc_lowrank_mix_nbits(**feeds, num_branches=C, **attrs)))


def check(make_session, feeds, *, C, dtype, streams_out=True, what="", **attrs):
    got = run_nbits(make_session, feeds, C=C, dtype=dtype, streams_out=streams_out, **attrs)
    want = reference(feeds, C=C, **attrs)
    assert list(got) == list(_op_nbits.OUTPUTS[: 3 if streams_out else 2])
    for name, value in got.items():
        assert_bitwise_equal(value, want[name], f"{name} {what}")
    return got


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", ZP_FORMS)
@pytest.mark.parametrize("quantized", list(QUANTIZED), ids=list(QUANTIZED))
def test_forms(make_session, rng, dtype, bits, zp, quantized):
    """Every activation type, bits, zero-point form and choice of quantized projections. K = C*H = 39 is
    two full blocks of 16 and a partial one of 7; up's K = R = 7 one partial block; R + C = 10 and C*H = 39
    columns leave partial vectors of columns."""
    C, H, R = 3, 13, 7
    feeds = random_nbits_inputs(C, H, R, dtype, rng, quantized=QUANTIZED[quantized], bits=bits, block_size=16,
                                zp=zp, lead=(5,), prologue=True)
    check(make_session, feeds, C=C, dtype=dtype, bits=bits, block_size=16, what=f"({bits} bits, zp {zp})",
          **ODD_ATTRS)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [16, 32, 64, 256])
@pytest.mark.parametrize("bits", [4, 8])
def test_block_sizes(make_session, rng, dtype, block_size, bits):
    """Block sizes up to past K (down's K = 2*150 = 300: 18.75, 9.4, 4.7 and 1.2 blocks; up's K = R = 40)."""
    C, H, R = 2, 150, 40
    feeds = random_nbits_inputs(C, H, R, dtype, rng, bits=bits, block_size=block_size, zp="packed", lead=(4,))
    check(make_session, feeds, C=C, dtype=dtype, bits=bits, block_size=block_size, what=f"(block_size {block_size})")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("prologue", [False, True], ids=["plain", "prologue"])
@pytest.mark.parametrize("streams_out", [False, True], ids=["2-out", "3-out"])
@pytest.mark.parametrize("lead", [(5,), (2, 3), (), (0,), (2, 0)], ids=["1d", "2d", "no-lead", "0", "2x0"])
def test_prologue_outputs_and_leading_dims(make_session, rng, dtype, prologue, streams_out, lead):
    C, H, R = 4, 20, 9
    feeds = random_nbits_inputs(C, H, R, dtype, rng, zp="T", lead=lead, prologue=prologue)
    got = check(make_session, feeds, C=C, dtype=dtype, streams_out=streams_out, what=f"(lead {lead})")
    assert got["pre_output"].shape == (*lead, H) and got["post_gate"].shape == (*lead, C)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_weights_as_initializers(make_session, rng, dtype):
    C, H, R = 4, 24, 12
    feeds = random_nbits_inputs(C, H, R, dtype, rng, quantized=("up",), bits=8, zp="packed", prologue=True)
    weights = [n for n in feeds if n not in ACTIVATIONS]
    got = run_nbits(make_session, feeds, C=C, dtype=dtype, initializers=weights, bits=8)
    for name, value in reference(feeds, C=C, bits=8).items():
        assert_bitwise_equal(got[name], value, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rows_alone_and_in_batches(make_session, rng, dtype):
    """A row gives the same bits alone, in a batch of 70 (two passes: 64 + 6 rows, row groups of 4) and
    with 1, 2 or 4 threads; all of them the reference's."""
    C, H, R, rows = 4, 40, 20, 70
    feeds = random_nbits_inputs(C, H, R, dtype, rng, zp="packed", lead=(rows,), prologue=True)
    batch = check(make_session, feeds, C=C, dtype=dtype, what=f"(batch of {rows})", **QWEN_ATTRIBUTES)
    for threads in (1, 2, 4):
        again = run_nbits(make_session, feeds, C=C, dtype=dtype, intra_op_threads=threads, **QWEN_ATTRIBUTES)
        for name in batch:
            assert_bitwise_equal(again[name], batch[name], f"{name}: {threads} threads vs the default pool")
    for r in (0, 3, 4, 63, 64, 69):
        one = {k: (v[r : r + 1] if k in ACTIVATIONS else v) for k, v in feeds.items()}
        alone = run_nbits(make_session, one, C=C, dtype=dtype, **QWEN_ATTRIBUTES)
        for name in alone:
            assert_bitwise_equal(alone[name][0], batch[name][r], f"{name} row {r} alone vs in a batch of {rows}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 16])
def test_qwen_size_from_onnxruntimes_quantizer(make_session, rng, dtype, rows):
    """The real shape with B and scales as MatMulNBitsQuantizer writes them (4 bits, block 32, symmetric)."""
    C, H, R = QWEN_SHAPE["C"], QWEN_SHAPE["H"], QWEN_SHAPE["R"]
    dense = random_weights(C, H, R, dtype, rng)
    di = quantize_nbits(np.concatenate([dense["down_weight"], dense["inject_weight"]], axis=1))
    up = quantize_nbits(dense["up_weight"])
    feeds = {"norm_scale": dense["norm_scale"], "down_inject_weight": di.B, "down_inject_scales": di.scales,
             "up_weight": up.B, "up_scales": up.scales, **random_activations((rows,), C, H, dtype, rng, True)}
    check(make_session, feeds, C=C, dtype=dtype, what=f"(Qwen size, {rows} rows)", **QWEN_ATTRIBUTES)


# ---- bad inputs: one clear error naming the input, raised before any byte is read ---------------------

def good_feeds(rng, dtype=np.float32, zp="packed"):
    return random_nbits_inputs(2, 16, 5, dtype, rng, zp=zp, lead=(3,))


@pytest.mark.parametrize("change, message", [
    ({"down_inject_weight": np.zeros((7, 2, 16), np.uint8)},
     r"down_inject_weight must be MatMulNBits' B \(N, ceil\(K / block_size\), block_size \* bits / 8\) = \(7, 1, 16\) "
     r"for K = 32, N = 7, bits = 4, block_size = 32; got \(7, 2, 16\)"),
    ({"up_weight": np.zeros((32, 1, 8), np.uint8)}, r"up_weight must be MatMulNBits' B .* = \(32, 1, 16\) .*got \(32, 1, 8\)"),
    ({"up_scales": np.zeros((31, 1), np.float32)}, r"up_scales must be \(N, ceil\(K / block_size\)\) = \(32, 1\); got \(31, 1\)"),
    ({"down_inject_zero_points": np.zeros((7, 2), np.uint8)},
     r"down_inject_zero_points must be packed uint8 .* = \(7, 1\); got \(7, 2\)"),
    ({"down_inject_zero_points": np.zeros((7, 1), np.int8)},
     r"down_inject_zero_points must be uint8 \(packed\) or the type of streams; got int8"),
    ({"down_inject_weight": np.zeros((9, 1, 16), np.uint8)},  # R = 9 - C = 7: the scales no longer fit
     r"down_inject_scales must be \(N, ceil\(K / block_size\)\) = \(9, 1\); got \(7, 1\)"),
    ({"down_inject_weight": np.zeros((2, 1, 16), np.uint8)}, r"down_inject_weight must be MatMulNBits' B \(R \+ C, "),
    ({"norm_scale": np.ones(33, np.float32)}, r"HyperConnectionLowRankMixNBits: norm_scale must be \(C\*H,\) = \(32,\); got \(33,\)"),
    ({"streams": np.ones((3, 31), np.float32)}, r"HyperConnectionLowRankMixNBits: the last dim of streams \(C\*H = 31\)"),
])
def test_bad_shapes(make_session, rng, change, message):
    """Each bad shape or type is named; where the good inputs fit the same model, its next run still matches
    the reference (nothing was left half done)."""
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    feeds = good_feeds(rng)
    types = {k: helper.np_dtype_to_tensor_dtype(v.dtype) for k, v in change.items()}
    sess = make_session(nbits_model(feeds, C=2, dtype=np.float32, input_types=types))
    with pytest.raises(InvalidArgument, match=message):
        sess.run(None, {**feeds, **change})
    if any(feeds[k].dtype != v.dtype for k, v in change.items()):
        return
    got = run_bound(sess, feeds)
    for name, value in reference(feeds, C=2).items():
        assert_bitwise_equal(got[name], value, name)


@pytest.mark.parametrize("attrs, message", [
    ({"bits": 3}, r"HyperConnectionLowRankMixNBits node 'hc_nbits_node': attribute bits must be 4 or 8; got 3"),
    ({"block_size": 24}, r"attribute block_size must be a power of two >= 16; got 24"),
    ({"block_size": 8}, r"attribute block_size must be a power of two >= 16; got 8"),
    ({"bits": 4.0}, r"attribute bits must be an int; got the float 4"),
    ({"num_branches": None}, r"HyperConnectionLowRankMixNBits node 'hc_nbits_node': attribute num_branches .* required"),
])
def test_bad_attributes(make_session, rng, attrs, message):
    feeds = good_feeds(rng)
    model = nbits_model(feeds, C=2, dtype=np.float32, **{k: v for k, v in attrs.items() if v is not None})
    if "num_branches" in attrs:
        del model.graph.node[0].attribute[:]
    with pytest.raises(Exception, match=message):
        make_session(model)


def test_block_size_that_does_not_match_b(make_session, rng):
    """block_size 64 with B written for 32: B's shape no longer fits, and the error says what it expects."""
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    feeds = good_feeds(rng)
    sess = make_session(nbits_model(feeds, C=2, dtype=np.float32, block_size=64))
    with pytest.raises(InvalidArgument, match=r"down_inject_weight must be MatMulNBits' B .* = \(7, 1, 32\)"):
        sess.run(None, feeds)


@pytest.mark.parametrize("change, message", [
    ({"down_inject_scales": None}, r"down_inject_scales is required with a uint8 down_inject_weight"),
    ("both dense", r"neither down_inject_weight nor up_weight is quantized"),
    ("scales with dense", r"up_scales is given but up_weight is dense"),
    ({"prev_block_output": np.ones((3, 16), np.float32)}, r"prev_block_output and prev_post_gate must be given together"),
])
def test_inputs_that_do_not_go_together(make_session, rng, change, message):
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    feeds = good_feeds(rng)
    dense = random_nbits_inputs(2, 16, 5, np.float32, rng, quantized=(), lead=(3,))
    if change == "both dense":
        feeds = dense
    elif change == "scales with dense":
        feeds = {**feeds, "up_weight": dense["up_weight"]}
        feeds.pop("up_zero_points")
    else:
        feeds = {k: v for k, v in {**feeds, **change}.items() if v is not None}
    sess = make_session(nbits_model(feeds, C=2, dtype=np.float32))
    with pytest.raises(InvalidArgument, match=message):
        sess.run(None, feeds)


def test_scales_of_another_type(make_session, rng):
    """Scales are T in every registration: onnxruntime itself finds no kernel for float16 scales with
    float32 streams and says so when the session is made."""
    feeds = {**good_feeds(rng), "up_scales": np.zeros((32, 1), np.float16)}
    with pytest.raises(Exception, match=r"no kernel def matches node inputs for Op: HyperConnectionLowRankMixNBits"):
        make_session(nbits_model(feeds, C=2, dtype=np.float32))


def test_weight_of_another_type(make_session, rng):
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    feeds = {**good_feeds(rng, zp="none"), "up_weight": np.zeros((32, 1, 16), np.int8)}
    sess = make_session(nbits_model(feeds, C=2, dtype=np.float32))
    with pytest.raises(InvalidArgument, match=r"up_weight must be the type of streams \(dense\) or uint8 .*got int8"):
        sess.run(None, feeds)


def test_answers_in_ai_hcfuse_not_com_microsoft(make_session, rng):
    """The op lives in hcfuse's own domain; com.microsoft (onnxruntime's) has no such op."""
    feeds = good_feeds(rng)
    model = nbits_model(feeds, C=2, dtype=np.float32)
    model.graph.node[0].domain = "com.microsoft"
    with pytest.raises(Exception, match=r"HyperConnectionLowRankMixNBits"):
        make_session(model)


