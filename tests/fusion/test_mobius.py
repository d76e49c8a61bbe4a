"""The block as onnxruntime's mobius exporter writes it (hcfuse/models/mobius_block.py) fuses into the same node.

Numerics: mobius's norm computes in float32 with the weight + 1 in float32 and rounds once; the fused op
reads the weight + 1 rounded to T (the fused model computes Cast(Add(Cast(w), 1), T) from constants,
which onnxruntime folds at session start). mobius rounds Div(x, C), each pre-mix product and the mean
where the fused op rounds x * (1/C) and one float32 sum (hcfuse/rewrite/mobius_rules.py). Measured with
hcfuse.checking.verification (onnxruntime CPU, 3 seeds, 4 rows per symbolic dim), mobius model against
the fused one, the pre-mix mean in float32 or in T alike: at the full Qwen size (C=4, H=2560, R=320),
8 blocks + the final mixer: float32 35-45 ulp, float16 4.3-5 ulp; 96 blocks + the final mixer at H=512,
R=64: float32 39-41 ulp, float16 9-11 ulp. verify's bounds are 512 (float32) and 32 (float16, bfloat16)
ulp, so the block is fused. bfloat16 (what mobius exports) cannot run on onnxruntime's CPU stock ops: its
gap is measured on a GPU.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import hcfuse
from hcfuse import _op
from hcfuse.checking.verification import verify
from hcfuse.models.mobius_block import build_mobius_model, make_mobius_model
from hcfuse.rewrite import fuse_with_report

C, H, R = 4, 16, 8
BLOCK_OPS = {"Shape", "Cast", "Reshape", "Mul", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Div", "Swish",
             "Sigmoid", "Unsqueeze", "Constant"}
# Largest gap (ulp, verify's measure) at these sizes, with margin.
SMALL_BOUND = {np.float32: 64.0, np.float16: 4.0}


def _ops(model) -> collections.Counter:
    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    return collections.Counter(n.op_type for n in nodes)


def _gap(original, fused, seed=0) -> float:
    result = verify(original, fused, providers=["CPUExecutionProvider"], seed=seed, rows=3)
    assert result.passed, result.summary()
    return result.outputs[0].max_ulp


def test_models_are_shaped_like_the_exporters_output():
    """Names, constant forms, casts and opsets of one float16 block as mobius writes it."""
    model = make_mobius_model(1, C=C, H=H, R=R, dtype=np.float16, final_mix=False)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 24)] and model.ir_version == 11
    p, v = "model/layers.0/attn_hyper_connection", "v_model.layers.0.attn_hyper_connection"
    w = "model.layers.0.attn_hyper_connection"
    nodes = {n.name: n for n in model.graph.node}
    expected = [  # (node, op, inputs) in the exporter's order
        ("model/Concat_node_0", "Concat", ["inputs_embeds"] * C),
        (f"{p}/hc_norm/Shape_node_1", "Shape", ["v_model.Concat_0"]),
        (f"{p}/hc_norm/Cast_node_2", "Cast", ["v_model.Concat_0"]),
        (f"{p}/hc_norm/Reshape_node_3", "Reshape", [f"{v}.hc_norm.Cast_2", "const_1d_0"]),
        (f"{p}/hc_norm/Mul_node_4", "Mul", [f"{v}.hc_norm.Reshape_3"] * 2),
        (f"{p}/hc_norm/ReduceMean_node_5", "ReduceMean", [f"{v}.hc_norm.Mul_4", "const_1d_1"]),
        (f"{p}/hc_norm/Add_node_6", "Add", [f"{v}.hc_norm.ReduceMean_5", "const_1e-06_f32"]),
        (f"{p}/hc_norm/Sqrt_node_7", "Sqrt", [f"{v}.hc_norm.Add_6"]),
        (f"{p}/hc_norm/Reciprocal_node_8", "Reciprocal", [f"{v}.hc_norm.Sqrt_7"]),
        (f"{p}/hc_norm/Mul_node_9", "Mul", [f"{v}.hc_norm.Reshape_3", f"{v}.hc_norm.Reciprocal_8"]),
        ("model/Constant_node_10", "Constant", []),
        (f"{p}/hc_norm/Cast_node_11", "Cast", [f"{w}.hc_norm.weight"]),
        (f"{p}/hc_norm/Add_node_12", "Add", [f"{v}.hc_norm.Cast_11", "v_model.Constant_10"]),
        (f"{p}/hc_norm/Reshape_node_13", "Reshape", [f"{v}.hc_norm.Add_12", "const_1d_2"]),
        (f"{p}/hc_norm/Mul_node_14", "Mul", [f"{v}.hc_norm.Mul_9", f"{v}.hc_norm.Reshape_13"]),
        (f"{p}/hc_norm/Reshape_node_15", "Reshape", [f"{v}.hc_norm.Mul_14", f"{v}.hc_norm.Shape_1"]),
        (f"{p}/hc_norm/Cast_node_16", "Cast", [f"{v}.hc_norm.Reshape_15"]),
        (f"{p}/input_mix_weight_down/MatMul_node_17", "MatMul", [f"{v}.hc_norm.Cast_16",
                                                                 f"{w}.input_mix_weight_down.weight_t"]),
        (f"{p}/Div_node_18", "Div", [f"{v}.input_mix_weight_down.MatMul_17", "const_4.0_f16"]),
        (f"{p}/Swish_node_19", "Swish", [f"{v}.Div_18"]),
    ]
    assert [(n.name, n.op_type, list(n.input)) for n in model.graph.node[:len(expected)]] == expected
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    assert inits["const_1d_0"].tolist() == [-1, C, H] and inits["const_1d_2"].tolist() == [C, H]
    assert inits["const_1e-06_f32"].dtype == np.float32 and inits["const_4.0_f16"].dtype == np.float16
    assert inits[f"{w}.input_mix_weight_down.weight_t"].shape == (C * H, R)  # [in, out]
    one = nodes["model/Constant_node_10"].attribute[0]
    assert (one.name, one.f) == ("value_float", 1.0)
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert [a.i for n in casts for a in n.attribute] == [1, 1, 10, 1, 10]  # FLOAT, FLOAT, T, the pre-mix's two
    post = [n.op_type for n in model.graph.node if n.name.startswith("model/") and n.name.count("/") == 1][-5:]
    assert post == ["Unsqueeze", "Unsqueeze", "Mul", "Reshape", "Add"]
    assert inits["const_1d_5"].tolist() == [0, 0, -1]
    assert "Cast" not in _ops(make_mobius_model(1, C=C, H=H, R=R, final_mix=False))  # float32: casts folded


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("premix_in", ["float", "T"])
def test_mobius_blocks_fuse_into_one_node_each(hcfuse_lib, dtype, premix_in):
    model = make_mobius_model(3, C=C, H=H, R=R, dtype=dtype, premix_in=premix_in)
    fused, report = hcfuse.optimize_with_report(model)
    assert len(report.fused) == 4 and report.rejected == [], report.to_dict()
    ops = _ops(fused)
    assert ops[_op.OP_TYPE] == 4 and not {"Swish", "Sqrt", "Reciprocal", "ReduceMean", "Unsqueeze", "Div"} & set(ops)
    assert [len(n.input) for n in fused.graph.node if n.op_type == _op.OP_TYPE] == [5, 7, 7, 7]
    node = next(n for n in fused.graph.node if n.op_type == _op.OP_TYPE)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"num_branches": C, "epsilon": pytest.approx(1e-6), "reduction_scale": 0.25,
                     "silu_alpha": 0.25, "gate_div": 4.0, "gate_mul": 2.0}
    assert node.name == "model/layers.0/attn_hyper_connection/HyperConnectionLowRankMix"
    assert _gap(model, fused) <= SMALL_BOUND[dtype]


def test_ple_add_and_token_mask(hcfuse_lib):
    """Add(S, PLE(S)) in front of block 2: the previous post-mix feeds the Add, not a norm, so it stays
    as it is; the token mask's Mul reads the pre-mix output (a fused node's output)."""
    model = make_mobius_model(4, C=C, H=H, R=R, dtype=np.float16, ple_before=(2,), token_mask=True)
    fused, report = hcfuse.optimize_with_report(model)
    assert len(report.fused) == 5
    assert [len(n.input) for n in fused.graph.node if n.op_type == _op.OP_TYPE] == [5, 7, 5, 7, 7]
    [(anchor, reason)] = [(r.anchor, r.reason) for r in report.rejected]
    ple_add = next(n for n in model.graph.node if n.input[1:] == ["ple_output.2"])
    post_mix = next(n for n in model.graph.node if ple_add.input[0] in n.output)
    assert anchor == post_mix.name and "no block's norm reads its output" in reason
    assert _ops(fused)["Unsqueeze"] == 3  # the mask's and the post-mix left in front of the PLE Add
    assert _gap(model, fused) <= SMALL_BOUND[np.float16]


def test_bfloat16_fuses():
    """onnxruntime's CPU runs no bfloat16 MatMul: the rewrite only (the numerics need a GPU)."""
    import ml_dtypes

    model = build_mobius_model(3, C=C, H=H, R=R, dtype=ml_dtypes.bfloat16)
    report = fuse_with_report(model)
    assert len(report.fused) == 4 and report.rejected == []
    scale = next(n for n in model.graph if n.op_type == _op.OP_TYPE).inputs[1]
    assert scale.producer().op_type == "Cast" and scale.dtype == ir.DataType.BFLOAT16


def _first(model: ir.Model, scope: str, op_type: str, index: int = 0) -> ir.Node:
    """The index-th op_type node of block 0's scope (its node numbers depend on the casts)."""
    found = [n for n in model.graph if n.op_type == op_type and n.name.startswith(
        f"model/layers.0/attn_hyper_connection/{scope}") and n.name.count("/") == 3 + scope.count("/")]
    return found[index]


def test_swish_with_another_alpha_is_left_with_its_reason(hcfuse_lib):
    model = build_mobius_model(2, C=C, H=H, R=R)
    swish = _first(model, "", "Swish")
    swish.attributes["alpha"] = ir.AttrFloat32("alpha", 1.5)
    original = ir.to_proto(model)
    report = fuse_with_report(model)
    assert len(report.fused) == 2
    reasons = {r.anchor: r.reason for r in report.rejected}
    assert "has alpha 1.5: x * sigmoid(alpha * x) is no ScaledSiLU" in reasons[swish.name]
    assert _gap(original, ir.to_proto(model)) <= SMALL_BOUND[np.float32]


def test_a_norm_weight_offset_other_than_one_is_left(hcfuse_lib):
    model = build_mobius_model(2, C=C, H=H, R=R)
    add = _first(model, "hc_norm/", "Add", 1)  # the weight's + 1
    two = ir.Value(name="two", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([]),
                   const_value=ir.tensor(np.array(2.0, np.float32)))
    model.graph.register_initializer(two)
    add.replace_input_with(1, two)
    original = ir.to_proto(model)
    report = fuse_with_report(model)
    assert len(report.fused) == 2
    reasons = {r.anchor: r.reason for r in report.rejected}
    reason = reasons["model/layers.0/attn_hyper_connection/hc_norm"]
    assert reason == "the norm weight must be offset by 1; 'two' is 2.0"
    assert _gap(original, ir.to_proto(model)) <= SMALL_BOUND[np.float32]


def test_a_norm_over_the_whole_width_is_no_branchwise_norm():
    """Reshape by [-1, 1, C*H]: one group, while the pre-mix has C: the trial refuses the block."""
    model = build_mobius_model(2, C=C, H=H, R=R)
    reshape = _first(model, "hc_norm/", "Reshape")
    whole = ir.Value(name="whole", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([3]),
                     const_value=ir.tensor(np.array([-1, 1, C * H], np.int64)))
    model.graph.register_initializer(whole)
    reshape.replace_input_with(1, whole)
    report = fuse_with_report(model)
    assert len(report.fused) == 2 and any("its block did not fuse with it" in r.reason for r in report.rejected)


def test_shuffled_mobius_model_fuses_and_verifies(hcfuse_lib):
    model = make_mobius_model(3, C=C, H=H, R=R, dtype=np.float16)
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes[i] for i in np.random.default_rng(3).permutation(len(nodes)))
    fused, report = hcfuse.optimize_with_report(model)
    assert len(report.fused) == 4 and report.rejected == []
    assert _gap(model, fused) <= SMALL_BOUND[np.float16]
