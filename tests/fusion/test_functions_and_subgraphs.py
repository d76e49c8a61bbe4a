"""Functions and subgraphs: chains inside model-local functions (typed inputs, derived weights as
Constant nodes, reference attributes) and inside If branches are fused there, or left with a reason;
the optimized model runs in onnxruntime and matches."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import _op
from hcfuse.rewrite import fuse_with_report
from tests.fusion._chain import C, H, assert_same_results, embeds, node, stock_chain


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
            constant = ir.node("Constant", [], {"value": weight.const_value}, name=f"{weight.name}/Constant")
            output = constant.outputs[0]
            output.name, output.type, output.shape = weight.name, weight.type, weight.shape
            constants.append(constant)
            outer.append(weight)
            inner.append(output)
    for old, new in zip(outer, inner):
        for user, index in list(old.uses()):
            user.replace_input_with(index, new)
    if constants_inside:
        graph.initializers.clear()
        outer = outer[:1]
    [out] = graph.outputs
    graph.outputs.clear()
    nodes = list(graph)
    for moved in nodes:
        graph.remove(moved)
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
    original = stock_chain(2, packed=False, final_mix=False)
    _into_function(original, typed_inputs=True)
    model = original.clone()
    report = fuse_with_report(model)
    assert len(report.fused) == 2 and report.rejected == []
    body = next(iter(model.functions.values()))
    assert [n.op_type for n in body].count(_op.OP_TYPE) == 2
    assert_same_results(original, model, hcfuse_lib, embeds(2, 3))


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
def test_chain_inside_a_function_with_derived_weights_is_fused_there(hcfuse_lib, packed):
    """Packed halves, a shared (H) norm scale and the final mix's zero inject weight become Constant
    nodes in the function (which holds no initializers)."""
    original = stock_chain(2, packed=packed, final_mix=True)
    norm = node(original, _op.BRANCH_NORM, 1)
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
    assert_same_results(original, model, hcfuse_lib, embeds(2, 3))


def test_float_reference_attribute_passes_on_to_the_fused_node(hcfuse_lib):
    original = stock_chain(1, packed=False, final_mix=False)
    function = _into_function(original, typed_inputs=True,
                              attributes=[ir.Attr("eps", ir.AttributeType.FLOAT, 1e-5)])
    norm = next(n for n in function if n.op_type == _op.BRANCH_NORM)
    norm.attributes["epsilon"] = ir.RefAttr("epsilon", "eps", ir.AttributeType.FLOAT)
    node(original, "HcBlocks").attributes["eps"] = ir.AttrFloat32("eps", 0.5)  # large enough to matter
    model = original.clone()
    report = fuse_with_report(model)
    assert len(report.fused) == 1 and report.rejected == []
    [fused] = [n for n in next(iter(model.functions.values())) if n.op_type == _op.OP_TYPE]
    epsilon = fused.attributes["epsilon"]
    assert epsilon.is_ref() and epsilon.ref_attr_name == "eps"
    assert_same_results(original, model, hcfuse_lib, embeds(2, 3))


def _untyped_inputs(m: ir.Model) -> None:
    _into_function(m, typed_inputs=False)


def _num_branches_by_reference(m: ir.Model) -> None:
    function = _into_function(m, typed_inputs=True, attributes=[ir.Attr("branches", ir.AttributeType.INT, C)])
    norm = next(n for n in function if n.op_type == _op.BRANCH_NORM)
    norm.attributes["num_branches"] = ir.RefAttr("num_branches", "branches", ir.AttributeType.INT)
    node(m, "HcBlocks").attributes["branches"] = ir.AttrInt64("branches", C)


def _tanh_up_gate(m: ir.Model) -> None:
    function = _into_function(m, typed_inputs=True)
    next(n for n in function if n.op_type == "Sigmoid").op_type = "Tanh"


LEFT_IN_FUNCTIONS = {  # edit -> what the reason says
    "untyped-inputs": (_untyped_inputs, ("must be a 2-D weight of known shape; got None",)),
    "num-branches-by-reference": (_num_branches_by_reference,
                                  ("attribute num_branches of BranchwiseRMSNorm", "'branches'")),
    "block-differs-from-the-stock-block": (_tanh_up_gate, ("differ from the stock block",)),
}


@pytest.mark.parametrize("edit, says", LEFT_IN_FUNCTIONS.values(), ids=LEFT_IN_FUNCTIONS.keys())
def test_a_block_in_a_function_is_left_with_a_reason(hcfuse_lib, edit, says):
    original = stock_chain(1, packed=False, final_mix=False)
    edit(original)
    model = original.clone()
    report = fuse_with_report(model)
    assert report.fused == []
    [rejected] = report.rejected
    assert rejected.anchor.endswith("hc_norm"), rejected.anchor
    assert all(words in rejected.reason for words in says), rejected.reason
    assert_same_results(original, model, hcfuse_lib, embeds(2, 3))


def _as_branch(model: ir.Model, outer_input: ir.Value, tag: str) -> ir.Graph:
    """model's graph as an If branch reading outer_input, every name prefixed with tag."""
    graph = model.graph
    [inner_input] = graph.inputs
    graph.inputs.clear()
    inner_input.replace_all_uses_with(outer_input)
    for value in list(graph.initializers.values()):
        value.name = tag + value.name  # renaming keeps the initializers dict in step
    for n in graph:
        n.name = tag + n.name
        for value in n.outputs:
            value.name = tag + value.name
    return graph


def _if_model(then_branch: ir.Graph, else_branch: ir.Graph, outer: ir.Value) -> ir.Model:
    """A model whose one node is an If (on input cond) between the two branches, which read outer."""
    cond = ir.Value(name="cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    if_node = ir.node("If", [cond], {"then_branch": ir.AttrGraph("then_branch", then_branch),
                                     "else_branch": ir.AttrGraph("else_branch", else_branch)}, name="if")
    out = if_node.outputs[0]
    out.name, out.type = "hidden_states", ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph([cond, outer], [out], nodes=[if_node], opset_imports={"": 21, _op.DOMAIN: 1})
    return ir.Model(graph, ir_version=10)


def _embeds_value() -> ir.Value:
    return ir.Value(name="inputs_embeds", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", "seq", H]))


def test_chain_inside_an_if_branch_is_fused_there(hcfuse_lib):
    outer = _embeds_value()
    original = _if_model(_as_branch(stock_chain(2), outer, "then"), _as_branch(stock_chain(1, seed=1), outer, "else"),
                         outer)
    model = original.clone()
    report = fuse_with_report(model)
    assert len(report.fused) == 5 and report.rejected == []
    for branch in ("then_branch", "else_branch"):
        ops = [n.op_type for n in node(model, "If").attributes[branch].value]
        assert _op.BRANCH_NORM not in ops and _op.OP_TYPE in ops
    for flag in (True, False):
        assert_same_results(original, model, hcfuse_lib, {"cond": np.array(flag), **embeds(2, 3)})


def test_blocks_left_in_if_branches_each_get_a_report_entry():
    """Unnamed nodes in two branches, a block in each that differs from the stock block: every block
    left unfused has its own entry, with its own anchor."""
    outer = _embeds_value()
    branches = []
    for tag in ("then", "else"):
        branch = _as_branch(stock_chain(2), outer, tag)
        for n in branch:
            n.name = ""
        next(n for n in branch if n.op_type == "Sigmoid").op_type = "Tanh"  # block 0's up gate
        branch.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        branches.append(branch)
    report = fuse_with_report(_if_model(*branches, outer))
    assert len(report.fused) == 4  # per branch: block 1 and the final mix
    blocks = [b for b in report.rejected if not b.reason.startswith("prologue not fused")]
    assert len(blocks) == 2 and len({b.anchor for b in blocks}) == 2 and all(b.anchor for b in blocks)
    assert all("differ from the stock block" in b.reason for b in blocks), blocks
