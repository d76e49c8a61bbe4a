"""Blocks whose MatMuls onnxruntime's MatMulNBitsQuantizer quantized (as onnxruntime-genai's int4 builds do)
fuse into ai.hcfuse.HyperConnectionLowRankMixNBits: every form the quantizer writes, the quantized tensors
taken byte for byte (or concatenated along N, losslessly), the same outputs as the chain."""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import _op, _op_nbits
from hcfuse.models.quantized import projection_names, quantize_model
from hcfuse.rewrite import fuse_with_report
from tests.fusion._chain import TOLERANCE
from tests.fusion._nbits_chain import SMALL, feeds, matmul_nbits, nbits_nodes, quantized_chain, run_reference

BLOCKS = 2
SMALL_R, _C = SMALL["R"], SMALL["C"]
FUSED = BLOCKS + 1  # and the final mix


def _tensor(value: ir.Value) -> np.ndarray:
    return value.const_value.numpy()


def _initializers(model: ir.Model) -> dict[str, ir.Value]:
    return dict(model.graph.initializers)


def _fuse(model: ir.Model):
    report = fuse_with_report(model)
    assert not report.rejected, report.to_dict()
    assert len(report.fused) == FUSED and len(nbits_nodes(model)) == FUSED, report.to_dict()
    assert not {n.op_type for n in model.graph} & {*_op.CHAIN_CONTRIB_OPS, "Split", "Sigmoid", "Div", "Mul"}
    assert model.opset_imports[_op_nbits.DOMAIN] == _op_nbits.SINCE_VERSION
    return report


def _assert_outputs_match(original: ir.Model, fused: ir.Model, dtype) -> None:
    data = feeds(original)
    (want,), (got,) = run_reference(original, data), run_reference(fused, data)
    assert got.dtype == want.dtype and got.shape == want.shape
    gap = np.abs(got.astype(np.float32) - want.astype(np.float32)).max()
    bound = TOLERANCE[np.dtype(np.float16 if np.dtype(dtype).itemsize == 2 else np.float32)]
    bound *= 8 if np.dtype(dtype) == ml_dtypes.bfloat16 else 1  # 3 fewer mantissa bits than float16
    assert gap <= bound * max(1.0, float(np.abs(want.astype(np.float32)).max())), gap


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("bits,block_size,symmetric", [(4, 32, True), (4, 64, False), (8, 128, True), (8, 32, False),
                                                       (4, 16, False), (8, 256, True)])
def test_packed_blocks_take_the_quantizers_tensors_as_they_are(dtype, bits, block_size, symmetric):
    m = quantized_chain(BLOCKS, dtype=dtype, sublayer="identity",
                        quantizer=dict(bits=bits, block_size=block_size, symmetric=symmetric))
    original = ir.from_proto(ir.to_proto(m))
    quantized = {n.name: [v.name for v in n.inputs[1:]] for n in matmul_nbits(m)}
    _fuse(m)
    for node in nbits_nodes(m)[:BLOCKS]:
        packed = quantized[node.name.rsplit("/", 1)[0] + "/input_mix_down_block_inject/MatMul_Q" + str(bits)]
        assert [v.name for v in node.inputs[2:2 + len(packed)]] == packed  # B, scales (, zero points)
        assert node.attributes.get_int("bits") == bits and node.attributes.get_int("block_size") == block_size
        assert node.attributes.get_int("accuracy_level") == 4
    _assert_outputs_match(original, m, dtype)


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
def test_separate_down_and_inject_are_concatenated_along_n(symmetric):
    m = quantized_chain(BLOCKS, packed=False, sublayer="identity", quantizer=dict(symmetric=symmetric))
    original = ir.from_proto(ir.to_proto(m))
    before = {n.name: [v.const_value.numpy() if v is not None else None for v in n.inputs[1:4]]
              for n in matmul_nbits(m)}
    _fuse(m)
    for node in nbits_nodes(m)[:BLOCKS]:
        names = projection_names(*_layer_and_location(node), packed=False)
        down, inject = before[names["down"] + "_Q4"], before[names["inject"] + "_Q4"]
        for i in range(3 if not symmetric else 2):
            np.testing.assert_array_equal(_tensor(node.inputs[2 + i]), np.concatenate([down[i], inject[i]]))
        assert (node.inputs[4] is None) == symmetric
    # the separate tensors are gone with the nodes that read them
    assert not [name for name in _initializers(m) if "block_inject_weight.MatMul" in name]
    _assert_outputs_match(original, m, np.float32)


def _layer_and_location(node: ir.Node) -> tuple[int, str]:
    layer, location = node.name.split("/")[2:4]
    return int(layer.split(".")[1]), location.split("_")[0]


def test_final_mix_gets_inject_rows_of_scale_zero():
    m = quantized_chain(BLOCKS, packed=False, sublayer="identity", quantizer=dict(symmetric=False))
    _fuse(m)
    final = nbits_nodes(m)[-1]
    B, scales, zp = (_tensor(v) for v in final.inputs[2:5])
    assert B.shape[0] == SMALL_R + _C and not scales[SMALL_R:].any()
    assert (zp[SMALL_R:] == 0x88).all()


def test_the_genai_int4_form_fuses_completely_beside_quantized_sublayers():
    """The whole graph quantized (the sublayers' MatMuls too), float16, shapes from the graph alone."""
    m = quantized_chain(4, dtype=np.float16)
    for node in m.graph:
        for out in node.outputs:
            if not out.is_graph_output():
                out.shape = None  # exporters often write no value_info
    report = fuse_with_report(m)
    assert len(report.fused) == 5 and not report.rejected, report.to_dict()
    assert sum(f.prologue for f in report.fused) == 4
    assert {n.name.split("/")[-1] for n in matmul_nbits(m)} == {"MatMul_Q4"}
    assert all("proj" in n.name for n in matmul_nbits(m))


@pytest.mark.parametrize("excluded", ["up", "down_inject"])
def test_a_projection_left_dense_by_nodes_to_exclude(excluded):
    names = projection_names(0, "attn")
    m = quantized_chain(BLOCKS, sublayer="identity", quantizer=dict(exclude=[names[excluded]]))
    original = ir.from_proto(ir.to_proto(m))
    _fuse(m)
    node = nbits_nodes(m)[0]
    dense = node.inputs[_op_nbits.UP_WEIGHT if excluded == "up" else _op_nbits.DOWN_INJECT_WEIGHT]
    quantized = node.inputs[_op_nbits.DOWN_INJECT_WEIGHT if excluded == "up" else _op_nbits.UP_WEIGHT]
    assert dense.dtype == ir.DataType.FLOAT and quantized.dtype == ir.DataType.UINT8
    inputs = [*node.inputs, *[None] * len(_op_nbits.INPUTS)]  # trailing absent inputs are left out
    assert inputs[_op_nbits.UP_SCALES if excluded == "up" else _op_nbits.DOWN_INJECT_SCALES] is None
    _assert_outputs_match(original, m, np.float32)


def test_dense_separate_down_and_inject_beside_a_quantized_up_become_one_weight():
    names = projection_names(0, "attn", packed=False)
    m = quantized_chain(BLOCKS, packed=False, sublayer="identity",
                        quantizer=dict(exclude=[names["down"], names["inject"]]))
    original = ir.from_proto(ir.to_proto(m))
    down = _tensor(m.graph.initializers[names["down"][1:].replace("/", ".") + ".weight"])
    inject = _tensor(m.graph.initializers[names["inject"][1:].replace("/", ".") + ".weight"])
    _fuse(m)
    node = nbits_nodes(m)[0]
    np.testing.assert_array_equal(_tensor(node.inputs[_op_nbits.DOWN_INJECT_WEIGHT]), np.concatenate([down, inject], 1))
    _assert_outputs_match(original, m, np.float32)


def test_a_dense_block_beside_quantized_ones_stays_the_dense_op():
    names = projection_names(0, "attn")
    m = quantized_chain(BLOCKS, sublayer="identity", quantizer=dict(exclude=list(names.values())))
    report = fuse_with_report(m)
    assert len(report.fused) == FUSED and not report.rejected
    kinds = collections.Counter((n.domain, n.op_type) for n in m.graph
                                if n.op_type in (_op.OP_TYPE, _op_nbits.OP_TYPE))
    assert kinds == {(_op.DOMAIN, _op.OP_TYPE): 1, (_op_nbits.DOMAIN, _op_nbits.OP_TYPE): FUSED - 1}


def test_t_zero_points_are_taken_as_they_are():
    m = quantized_chain(BLOCKS, packed=False, sublayer="identity", quantizer=dict(symmetric=False, zp_form="T"))
    original = ir.from_proto(ir.to_proto(m))
    _fuse(m)
    zp = nbits_nodes(m)[0].inputs[_op_nbits.DOWN_INJECT_ZERO_POINTS]
    assert zp.dtype == ir.DataType.FLOAT and zp.shape[0] == SMALL_R + _C
    _assert_outputs_match(original, m, np.float32)


def test_blocks_sharing_quantized_weights_share_the_concatenation():
    m = quantized_chain(4, packed=False, sublayer="identity", num_weight_sets=1)
    report = fuse_with_report(m)
    assert len(report.fused) == 5 and not report.rejected
    weights = {n.inputs[_op_nbits.DOWN_INJECT_WEIGHT].name for n in nbits_nodes(m)[:4]}
    assert len(weights) == 1
    names = [v.name for v in m.graph.initializers.values()]
    assert len(names) == len(set(names))



def test_a_dense_packed_weight_fed_at_run_time_is_taken_as_it_is_beside_a_quantized_up():
    """The quantized op reads the packed [C*H, R+C] weight as the chain's MatMul does: nothing is sliced or
    folded, so a weight a caller feeds stays a graph input the node reads."""
    names = projection_names(0, "attn")
    m = quantized_chain(BLOCKS, sublayer="identity", quantizer=dict(exclude=[names["down_inject"]]))
    packed = m.graph.initializers[names["down_inject"][1:].replace("/", ".") + ".weight"]
    m.graph.inputs.append(packed)  # an overridable default
    _fuse(m)
    assert nbits_nodes(m)[0].inputs[_op_nbits.DOWN_INJECT_WEIGHT] is packed and packed.is_graph_input()


@pytest.mark.parametrize("zp_form", [None, "T"], ids=["packed", "T"])
def test_a_projection_without_zero_points_beside_one_with_them_gets_the_default_written_out(zp_form):
    """Two quantizer runs: down symmetric (no zero points), then inject asymmetric. The concatenation holds
    2^(bits-1) for down, what MatMulNBits takes for absent zero points, in the form inject's are."""
    names = projection_names(0, "attn", packed=False)
    first = quantized_chain(BLOCKS, packed=False, sublayer="identity", quantizer=dict(exclude=[names["inject"]]))
    m = ir.from_proto(quantize_model(ir.to_proto(first), symmetric=False, accuracy_level=4, zp_form=zp_form))
    original = ir.from_proto(ir.to_proto(m))
    _fuse(m)
    zp = _tensor(nbits_nodes(m)[0].inputs[_op_nbits.DOWN_INJECT_ZERO_POINTS])
    assert zp.shape[0] == SMALL_R + _C
    assert (zp[:SMALL_R] == (0x88 if zp_form is None else 8)).all()
    _assert_outputs_match(original, m, np.float32)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
def test_quantized_blocks_inside_a_function_are_fused_there(packed):
    """The quantized tensors as Constant nodes of a model-local function (which holds no initializers): the
    concatenations become Constant nodes there too, and the function imports ai.hcfuse."""
    from tests.fusion.test_functions_and_subgraphs import _into_function

    m = quantized_chain(BLOCKS, packed=packed, sublayer="identity")
    _into_function(m, typed_inputs=True, constants_inside=True)
    original = ir.from_proto(ir.to_proto(m))
    report = fuse_with_report(m)
    assert len(report.fused) == FUSED and not report.rejected, report.to_dict()
    body = next(iter(m.functions.values()))
    kinds = [n.op_type for n in body]
    assert kinds.count(_op_nbits.OP_TYPE) == FUSED and "MatMulNBits" not in kinds
    assert body.opset_imports[_op_nbits.DOMAIN] == _op_nbits.SINCE_VERSION and not m.graph.initializers
    _assert_outputs_match(original, m, np.float32)


def _flatten_quantization_params(m: ir.Model) -> int:
    """Scales and zero points of every MatMulNBits as [N * columns] (older quantizers' and Olive's form)."""
    count = 0
    for node in matmul_nbits(m):
        for value in node.inputs[2:4]:
            if value is not None and len(value.shape) == 2:
                value.const_value = ir.tensor(value.const_value.numpy().reshape(-1), name=value.name)
                value.shape = ir.Shape([value.const_value.shape[0]])
                count += 1
    return count


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
def test_flat_scales_and_zero_points_fuse_as_matrices_of_the_same_bytes(packed, symmetric):
    m = quantized_chain(BLOCKS, packed=packed, sublayer="identity", quantizer=dict(symmetric=symmetric))
    original = ir.from_proto(ir.to_proto(m))  # the same model with [N, columns] tensors
    assert _flatten_quantization_params(m)
    _fuse(m)
    for node in nbits_nodes(m):
        for value in node.inputs[3:5]:  # down_inject's scales and zero points
            assert value is None or len(value.shape) == 2, value
    _assert_outputs_match(original, m, np.float32)
