"""Models onnxruntime runs whatever their main graph's node order: the pass sorts before matching, fuses a
shuffled model as it fuses the sorted one, and gives the caller's order back where nothing fused
(hcfuse/rewrite/sort_order.py). Also the other structural liberties onnxruntime takes."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import hcfuse
from hcfuse import _op
from hcfuse.checking.verification import verify
from hcfuse.models.genai_expansion import make_expansion_model
from hcfuse.models.qwen_decode import make_decode_model
from hcfuse.rewrite import fuse_with_report
from tests._compare import cpu_session

C, H, R = 4, 16, 8
FORMS = {
    "contrib": lambda: make_decode_model(3, C=C, H=H, R=R, final_mix=True),
    "genai_expansion": lambda: make_expansion_model(3, C=C, H=H, R=R, final_mix=True),
}


def _shuffled(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = list(copy.graph.node)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes[i] for i in np.random.default_rng(seed).permutation(len(nodes)))
    return copy


def _order(model: onnx.ModelProto) -> list[tuple]:
    return [(node.op_type, tuple(node.output)) for node in model.graph.node]


def _decisions(report) -> tuple:
    return (sorted((b.rule, b.node, b.prologue) for b in report.fused),
            sorted((r.rule, r.anchor, r.reason) for r in report.rejected))


def _is_sorted(model: onnx.ModelProto) -> bool:
    seen = {v.name for v in model.graph.input} | {t.name for t in model.graph.initializer} | {""}
    for node in model.graph.node:
        if not set(node.input) <= seen:
            return False
        seen |= set(node.output)
    return True


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_shuffled_model_fuses_as_the_sorted_one_and_verifies(hcfuse_lib, form):
    model = FORMS[form]()
    fused, report = hcfuse.optimize_with_report(model)
    assert len(report.fused) == 4
    for seed in range(3):
        shuffled = _shuffled(model, seed)
        assert not _is_sorted(shuffled)
        feeds = {"inputs_embeds": np.random.default_rng(seed).standard_normal((2, 3, H)).astype(np.float32)}
        cpu_session(shuffled).run(None, feeds)  # onnxruntime sorts it itself
        fused_shuffled, shuffled_report = hcfuse.optimize_with_report(shuffled)
        assert _decisions(shuffled_report) == _decisions(report)
        assert _is_sorted(fused_shuffled)
        onnx.checker.check_model(fused_shuffled)
        assert _order(fused_shuffled) == _order(fused)  # here the sort gives the sorted model's order back
        result = verify(shuffled, fused_shuffled, providers=["CPUExecutionProvider"], seed=seed)
        assert result.passed, result.summary()


def test_nothing_fused_keeps_the_callers_order():
    """Blocks the pass refuses (every Sigmoid made a Tanh): the model comes back node for node in the
    caller's unsorted order, which onnxruntime still runs."""
    model = _shuffled(FORMS["genai_expansion"](), 5)
    for node in model.graph.node:
        if node.op_type == "Sigmoid":
            node.op_type = "Tanh"
    out, report = hcfuse.optimize_with_report(model)
    assert not report.fused and report.rejected
    assert _order(out) == _order(model) and not _is_sorted(out)
    feeds = {"inputs_embeds": np.ones((1, 2, H), np.float32)}
    np.testing.assert_array_equal(cpu_session(out).run(None, feeds)[0], cpu_session(model).run(None, feeds)[0])


def test_a_graph_without_fusions_keeps_its_order_beside_one_with_them():
    """The main graph fuses and comes out sorted; a model-local function beside it, with nothing to
    fuse, keeps its nodes in the caller's order, unsorted as it is here."""
    model = ir.from_proto(_shuffled(FORMS["contrib"](), 1))
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    a, b = ir.node("Neg", [x], name="a"), ir.node("Relu", [x], name="b")
    c = ir.node("Add", [a.outputs[0], b.outputs[0]], name="c")
    body = ir.Graph([x], c.outputs, nodes=[c, b, a], opset_imports={"": 21}, name="f")
    function = ir.Function("local", "F", "", graph=body, attributes=[])
    model.functions[function.identifier()] = function
    report = fuse_with_report(model)
    assert len(report.fused) == 4 and _is_sorted(ir.to_proto(model))
    assert [n.name for n in function] == ["c", "b", "a"]


def test_a_cycle_is_one_clear_line():
    graph = helper.make_graph([helper.make_node("Neg", ["b"], ["a"], name="first"),
                               helper.make_node("Relu", ["a"], ["b"], name="second")], "cyclic",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    with pytest.raises(ValueError, match=r"^hcfuse: the graph 'cyclic' has a cycle: its nodes cannot be ordered"):
        hcfuse.optimize(model)


def _sparse_model() -> onnx.ModelProto:
    values = onnx.numpy_helper.from_array(np.array([5.0], np.float32), "k")
    sparse = helper.make_sparse_tensor(values, onnx.numpy_helper.from_array(np.array([1], np.int64), "k_i"), [2])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"], name="scale")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              sparse_initializer=[sparse])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_sparse_initializers_come_back_dense():
    """onnx-ir drops sparse initializers (onnxruntime reads them): optimize makes them dense initializers
    of the same name and values, on a copy, so the model it returns computes what the input did."""
    model = _sparse_model()
    before = model.SerializeToString()
    x = {"x": np.ones(2, np.float32)}
    assert cpu_session(model).run(None, x)[0].tolist() == [0.0, 5.0]
    out = hcfuse.optimize(model)
    assert model.SerializeToString() == before
    assert [t.name for t in out.graph.initializer] == ["k"] and not out.graph.sparse_initializer
    assert cpu_session(out).run(None, x)[0].tolist() == [0.0, 5.0]


def test_sparse_initializers_in_a_file_come_back_dense(tmp_path):
    src, dst = tmp_path / "sparse.onnx", tmp_path / "out.onnx"
    onnx.save(_sparse_model(), src)
    hcfuse.optimize_file(src, dst)
    out = onnx.load(dst)
    assert not out.graph.sparse_initializer
    assert cpu_session(out).run(None, {"x": np.ones(2, np.float32)})[0].tolist() == [0.0, 5.0]


def test_a_value_defined_nowhere_is_one_clear_line():
    """An onnx_ir.Model made from a proto with a sparse initializer has lost it: what read it reads a value
    defined nowhere, and the fused model would not load; the pass says so instead of writing it."""
    model = ir.from_proto(_sparse_model())
    with pytest.raises(ValueError, match=r"^hcfuse: node 'scale' reads 'k', which the model defines nowhere"):
        hcfuse.optimize(model)


def _liberty(form: str, edit) -> onnx.ModelProto:
    model = FORMS[form]()
    edit(model.graph)
    return model


def _dangling_node(graph):
    graph.node.append(helper.make_node("Neg", [graph.input[0].name], ["dangling"], name="dangling"))


def _value_info_of_nothing(graph):
    graph.value_info.append(helper.make_tensor_value_info("not_in_the_graph", TensorProto.FLOAT, [3]))


def _duplicate_initializer(graph):
    graph.initializer.append(graph.initializer[0])  # onnxruntime and onnx-ir both take the last


def _input_shadowing_an_initializer(graph):
    init = next(t for t in graph.initializer if t.name.endswith("hc_norm.weight"))
    graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))


def _initializer_and_input_as_outputs(graph):
    graph.output.append(graph.input[0])  # declared as the input (onnx-ir keeps the output's declaration)
    graph.output.append(helper.make_tensor_value_info(graph.initializer[0].name, TensorProto.FLOAT, None))


def _ai_onnx_domain(graph):
    for node in graph.node:
        if node.domain == "":
            node.domain = "ai.onnx"


def _output_without_type(graph):
    graph.output[0].type.Clear()


LIBERTIES = {f.__name__.lstrip("_"): f for f in (
    _dangling_node, _value_info_of_nothing, _duplicate_initializer, _input_shadowing_an_initializer,
    _initializer_and_input_as_outputs, _ai_onnx_domain, _output_without_type)}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("liberty", sorted(LIBERTIES))
def test_structural_liberties_onnxruntime_takes(hcfuse_lib, form, liberty):
    """Each model runs in onnxruntime; shuffled too, the pass fuses every block it fuses unshuffled
    (an overridable norm weight still fuses: it is the fused node's input as it is) and the result
    verifies."""
    model = _liberty(form, LIBERTIES[liberty])
    fused, report = hcfuse.optimize_with_report(model)
    assert len(report.fused) == 4, report.to_dict()
    shuffled = _shuffled(model, 11)
    fused_shuffled, shuffled_report = hcfuse.optimize_with_report(shuffled)
    assert _decisions(shuffled_report) == _decisions(report)
    assert [n.op_type for n in fused_shuffled.graph.node].count(_op.OP_TYPE) == 4
    result = verify(shuffled, fused_shuffled, providers=["CPUExecutionProvider"])
    assert result.passed, result.summary()
