"""Names the rewrite creates are new in the whole model, and derived weights are keyed by what they
are derived from and their layout (issue 10 item 5)."""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import _op
from hcfuse.rewrite import fuse_with_report
from tests._compare import cpu_session
from tests.fusion.test_fusion import C, H, _fused_nodes, _model, _node


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.tensor(array))
    graph.register_initializer(value)
    return value


def _expose(model: ir.Model, value: ir.Value, name: str) -> None:
    """Makes value observable: an Identity of it becomes an extra graph output."""
    node = ir.node("Identity", [value], name=f"{name}/Identity")
    node.outputs[0].name, node.outputs[0].type, node.outputs[0].shape = name, value.type, value.shape
    model.graph.append(node)
    model.graph.outputs.append(node.outputs[0])


def _assert_same_outputs(original: ir.Model, fused: ir.Model, library: str, leading=(2, 3)):
    feeds = {"inputs_embeds": np.random.default_rng(0).standard_normal((*leading, H)).astype(np.float32)}
    expected = cpu_session(ir.to_proto(original), None).run(None, feeds)
    actual = cpu_session(ir.to_proto(fused), library).run(None, feeds)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def _all_names(model: ir.Model) -> tuple[list[str], list[str]]:
    values, nodes = [], []
    for graph in (*model.graphs(), *(f.graph for f in model.functions.values())):
        values += [v.name for v in graph.inputs if not v.is_initializer()] + list(graph.initializers)
        for node in graph:
            nodes.append(node.name)
            values += [v.name for v in node.outputs]
    return values, nodes


def _fuse(model: ir.Model):
    fused = model.clone()
    return fused, fuse_with_report(fused)


@pytest.mark.parametrize("suffix", [".down", ".inject"])
def test_existing_tensor_named_like_a_packed_half_is_not_taken(hcfuse_lib, suffix):
    model = _model(2)
    packed = _node(model, "MatMul", 0).inputs[1]
    taken = _initializer(model.graph, packed.name + suffix, np.full((3,), 7.0, np.float32))
    _expose(model, taken, "spy")
    fused, report = _fuse(model)
    assert len(report.fused) == 3
    weights = {v.name for node in _fused_nodes(fused) for v in node.inputs}
    assert taken.name not in weights
    assert fused.graph.initializers[taken.name].const_value.numpy().tolist() == [7.0] * 3
    _assert_same_outputs(model, fused, hcfuse_lib)


def test_existing_tensor_named_like_a_flattened_scale_is_not_taken(hcfuse_lib):
    model = _model(1)
    norm = _node(model, _op.BRANCH_NORM, 0)
    grouped = _initializer(model.graph, "scale_ch", norm.inputs[1].const_value.numpy().reshape(C, H))
    norm.replace_input_with(1, grouped)
    taken = _initializer(model.graph, "scale_ch.flat", np.zeros((C * H,), np.float32))
    _expose(model, taken, "spy")
    fused, report = _fuse(model)
    assert len(report.fused) == 2 and report.rejected == []
    scale = _fused_nodes(fused)[0].inputs[1]
    assert scale.name != taken.name and scale.name.startswith("scale_ch.flat")
    _assert_same_outputs(model, fused, hcfuse_lib)


def test_a_name_taken_only_inside_a_function_is_not_reused():
    model = _model(1)
    packed = _node(model, "MatMul", 0).inputs[1]
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
    model = _model(6, num_weight_sets=2)
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
    for node in list(b.graph):
        b.graph.remove(node)
        node.name = prefix + node.name
        for value in node.outputs:
            value.name = prefix + value.name
        a.graph.append(node)
    a.graph.outputs.append(b_output)
    return a


def test_one_shared_h_scale_in_blocks_of_different_c_gets_one_derived_scale_per_c(hcfuse_lib):
    a = _model(1, leading_dims=("rows",))
    b = _model(1, C=2, leading_dims=("rows",))
    model = _merge(a, b, "b")
    shared = _initializer(model.graph, "shared_h_scale", np.linspace(0.5, 1.5, H).astype(np.float32))
    norms = [n for n in model.graph if n.op_type == _op.BRANCH_NORM]
    assert sorted(n.attributes["num_branches"].value for n in norms) == [2, 2, 4, 4]
    for norm in norms:
        norm.replace_input_with(1, shared)
    fused, report = _fuse(model)
    assert len(report.fused) == 4 and report.rejected == []
    scales = {}
    for node in _fused_nodes(fused):
        scales.setdefault(node.attributes["num_branches"].value, set()).add(node.inputs[1])
    assert {c: [v.shape.dims for v in s] for c, s in scales.items()} == {4: [(4 * H,)], 2: [(2 * H,)]}
    _assert_same_outputs(model, fused, hcfuse_lib, leading=(5,))
