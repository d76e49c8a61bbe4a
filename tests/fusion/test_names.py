"""Names: every candidate has an anchor of its own in the report, the names the rewrite creates are new
in the whole model, and derived weights are keyed by what they are derived from and their layout."""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import _op
from hcfuse.rewrite import fuse_with_report
from tests.fusion._chain import C, H, assert_same_results, embeds, fused_nodes, initializer, node, stock_chain


def _expose(model: ir.Model, value: ir.Value, name: str) -> None:
    """Makes value observable: an Identity of it becomes an extra graph output."""
    identity = ir.node("Identity", [value], name=f"{name}/Identity")
    identity.outputs[0].name, identity.outputs[0].type, identity.outputs[0].shape = name, value.type, value.shape
    model.graph.append(identity)
    model.graph.outputs.append(identity.outputs[0])


def _all_names(model: ir.Model) -> tuple[list[str], list[str]]:
    values, nodes = [], []
    for graph in (*model.graphs(), *(f.graph for f in model.functions.values())):
        values += [v.name for v in graph.inputs if not v.is_initializer()] + list(graph.initializers)
        for n in graph:
            nodes.append(n.name)
            values += [v.name for v in n.outputs]
    return values, nodes


def _fuse(model: ir.Model):
    fused = model.clone()
    return fused, fuse_with_report(fused)


def test_unnamed_nodes_get_one_report_entry_each():
    """Exporters may leave nodes unnamed: each candidate still has its own anchor and reason."""
    m = stock_chain()
    for n in m.graph:
        n.name = ""
    m.graph.outputs.append(node(m, "Sigmoid", 2).outputs[0])  # block 1's up Sigmoid (g)
    report = fuse_with_report(m)
    assert len(report.fused) == 3 and len({block.anchor for block in report.fused}) == 3
    assert len({block.node for block in report.fused}) == 3
    [rejected] = report.rejected
    assert "is a graph output" in rejected.reason
    assert rejected.anchor == node(m, _op.BRANCH_NORM, 0).name and rejected.anchor
    assert rejected.anchor not in {block.anchor for block in report.fused}


@pytest.mark.parametrize("suffix", [".down", ".inject"])
def test_existing_tensor_named_like_a_packed_half_is_not_taken(hcfuse_lib, suffix):
    model = stock_chain(2)
    packed = node(model, "MatMul", 0).inputs[1]
    taken = initializer(model.graph, packed.name + suffix, np.full((3,), 7.0, np.float32))
    _expose(model, taken, "spy")
    fused, report = _fuse(model)
    assert len(report.fused) == 3
    weights = {v.name for n in fused_nodes(fused) for v in n.inputs}
    assert taken.name not in weights
    assert fused.graph.initializers[taken.name].const_value.numpy().tolist() == [7.0] * 3
    assert_same_results(model, fused, hcfuse_lib, embeds(2, 3, seed=0))


def test_existing_tensor_named_like_a_flattened_scale_is_not_taken(hcfuse_lib):
    model = stock_chain(1)
    norm = node(model, _op.BRANCH_NORM, 0)
    grouped = initializer(model.graph, "scale_ch", norm.inputs[1].const_value.numpy().reshape(C, H))
    norm.replace_input_with(1, grouped)
    taken = initializer(model.graph, "scale_ch.flat", np.zeros((C * H,), np.float32))
    _expose(model, taken, "spy")
    fused, report = _fuse(model)
    assert len(report.fused) == 2 and report.rejected == []
    scale = fused_nodes(fused)[0].inputs[1]
    assert scale.name != taken.name and scale.name.startswith("scale_ch.flat")
    assert_same_results(model, fused, hcfuse_lib, embeds(2, 3, seed=0))


def test_a_name_taken_only_inside_a_function_is_not_reused():
    model = stock_chain(1)
    packed = node(model, "MatMul", 0).inputs[1]
    x = ir.Value(name="x")
    body = ir.node("Identity", [x], name="f/Identity")
    body.outputs[0].name = packed.name + ".down"
    graph = ir.Graph([x], [body.outputs[0]], nodes=[body], opset_imports={"": 21})
    function = ir.Function("local", "F", "", graph=graph, attributes=())
    model.functions[function.identifier()] = function
    fused, report = _fuse(model)
    assert len(report.fused) == 2
    assert packed.name + ".down" not in fused.graph.initializers


def test_created_names_are_unique_in_the_model():
    model = stock_chain(6, num_weight_sets=2)
    fused, report = _fuse(model)
    assert len(report.fused) == 7
    values, nodes = _all_names(fused)
    repeated = [n for n, k in collections.Counter(values).items() if k > 1]
    assert not repeated, repeated
    repeated = [n for n, k in collections.Counter(nodes).items() if k > 1 and n]
    assert not repeated, repeated


def _merge(a: ir.Model, b: ir.Model, prefix: str) -> ir.Model:
    """b's nodes and weights moved into a (renamed with prefix), reading a's inputs_embeds; b's output
    becomes a's second output."""
    for value in list(b.graph.initializers.values()):
        b.graph.initializers.pop(value.name)
        value.name = prefix + value.name
        a.graph.register_initializer(value)
    [b_input] = b.graph.inputs
    b_input.replace_all_uses_with(a.graph.inputs[0])
    [b_output] = b.graph.outputs
    b.graph.outputs.clear()
    for moved in list(b.graph):
        b.graph.remove(moved)
        moved.name = prefix + moved.name
        for value in moved.outputs:
            value.name = prefix + value.name
        a.graph.append(moved)
    a.graph.outputs.append(b_output)
    return a


def test_one_shared_h_scale_in_blocks_of_different_c_gets_one_derived_scale_per_c(hcfuse_lib):
    a = stock_chain(1, leading_dims=("rows",))
    b = stock_chain(1, C=2, leading_dims=("rows",))
    model = _merge(a, b, "b")
    shared = initializer(model.graph, "shared_h_scale", np.linspace(0.5, 1.5, H).astype(np.float32))
    norms = [n for n in model.graph if n.op_type == _op.BRANCH_NORM]
    assert sorted(n.attributes["num_branches"].value for n in norms) == [2, 2, 4, 4]
    for norm in norms:
        norm.replace_input_with(1, shared)
    fused, report = _fuse(model)
    assert len(report.fused) == 4 and report.rejected == []
    scales = {}
    for node in fused_nodes(fused):
        scales.setdefault(node.attributes["num_branches"].value, set()).add(node.inputs[1])
    assert {c: [v.shape.dims for v in s] for c, s in scales.items()} == {4: [(4 * H,)], 2: [(2 * H,)]}
    assert_same_results(model, fused, hcfuse_lib, embeds(5, seed=0))
