"""Shapes without value_info: the fusion derives the shapes its conditions need
from the graph itself, inside the pass (so the Python API gets it too), and fuses a model without
value_info exactly as it fuses the same model with it."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import hcfuse
from hcfuse import _op
from hcfuse.rewrite import fuse_with_report
from hcfuse.rewrite.shape_facts import ShapeFacts
from hcfuse.models.qwen_decode import make_decode_model
from tests.fusion._chain import C, H, R, assert_same_outputs, ops


def _without_value_info(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model as an exporter that writes no value_info leaves it: only graph inputs and outputs are typed."""
    stripped = onnx.ModelProto()
    stripped.CopyFrom(proto)
    del stripped.graph.value_info[:]
    return stripped


def _summary(report) -> tuple:
    return ([(b.rule, b.anchor, b.prologue, b.replaced) for b in report.fused],
            [(r.anchor, r.reason) for r in report.rejected])


@pytest.mark.parametrize("leading", [("batch", "seq"), ("rows",), (2, 3)], ids=str)
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
def test_fusion_is_the_same_with_and_without_value_info(hcfuse_lib, leading, packed):
    original = make_decode_model(4, C=C, H=H, R=R, leading_dims=leading, packed=packed, final_mix=True)
    stripped = _without_value_info(original)
    assert not stripped.graph.value_info
    with_info, without_info = ir.from_proto(original), ir.from_proto(stripped)
    expected = fuse_with_report(with_info)
    actual = fuse_with_report(without_info)
    assert _summary(actual) == _summary(expected)
    assert len(actual.fused) == 5 and sum(b.prologue for b in actual.fused) == 4 and actual.rejected == []
    assert ops(without_info)[_op.POST_MIX] == 0
    concrete = tuple(d if isinstance(d, int) else 3 for d in leading)
    assert_same_outputs(stripped, ir.to_proto(without_info), hcfuse_lib, leading=concrete)


def test_96_block_chain_without_value_info_fuses_every_prologue():
    model = ir.from_proto(_without_value_info(make_decode_model(96, C=C, H=8, R=4)))
    report = fuse_with_report(model)
    assert len(report.fused) == 96 and report.rejected == []
    assert sum(block.prologue for block in report.fused) == 95  # block 0 has none
    assert ops(model)[_op.POST_MIX] == 1  # the last injection: no block follows it
    onnx.checker.check_model(ir.to_proto(model))


def test_python_api_derives_the_shapes_too():
    stripped = _without_value_info(make_decode_model(3, C=C, H=H, R=R))
    fused, report = hcfuse.optimize_with_report(stripped)
    assert len(report.fused) == 3 and all(b.prologue for b in report.fused[1:])
    assert not any(n.op_type == _op.POST_MIX for n in fused.graph.node[:-1])


def test_derived_shapes_are_not_written_into_the_model():
    model = ir.from_proto(_without_value_info(make_decode_model(3, C=C, H=H, R=R)))
    fuse_with_report(model)
    sublayers = [n for n in model.graph if n.op_type == "MatMul"]
    assert sublayers and all(n.outputs[0].shape is None for n in sublayers)


# ---- ShapeFacts on single ops -------------------------------------------------------------------


def _value(name, dims, dtype=ir.DataType.FLOAT):
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=None if dims is None else ir.Shape(dims))


def _const(name, array):
    node = ir.node("Constant", [], {"value": ir.tensor(np.asarray(array), name=name)}, name=name)
    return node, node.outputs[0]


def _facts_of(nodes, value):
    ir.Graph([], [], nodes=nodes)  # owns the nodes, so their values know their producers
    return ShapeFacts().dims(value)


def test_facts_through_the_contrib_ops_and_the_fused_op():
    x = _value("x", ["b", "s", C * H])
    norm = ir.node(_op.BRANCH_NORM, [x], {"num_branches": C}, domain=_op.DOMAIN)
    pre = ir.node(_op.PRE_MIX, [norm.outputs[0], norm.outputs[0]], {"num_branches": C}, domain=_op.DOMAIN)
    fused = ir.node(_op.OP_TYPE, [x, _value("s", [C * H]), _value("d", [C * H, R]), _value("u", [R, C * H]),
                                  _value("i", [C * H, C])], {"num_branches": C}, domain=_op.DOMAIN, num_outputs=3)
    ir.Graph([x], [], nodes=[norm, pre, fused])
    facts = ShapeFacts()
    assert facts.dims(norm.outputs[0]) == ("b", "s", C * H)
    assert facts.dims(pre.outputs[0]) == ("b", "s", H)
    assert [facts.dims(v) for v in fused.outputs] == [("b", "s", H), ("b", "s", C), ("b", "s", C * H)]
    assert facts.dtype(pre.outputs[0]) == ir.DataType.FLOAT


def test_facts_through_matmul_split_and_elementwise_ops():
    x = _value("x", ["rows", C * H])
    w = _value("w", [C * H, R + C])
    matmul = ir.node("MatMul", [x, w])
    sizes_node, sizes = _const("sizes", np.array([R, C], np.int64))
    split = ir.node("Split", [matmul.outputs[0], sizes], {"axis": -1}, num_outputs=2)
    two_node, two = _const("two", np.array(2.0, np.float32))
    div = ir.node("Div", [split.outputs[1], two])
    sig = ir.node("Sigmoid", [div.outputs[0]])
    nodes = [matmul, sizes_node, split, two_node, div, sig]
    assert _facts_of(nodes, sig.outputs[0]) == ("rows", C)
    assert ShapeFacts().dims(split.outputs[0]) == ("rows", R)


def test_facts_through_reshape_and_tile():
    x = _value("x", [2, 3, H])
    shape_node, shape = _const("shape", np.array([0, -1], np.int64))
    reshape = ir.node("Reshape", [x, shape])
    reps_node, reps = _const("reps", np.array([1, C], np.int64))
    tile = ir.node("Tile", [reshape.outputs[0], reps])
    assert _facts_of([shape_node, reshape, reps_node, tile], tile.outputs[0]) == (2, 3 * H * C)


def test_an_overridable_reshape_shape_gives_no_fact():
    x = _value("x", [2, 3, H])
    shape = _value("shape", [2], ir.DataType.INT64)
    shape.const_value = ir.tensor(np.array([6, H], np.int64))
    graph = ir.Graph([x, shape], [], nodes=[reshape := ir.node("Reshape", [x, shape])], initializers=[shape])
    assert graph.initializers["shape"] is shape
    assert ShapeFacts().dims(reshape.outputs[0]) is None


def test_a_value_info_that_contradicts_the_graph_gives_no_fact():
    x = _value("x", ["rows", C * H])
    w = _value("w", [C * H, C])
    matmul = ir.node("MatMul", [x, w])
    matmul.outputs[0].shape = ir.Shape(["rows", C, H])  # wrong rank: a (..., C, H) claim
    other = ir.node("MatMul", [x, w])
    other.outputs[0].shape = ir.Shape(["rows", C + 1])  # wrong last dim
    ir.Graph([x, w], [], nodes=[matmul, other])
    facts = ShapeFacts()
    assert facts.dims(matmul.outputs[0]) is None
    assert facts.dims(other.outputs[0]) == ("rows", None)


def test_an_overridable_default_without_a_declared_shape_gives_no_shape():
    """A caller may feed another shape than the default's (the stock norm takes (C*H), (C, H) or (H))."""
    scale = ir.Value(name="scale", const_value=ir.tensor(np.ones(C * H, np.float32)))
    ir.Graph([scale], [], nodes=[], initializers=[scale])
    assert ShapeFacts().dims(scale) is None
    declared = ir.Value(name="declared", shape=ir.Shape([C * H]), type=ir.TensorType(ir.DataType.FLOAT),
                        const_value=ir.tensor(np.ones(C * H, np.float32)))
    ir.Graph([declared], [], nodes=[], initializers=[declared])
    assert ShapeFacts().dims(declared) == (C * H,)


def test_facts_through_unsqueeze_transpose_expand_and_matmulnbits():
    x = _value("x", ["rows", H])
    axes_node, axes = _const("axes", np.array([1], np.int64))
    unsqueeze = ir.node("Unsqueeze", [x, axes])
    transpose = ir.node("Transpose", [unsqueeze.outputs[0]], {"perm": [1, 0, 2]})
    shape_node, shape = _const("shape", np.array([C, 1, 1], np.int64))
    expand = ir.node("Expand", [transpose.outputs[0], shape])
    nbits = ir.node("MatMulNBits", [x, _value("q", None, ir.DataType.UINT8), _value("sc", None)],
                    {"K": H, "N": R, "bits": 4, "block_size": 32}, domain=_op.DOMAIN)
    skip = ir.node("SkipSimplifiedLayerNormalization", [x, x, _value("g", [H])], domain=_op.DOMAIN)
    ir.Graph([x], [], nodes=[axes_node, unsqueeze, transpose, shape_node, expand, nbits, skip])
    facts = ShapeFacts()
    assert facts.dims(unsqueeze.outputs[0]) == ("rows", 1, H)
    assert facts.dims(transpose.outputs[0]) == (1, "rows", H)
    assert facts.dims(expand.outputs[0]) == (C, "rows", H)
    assert facts.dims(nbits.outputs[0]) == ("rows", R)
    assert facts.dims(skip.outputs[0]) == ("rows", H)


def test_prologues_fuse_when_the_streams_come_through_other_ops():
    """Streams made by Unsqueeze + Expand + Reshape instead of Tile, no value_info: still proved."""
    proto = _without_value_info(make_decode_model(3, C=C, H=H, R=R, leading_dims=("rows",)))
    model = ir.from_proto(proto)
    tile = next(n for n in model.graph if n.op_type == "Tile")
    embeds = tile.inputs[0]
    axes = ir.Value(name="axes", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]),
                    const_value=ir.tensor(np.array([1], np.int64)))
    shape = ir.Value(name="expand_shape", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([2]),
                     const_value=ir.tensor(np.array([C, 1], np.int64)))
    flat = ir.Value(name="flat_shape", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([2]),
                    const_value=ir.tensor(np.array([0, -1], np.int64)))
    for value in (axes, shape, flat):
        model.graph.register_initializer(value)
    unsqueeze = ir.node("Unsqueeze", [embeds, axes], name="unsqueeze")
    expand = ir.node("Expand", [unsqueeze.outputs[0], shape], name="expand")
    reshape = ir.node("Reshape", [expand.outputs[0], flat], name="reshape")
    model.graph.insert_before(tile, [unsqueeze, expand, reshape])
    tile.outputs[0].replace_all_uses_with(reshape.outputs[0])
    model.graph.remove(tile, safe=True)
    report = fuse_with_report(model)
    assert len(report.fused) == 3 and report.rejected == []
    assert [b.prologue for b in report.fused] == [False, True, True]


def test_reshape_minus_one_with_symbolic_dims_that_cancel():
    x = _value("x", ["rows", C, H])
    shape_node, shape = _const("shape", np.array([0, -1], np.int64))
    reshape = ir.node("Reshape", [x, shape])
    assert _facts_of([shape_node, reshape], reshape.outputs[0]) == ("rows", C * H)
    y = _value("y", ["rows", "seq", H])
    other_node, other = _const("other", np.array([-1, H], np.int64))
    merge = ir.node("Reshape", [y, other])
    assert _facts_of([other_node, merge], merge.outputs[0]) == (None, H)  # rows*seq: not one symbol
