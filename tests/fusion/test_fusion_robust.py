"""Valid models that used to make optimize raise or come out broken (issue 10 item 6): the grouped
form, chains inside model-local functions, reference attributes, a (..., C, H) post_mix with H == C,
and a condition only the fused op's run-time validation checks (R >= 1). Each is fused where that is
provably right, or left with a reason; the optimized model runs in onnxruntime and matches."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import _op
from hcfuse.rewrite import fuse_with_report
from hcfuse.models.qwen_decode import make_decode_model
from tests._compare import cpu_session
from tests.fusion.test_fusion import C, H, R, _fused_nodes, _model, _node, _set_attr


def _run(model: ir.Model, library, feeds):
    return cpu_session(ir.to_proto(model), library).run(None, feeds)


def _assert_same(original: ir.Model, fused: ir.Model, library, feeds):
    for got, want in zip(_run(fused, library, feeds), _run(original, None, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def _embeds(*leading):
    return {"inputs_embeds": np.random.default_rng(1).standard_normal((*leading, H)).astype(np.float32)}


def test_grouped_form_is_left_with_a_reason():
    model = _model(2)
    for op in (_op.BRANCH_NORM, _op.PRE_MIX):
        _set_attr(_node(model, op, 1), "num_branches", 0)
    anchor = _node(model, _op.BRANCH_NORM, 1).name
    report = fuse_with_report(model)  # was ZeroDivisionError
    assert len(report.fused) == 2
    [rejected] = report.rejected
    assert rejected.anchor == anchor
    assert "num_branches=0 (the grouped form" in rejected.reason


def _into_function(model: ir.Model, *, typed_inputs: bool, attributes=(), constants_inside: bool = False) -> ir.Function:
    """Moves every node of model into a model-local function local::HcBlocks that the graph calls; its
    weights become the function's inputs, or (constants_inside) Constant nodes in its body."""
    graph = model.graph
    weights = list(graph.initializers.values())
    outer = [graph.inputs[0], *([] if constants_inside else weights)]
    inner = [ir.Value(name=v.name, type=v.type if typed_inputs else None, shape=v.shape if typed_inputs else None)
             for v in outer]
    constants = []
    if constants_inside:
        for weight in weights:
            node = ir.node("Constant", [], {"value": weight.const_value}, name=f"{weight.name}/Constant")
            node.outputs[0].name, node.outputs[0].type, node.outputs[0].shape = weight.name, weight.type, weight.shape
            constants.append(node)
            outer.append(weight)
            inner.append(node.outputs[0])
    for old, new in zip(outer, inner):
        for user, index in list(old.uses()):
            user.replace_input_with(index, new)
    if constants_inside:
        graph.initializers.clear()
        outer = outer[:1]
    [out] = graph.outputs
    graph.outputs.clear()
    nodes = list(graph)
    for node in nodes:
        graph.remove(node)
    body = ir.Graph(inner[: len(outer)], [out], nodes=constants + nodes, opset_imports={"": 21, _op.DOMAIN: 1})
    function = ir.Function("local", "HcBlocks", "", graph=body, attributes=list(attributes))
    model.functions[function.identifier()] = function
    call = ir.node("HcBlocks", outer, domain="local", name="call")
    call.outputs[0].name, call.outputs[0].type, call.outputs[0].shape = "hidden_states", out.type, out.shape
    graph.append(call)
    graph.outputs.append(call.outputs[0])
    graph.opset_imports["local"] = 1
    model.opset_imports["local"] = 1
    return function


def test_chain_inside_a_function_is_fused_there(hcfuse_lib):
    original = _model(2, packed=False, final_mix=False)
    _into_function(original, typed_inputs=True)
    model = original.clone()
    report = fuse_with_report(model)  # was AttributeError: 'Function' object has no attribute 'initializers'
    assert len(report.fused) == 2 and report.rejected == []
    body = next(iter(model.functions.values()))
    assert [n.op_type for n in body].count(_op.OP_TYPE) == 2
    _assert_same(original, model, hcfuse_lib, _embeds(2, 3))


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
def test_chain_inside_a_function_with_derived_weights_is_fused_there(hcfuse_lib, packed):
    """Packed halves, a shared (H) norm scale and the final mix's zero inject weight become Constant
    nodes in the function (which holds no initializers)."""
    original = _model(2, packed=packed, final_mix=True)
    norm = _node(original, _op.BRANCH_NORM, 1)
    shared = ir.Value(name="scale_h", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([H]),
                      const_value=ir.tensor(np.linspace(0.5, 1.5, H).astype(np.float32)))
    original.graph.register_initializer(shared)
    norm.replace_input_with(1, shared)
    function = _into_function(original, typed_inputs=True, constants_inside=True)
    assert not original.graph.initializers
    model = original.clone()
    report = fuse_with_report(model)
    assert len(report.fused) == 3 and report.rejected == []
    body = next(iter(model.functions.values()))
    assert [n.op_type for n in body].count(_op.OP_TYPE) == 3 and _op.BRANCH_NORM not in {n.op_type for n in body}
    assert not model.graph.initializers and len(function.inputs) == 1
    _assert_same(original, model, hcfuse_lib, _embeds(2, 3))


def test_chain_inside_a_function_with_untyped_inputs_is_left_with_a_reason(hcfuse_lib):
    original = _model(1, packed=False, final_mix=False)
    _into_function(original, typed_inputs=False)
    model = original.clone()
    report = fuse_with_report(model)
    assert report.fused == []
    [rejected] = report.rejected
    assert "must be a 2-D weight of known shape; got None" in rejected.reason
    _assert_same(original, model, hcfuse_lib, _embeds(2, 3))


def test_float_reference_attribute_passes_on_to_the_fused_node(hcfuse_lib):
    original = _model(1, packed=False, final_mix=False)
    function = _into_function(original, typed_inputs=True,
                              attributes=[ir.Attr("eps", ir.AttributeType.FLOAT, 1e-5)])
    norm = next(n for n in function if n.op_type == _op.BRANCH_NORM)
    norm.attributes["epsilon"] = ir.RefAttr("epsilon", "eps", ir.AttributeType.FLOAT)
    _node(original, "HcBlocks").attributes["eps"] = ir.AttrFloat32("eps", 0.5)  # large enough to matter
    model = original.clone()
    report = fuse_with_report(model)  # was TypeError
    assert len(report.fused) == 1 and report.rejected == []
    [fused] = [n for n in next(iter(model.functions.values())) if n.op_type == _op.OP_TYPE]
    epsilon = fused.attributes["epsilon"]
    assert epsilon.is_ref() and epsilon.ref_attr_name == "eps"
    _assert_same(original, model, hcfuse_lib, _embeds(2, 3))


def test_num_branches_by_reference_is_left_with_a_reason(hcfuse_lib):
    original = _model(1, packed=False, final_mix=False)
    function = _into_function(original, typed_inputs=True,
                              attributes=[ir.Attr("branches", ir.AttributeType.INT, C)])
    norm = next(n for n in function if n.op_type == _op.BRANCH_NORM)
    norm.attributes["num_branches"] = ir.RefAttr("num_branches", "branches", ir.AttributeType.INT)
    _node(original, "HcBlocks").attributes["branches"] = ir.AttrInt64("branches", C)
    model = original.clone()
    report = fuse_with_report(model)
    assert report.fused == []
    [rejected] = report.rejected
    assert "attribute num_branches of BranchwiseRMSNorm" in rejected.reason and "'branches'" in rejected.reason
    _assert_same(original, model, hcfuse_lib, _embeds(2, 3))


def test_per_feature_post_mix_with_h_equal_to_c_is_not_absorbed(hcfuse_lib):
    """post_mix (rows, C, H) with H == C ends in C like a (..., C) gate; with prev_block_output's shape
    unknown only the rank of streams tells the two apart."""
    h = c = 4
    original = ir.from_proto(make_decode_model(2, C=c, H=h, R=R, leading_dims=("rows",)))
    post = _node(original, _op.POST_MIX, 0)  # the prologue of block 1
    gate = ir.Value(name="post_mix", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["rows", c, h]))
    block_output = ir.Value(name="block_output", type=ir.TensorType(ir.DataType.FLOAT))
    original.graph.inputs.extend([gate, block_output])
    post.replace_input_with(1, block_output)
    post.replace_input_with(2, gate)
    model = original.clone()
    report = fuse_with_report(model)
    assert len(report.fused) == 2
    [rejected] = report.rejected
    assert rejected.reason.startswith("prologue not fused: post_mix 'post_mix' must be (..., 4) with the leading dims")
    assert not report.fused[1].prologue
    rng = np.random.default_rng(2)
    feeds = {"inputs_embeds": rng.standard_normal((3, h)).astype(np.float32),
             "post_mix": rng.standard_normal((3, c, h)).astype(np.float32),
             "block_output": rng.standard_normal((3, h)).astype(np.float32)}
    _assert_same(original, model, hcfuse_lib, feeds)  # was: "prev_post_gate must be (..., C) ... got (3, 4, 4)"


def test_rank_zero_is_left_because_the_fused_op_needs_r_at_least_one(hcfuse_lib):
    original = _model(1, packed=False)
    for index, shape in ((0, (C * H, 0)), (2, (0, C * H))):  # down and up MatMuls of block 0
        weight = _node(original, "MatMul", index).inputs[1]
        weight.const_value, weight.shape = ir.tensor(np.zeros(shape, np.float32)), ir.Shape(shape)
    for value in (_node(original, "MatMul", 0).outputs[0], _node(original, _op.SCALED_SILU, 0).outputs[0]):
        value.shape = ir.Shape(["batch", "seq", 0])
    model = original.clone()
    report = fuse_with_report(model)
    assert len(report.fused) == 1  # the final mix
    [rejected] = report.rejected
    assert "R >= 1" in rejected.reason
    _assert_same(original, model, hcfuse_lib, _embeds(2, 3))


@pytest.mark.parametrize("mutate", ["norm_C_float", "epsilon_string"])
def test_odd_attribute_types_give_reasons(mutate):
    model = _model(2)
    norm = _node(model, _op.BRANCH_NORM, 1)
    if mutate == "norm_C_float":
        norm.attributes["num_branches"] = ir.AttrFloat32("num_branches", 4.0)
    else:
        norm.attributes["epsilon"] = ir.AttrString("epsilon", "tiny")
    report = fuse_with_report(model)
    assert len(report.fused) == 2
    [rejected] = report.rejected
    assert "must be" in rejected.reason and "internal error" not in rejected.reason
    assert _fused_nodes(model)


def test_a_block_in_a_function_that_differs_from_the_stock_block_gets_a_reason():
    model = _model(1, packed=False, final_mix=False)
    function = _into_function(model, typed_inputs=True)
    next(n for n in function if n.op_type == "Sigmoid").op_type = "Tanh"
    report = fuse_with_report(model)
    assert report.fused == []
    [rejected] = report.rejected
    assert rejected.anchor.endswith("hc_norm") and "differ from the stock block" in rejected.reason


def _as_branch(model: ir.Model, outer_input: ir.Value, tag: str) -> ir.Graph:
    """model's graph as an If branch reading outer_input, every name prefixed with tag."""
    graph = model.graph
    [inner_input] = graph.inputs
    graph.inputs.clear()
    inner_input.replace_all_uses_with(outer_input)
    for value in list(graph.initializers.values()):
        value.name = tag + value.name  # renaming keeps the initializers dict in step
    for node in graph:
        node.name = tag + node.name
        for value in node.outputs:
            value.name = tag + value.name
    return graph


def test_chain_inside_an_if_branch_is_fused_there(hcfuse_lib):
    embeds = ir.Value(name="inputs_embeds", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", "seq", H]))
    cond = ir.Value(name="cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    then_branch = _as_branch(_model(2), embeds, "then")
    else_branch = _as_branch(_model(1, seed=1), embeds, "else")
    node = ir.node("If", [cond], {"then_branch": ir.AttrGraph("then_branch", then_branch),
                                  "else_branch": ir.AttrGraph("else_branch", else_branch)}, name="if")
    out = node.outputs[0]
    out.name, out.type = "hidden_states", ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph([cond, embeds], [out], nodes=[node], opset_imports={"": 21, _op.DOMAIN: 1})
    original = ir.Model(graph, ir_version=10)
    model = original.clone()
    report = fuse_with_report(model)
    assert len(report.fused) == 5 and report.rejected == []
    for branch in ("then_branch", "else_branch"):
        ops = [n.op_type for n in _node(model, "If").attributes[branch].value]
        assert _op.BRANCH_NORM not in ops and _op.OP_TYPE in ops
    for flag in (True, False):
        _assert_same(original, model, hcfuse_lib, {"cond": np.array(flag), **_embeds(2, 3)})


def test_blocks_left_in_if_branches_each_get_a_report_entry():
    """Unnamed nodes in two branches, a block in each that differs from the stock block: every block
    left unfused has its own entry, with its own anchor."""
    embeds = ir.Value(name="inputs_embeds", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", "seq", H]))
    cond = ir.Value(name="cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    branches = []
    for tag in ("then", "else"):
        branch = _as_branch(_model(2), embeds, tag)
        for node in branch:
            node.name = ""
        next(n for n in branch if n.op_type == "Sigmoid").op_type = "Tanh"  # block 0's up gate
        branch.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        branches.append(branch)
    node = ir.node("If", [cond], {"then_branch": ir.AttrGraph("then_branch", branches[0]),
                                  "else_branch": ir.AttrGraph("else_branch", branches[1])}, name="if")
    node.outputs[0].name, node.outputs[0].type = "hidden_states", ir.TensorType(ir.DataType.FLOAT)
    model = ir.Model(ir.Graph([cond, embeds], node.outputs, nodes=[node], opset_imports={"": 21, _op.DOMAIN: 1}),
                     ir_version=10)
    report = fuse_with_report(model)
    assert len(report.fused) == 4  # per branch: block 1 and the final mix
    blocks = [b for b in report.rejected if not b.reason.startswith("prologue not fused")]
    assert len(blocks) == 2 and len({b.anchor for b in blocks}) == 2 and all(b.anchor for b in blocks)
    assert all("differ from the stock block" in b.reason for b in blocks), blocks
