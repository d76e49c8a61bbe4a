"""hcfuse.unfuse: fused nodes back into the stock contrib-op chain, run by a plain onnxruntime (CPU,
no hcfuse library registered)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import hcfuse
from hcfuse import _op, reference
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights
from hcfuse.models.qwen_decode import make_decode_model
from hcfuse.checking.unfusion import unfuse as unfuse_in_place
from hcfuse.checking.verification import DEFAULT_MAX_ULP, ulp_gap
from tests._compare import run_stock

C, H, R = 4, 16, 8
ATTRS = dict(epsilon=1e-6, reduction_scale=0.25, silu_alpha=0.25, gate_div=4.0, gate_mul=2.0)
CHAIN_OPS = {*_op.CHAIN_CONTRIB_OPS, "MatMul", "Sigmoid", "Div", "Mul"}


def op_types(model) -> collections.Counter:
    graph = (ir.from_proto(model) if isinstance(model, onnx.ModelProto) else model).graph
    return collections.Counter(node.op_type for node in graph)


def fused_node_model(dtype, *, prologue, streams_out, rng, **attrs):
    weights = random_weights(C, H, R, dtype, rng)
    attrs = {**ATTRS, **attrs}
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=prologue, streams_out=streams_out,
                                  weights_as_inputs=False, weights=weights, **attrs)
    return model, weights, attrs


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("prologue", [False, True])
@pytest.mark.parametrize("streams_out", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 5])
def test_unfused_node_matches_reference(dtype, prologue, streams_out, rows, rng):
    model, weights, attrs = fused_node_model(dtype, prologue=prologue, streams_out=streams_out, rng=rng)
    unfused = hcfuse.unfuse(model)
    onnx.checker.check_model(unfused)
    ops = op_types(unfused)
    assert _op.OP_TYPE not in ops
    assert ops[_op.POST_MIX] == int(prologue)
    assert ops["MatMul"] == 3 and ops["Div"] == 1 and ops["Mul"] == 1 and ops["Sigmoid"] == 2
    assert ops["Identity"] == int(streams_out and not prologue)

    feeds = random_activations((rows,), C, H, dtype, rng, prologue=prologue)
    got = run_stock(unfused, feeds)
    expected = dict(zip(_op.OUTPUTS, reference.hc_lowrank_mix(**feeds, **weights, num_branches=C, **attrs)))
    assert set(got) == set(_op.OUTPUTS[: 3 if streams_out else 2])
    bound = DEFAULT_MAX_ULP[ir.DataType.from_numpy(np.dtype(dtype))]
    for name, value in got.items():
        assert value.shape == expected[name].shape, f"{name}: shape {value.shape} != {expected[name].shape}"
        gap = ulp_gap(expected[name], value, ir.DataType.from_numpy(value.dtype))
        assert gap <= bound, f"{name} {dtype.__name__} rows={rows} prologue={prologue}: {gap} ulp > {bound}"
    if streams_out:  # S exactly: the prologue is one rounding in both, a copy without it
        s = expected["streams_out"]
        np.testing.assert_array_equal(got["streams_out"], s)


@pytest.mark.parametrize("gate_div, gate_mul, divs, muls", [(1.0, 1.0, 0, 0), (4.0, 1.0, 1, 0), (1.0, 2.0, 0, 1)])
def test_unit_gate_constants_are_left_out(gate_div, gate_mul, divs, muls, rng):
    model, weights, attrs = fused_node_model(np.float32, prologue=True, streams_out=False, rng=rng,
                                             gate_div=gate_div, gate_mul=gate_mul)
    unfused = hcfuse.unfuse(model)
    ops = op_types(unfused)
    assert (ops["Div"], ops["Mul"]) == (divs, muls)
    feeds = random_activations((3,), C, H, np.float32, rng, prologue=True)
    got = run_stock(unfused, feeds)
    expected = reference.hc_lowrank_mix(**feeds, **weights, num_branches=C, **attrs)
    assert ulp_gap(expected[1], got["post_gate"], ir.DataType.FLOAT) <= DEFAULT_MAX_ULP[ir.DataType.FLOAT]


def test_attribute_defaults_when_absent(rng):
    """A fused node without optional attributes unfuses with the op's defaults (epsilon 1e-5, ...)."""
    model, weights, _ = fused_node_model(np.float32, prologue=False, streams_out=False, rng=rng)
    node = model.graph.node[0]
    del node.attribute[:]
    node.attribute.append(onnx.helper.make_attribute("num_branches", C))
    unfused = ir.from_proto(hcfuse.unfuse(model))
    norm = next(n for n in unfused.graph if n.op_type == _op.BRANCH_NORM)
    assert norm.attributes["epsilon"].value == pytest.approx(_op.ATTRIBUTES["epsilon"])
    assert not any(n.op_type in ("Div", "Mul") for n in unfused.graph)
    feeds = random_activations((2,), C, H, np.float32, rng)
    got = run_stock(ir.to_proto(unfused), feeds)
    expected = reference.hc_lowrank_mix(**feeds, **weights, num_branches=C)
    assert ulp_gap(expected[0], got["pre_output"], ir.DataType.FLOAT) <= DEFAULT_MAX_ULP[ir.DataType.FLOAT]


def test_input_untouched_and_kind_kept(rng):
    model, _, _ = fused_node_model(np.float16, prologue=True, streams_out=True, rng=rng)
    before = model.SerializeToString()
    assert isinstance(hcfuse.unfuse(model), onnx.ModelProto)
    assert model.SerializeToString() == before
    ir_model = ir.from_proto(model)
    ir_before = ir.to_proto(ir_model).SerializeToString()
    out = hcfuse.unfuse(ir_model)
    assert isinstance(out, ir.Model) and out is not ir_model
    assert ir.to_proto(ir_model).SerializeToString() == ir_before


def test_fused_nodes_sharing_a_name_expand_to_distinct_names():
    """Node names need not be unique; the expanded chains' node and value names must be (SSA)."""
    model = hcfuse.optimize(make_decode_model(3, C=C, H=H, R=R))
    for node in model.graph.node:
        if node.op_type == _op.OP_TYPE:
            node.name = "hc"
    unfused = hcfuse.unfuse(model)
    onnx.checker.check_model(unfused, full_check=True)
    names = [n.name for n in unfused.graph.node]
    assert len(names) == len(set(names))
    ort.InferenceSession(unfused.SerializeToString(), providers=["CPUExecutionProvider"])


def test_no_fused_nodes_is_a_no_op():
    model = ir.from_proto(make_decode_model(2, C=C, H=H, R=R))
    before = op_types(model)
    assert unfuse_in_place(model) == 0
    assert op_types(model) == before


def test_missing_num_branches_names_the_node(rng):
    model, _, _ = fused_node_model(np.float32, prologue=False, streams_out=False, rng=rng)
    del model.graph.node[0].attribute[:]
    with pytest.raises(ValueError, match=r"HyperConnectionLowRankMix node 'hc_lowrank_mix': attribute num_branches"):
        hcfuse.unfuse(model)


def test_unknown_element_type_names_the_node():
    streams = ir.Value(name="streams")
    weights = [ir.Value(name=n) for n in _op.WEIGHT_INPUTS]
    node = ir.Node(_op.DOMAIN, _op.OP_TYPE, [streams, *weights], [ir.AttrInt64("num_branches", C)],
                   num_outputs=2, name="fused0")
    graph = ir.Graph([streams, *weights], node.outputs, nodes=[node], opset_imports={"": 21, _op.DOMAIN: 1})
    with pytest.raises(ValueError, match="node 'fused0': element type T unknown"):
        unfuse_in_place(ir.Model(graph, ir_version=10))


# --- round trips with the fusion pass, on the exporter-shaped decode graphs of models/


def decode_feeds(model: onnx.ModelProto, dtype, rng, rows=(2, 3)):
    return {"inputs_embeds": rng.standard_normal((*rows, H)).astype(dtype)}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("packed", [True, False])
def test_unfuse_of_optimize_computes_the_original(dtype, packed, rng):
    original = make_decode_model(4, C=C, H=H, R=R, dtype=dtype, packed=packed)
    fused, report = hcfuse.optimize_with_report(original)
    assert sum(report.counts_by_rule().values()) == 4
    unfused = hcfuse.unfuse(fused)
    ops = op_types(unfused)
    assert _op.OP_TYPE not in ops and ops[_op.BRANCH_NORM] == 4
    feeds = decode_feeds(original, dtype, rng)
    expected = run_stock(original, feeds)["hidden_states"]
    got = run_stock(unfused, feeds)["hidden_states"]
    gap = ulp_gap(expected, got, ir.DataType.from_numpy(np.dtype(dtype)))
    # the same stock ops in the same order; only a packed MatMul split in two may sum differently
    assert gap <= DEFAULT_MAX_ULP[ir.DataType.from_numpy(np.dtype(dtype))], f"{gap} ulp"


def fused_signature(model: onnx.ModelProto):
    """The fused nodes' inputs' shapes and attributes, in graph order."""
    m = ir.from_proto(model)
    return [
        (tuple(tuple(v.shape) if v is not None and v.shape is not None else None for v in n.inputs),
         {k: a.value for k, a in n.attributes.items()}, len(n.outputs))
        for n in m.graph if n.op_type == _op.OP_TYPE
    ]


@pytest.mark.parametrize("packed", [True, False])
def test_optimize_unfuse_optimize_is_stable(packed):
    once = hcfuse.optimize(make_decode_model(5, C=C, H=H, R=R, packed=packed))
    unfused = hcfuse.unfuse(once)
    twice, report = hcfuse.optimize_with_report(unfused)
    assert sum(report.counts_by_rule().values()) == 5
    assert op_types(twice) == op_types(once)
    assert fused_signature(twice) == fused_signature(once)
    # unfuse writes the shared constants once per value, not once per block
    inits = ir.from_proto(unfused).graph.initializers
    assert len([n for n in inits if n.startswith("/model/constants/FLOAT/")]) == 2


def test_fused_models_say_where_their_kernels_come_from_and_unfused_ones_do_not():
    stock = make_decode_model(2, C=C, H=H, R=R, final_mix=True)
    fused = hcfuse.optimize(stock)
    entry = {p.key: p.value for p in fused.metadata_props}.get("hcfuse.library", "")
    assert "hcfuse.register" in entry, entry
    assert "hcfuse.library" not in {p.key for p in hcfuse.unfuse(fused).metadata_props}
    assert "hcfuse.library" not in {p.key for p in hcfuse.optimize(onnx.ModelProto()).metadata_props}
