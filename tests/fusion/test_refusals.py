"""What is refused, and why: each condition leaves its candidate unfused (or fused without its prologue
or gate Mul) with a reason that names it, and the optimized model still runs and matches."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import _op
from hcfuse.models.qwen_decode import make_decode_model
from hcfuse.rewrite import fuse_with_report
from tests.fusion._chain import (
    C, H, R, assert_same_results, embeds, expect_left, fused_nodes, graph_input, initializer, node, ops,
    reasons, set_attr, stock_chain,
)

PROLOGUE = "prologue not fused: "
GATE_MUL = "gate Mul not fused: "


def _spy_on_hn(m):
    m.graph.append(ir.node("Identity", [node(m, _op.BRANCH_NORM, 1).outputs[0]], name="spy"))


def _up_gate_as_output(m):
    m.graph.outputs.append(node(m, "Sigmoid", 2).outputs[0])  # block 1's up Sigmoid (g)


def _attr(op_type, index, name, value):
    return lambda m: set_attr(node(m, op_type, index), name, value)


def _attrs(op_types, index, name, value):
    def edit(m):
        for op_type in op_types:
            set_attr(node(m, op_type, index), name, value)
    return edit


def _typed_attr(index, attribute):
    def edit(m):
        norm = node(m, _op.BRANCH_NORM, index)
        norm.attributes[attribute.name] = attribute
    return edit


def _no_norm_branches(m):
    del node(m, _op.BRANCH_NORM, 2).attributes["num_branches"]


def _stream_mix(index):
    def edit(m):
        post = node(m, _op.POST_MIX, index)  # the prologue of block index + 1
        post.resize_inputs(4)
        post.replace_input_with(3, graph_input(m, "stream_mix", ir.DataType.FLOAT, ["batch", "seq", C, C]))
    return edit


def _post_mix_input(index, name, dims):
    return lambda m: node(m, _op.POST_MIX, 0).replace_input_with(index, graph_input(m, name, ir.DataType.FLOAT, dims))


def _weight(matmul_index, name_part, name, shape):
    def edit(m):
        matmul = node(m, "MatMul", matmul_index)
        assert name_part in matmul.name
        matmul.replace_input_with(1, initializer(m.graph, name, np.zeros(shape, np.float32)))
    return edit


def _graph_input_divisor(m):
    node(m, "Div", 1).replace_input_with(1, graph_input(m, "divisor", ir.DataType.FLOAT, []))


def _gate_mul_of_two(m):
    node(m, "Mul", 0).replace_input_with(1, initializer(m.graph, "two_muls", np.array([2.0, 2.0], np.float32)))


def _silu_scale_input(m):
    silu = node(m, _op.SCALED_SILU, 1)
    silu.resize_inputs(2)
    silu.replace_input_with(1, graph_input(m, "silu_scale", ir.DataType.FLOAT, []))


def _norm_scale(index, value):
    return lambda m: node(m, _op.BRANCH_NORM, index).replace_input_with(1, value(m))


def _matmulnbits_up(m):
    """An up MatMul turned into a MatMulNBits without the scales it needs."""
    up = node(m, "MatMul", 4)  # block 1: packed, up
    assert "input_mix_weight_up" in up.name
    quantized = ir.node("MatMulNBits", list(up.inputs), {"K": R, "N": C * H, "bits": 4, "block_size": 32},
                        domain=_op.DOMAIN, name=up.name + "NBits")
    up.outputs[0].replace_all_uses_with(quantized.outputs[0])
    m.graph.insert_after(up, quantized)
    m.graph.remove(up, safe=True)


@dataclasses.dataclass(frozen=True)
class Refusal:
    id: str
    edit: Callable[[ir.Model], None]
    fused: int  # blocks fused in the edited model
    anchor: int  # which BranchwiseRMSNorm's block the reason is for
    reason: str
    prefix: str = ""  # the part left unfused of a block fused without it
    blocks: int = 3
    options: dict = dataclasses.field(default_factory=dict)
    left: dict = dataclasses.field(default_factory=dict)  # op type -> how many stay in the fused model
    then: Callable[[ir.Model], bool] = lambda m: True  # on the fused model


REFUSALS = [
    Refusal("hn-has-another-consumer", _spy_on_hn, 3, 1, "is also consumed by Identity 'spy'"),
    Refusal("intermediate-is-a-graph-output", _up_gate_as_output, 3, 1, "is a graph output"),
    Refusal("premix-num-branches-differs", _attr(_op.PRE_MIX, 1, "num_branches", 2), 3, 1,
            "num_branches differs: BranchwiseRMSNorm 4, HyperConnectionPreMix 2"),
    Refusal("norm-without-num-branches", _no_norm_branches, 3, 2, "has no num_branches"),
    Refusal("grouped-form", _attrs((_op.BRANCH_NORM, _op.PRE_MIX), 1, "num_branches", 0), 2, 1,
            "num_branches=0 (the grouped form", blocks=2),
    Refusal("norm-num-branches-float", _typed_attr(1, ir.AttrFloat32("num_branches", 4.0)), 2, 1, "must be",
            blocks=2),
    Refusal("norm-epsilon-string", _typed_attr(1, ir.AttrString("epsilon", "tiny")), 2, 1, "must be", blocks=2),
    Refusal("postmix-num-branches-differs", _attr(_op.POST_MIX, 0, "num_branches", 2), 4, 1,
            "HyperConnectionPostMix 2", PROLOGUE, left={_op.POST_MIX: 1},
            then=lambda m: len(fused_nodes(m)[0].inputs) == 5),
    Refusal("postmix-stream-mix", _stream_mix(1), 4, 2, "has a stream_mix input", PROLOGUE, left={_op.POST_MIX: 1}),
    Refusal("postmix-per-feature-post-mix", _post_mix_input(2, "post_mix", ["batch", "seq", C, H]), 4, 1,
            f"must be (..., {C})", PROLOGUE),
    Refusal("postmix-scalar-prev-block-output", _post_mix_input(1, "prev_block_output", []), 4, 1,
            f"must be (..., {H})", PROLOGUE),
    Refusal("postmix-scalar-post-mix", _post_mix_input(2, "post_mix", []), 4, 1, f"must be (..., {C})", PROLOGUE),
    Refusal("inject-weight-shape", _weight(1, "block_inject", "bad_inject", (C * H, C + 1)), 3, 0,
            f"must be ({C * H}, {C}); got ({C * H}, {C + 1})", options={"packed": False}),
    Refusal("up-weight-shape", _weight(1, "input_mix_weight_up", "bad_up", (R, C * H - 1)), 3, 0,
            "up_weight 'bad_up' must be"),
    Refusal("gate-div-not-constant", _graph_input_divisor, 3, 1,
            "gate_div (graph input 'divisor') must be a constant scalar"),
    Refusal("gate-mul-of-two-values", _gate_mul_of_two, 4, 0,  # fused without its Mul, which scales post_gate
            "gate_mul (initializer 'two_muls') must be a constant scalar", GATE_MUL,
            options={"constants": "initializer"}, left={"Mul": 1}),
    Refusal("scaled-silu-scale-not-constant", _silu_scale_input, 3, 1, "has a non-constant scale input"),
    Refusal("norm-scale-of-another-type",
            _norm_scale(0, lambda m: initializer(m.graph, "scale32", np.ones(C * H, np.float32))), 3, 0,
            "inputs must share one element type T", options={"dtype": np.float16}),
    Refusal("norm-scale-of-width-h-not-constant",
            _norm_scale(1, lambda m: graph_input(m, "scale_h", ir.DataType.FLOAT, [H])), 3, 1,
            f"must be ({C * H},), or a constant"),
    Refusal("split-on-another-axis", _attr("Split", 1, "axis", 0), 3, 1, "Split must cut the last axis"),
    Refusal("matmulnbits-without-scales", _matmulnbits_up, 3, 1, "has no scales input"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c.id for c in REFUSALS])
def test_refused_with_its_reason(case):
    m = stock_chain(case.blocks, **case.options)
    case.edit(m)
    expect_left(m, fused=case.fused, anchor_index=case.anchor, reason=case.reason, prefix=case.prefix)
    assert {op: ops(m)[op] for op in case.left} == case.left
    assert fused_nodes(m) and case.then(m)


def test_packed_weight_as_graph_input_is_left_with_a_reason():
    m = stock_chain(2, packed=True, weights_as_inputs=True)
    report = fuse_with_report(m)
    assert len(report.fused) == 1  # only the final mix, whose down weight is a separate MatMul
    found = reasons(report)
    assert len(found) == 2 and all("not an initializer: it cannot be split" in r for r in found.values())


def test_a_block_fused_without_prologue_and_gate_mul_names_both_reasons():
    m = stock_chain()
    node(m, "Mul", 1).replace_input_with(1, graph_input(m, "scale_by", ir.DataType.FLOAT, []))
    _stream_mix(0)(m)
    report = expect_left(m, fused=4, anchor_index=1, reason="has a stream_mix input", prefix=PROLOGUE)
    [rejected] = report.rejected
    assert rejected.reason.endswith("; gate Mul not fused: gate_mul (graph input 'scale_by') must be a constant "
                                    "scalar of shape [] or [1]"), rejected.reason
    assert ops(m)["Mul"] == 1 and ops(m)[_op.POST_MIX] == 1


def test_rank_zero_is_left_because_the_fused_op_needs_r_at_least_one(hcfuse_lib):
    original = stock_chain(1, packed=False)
    for index, shape in ((0, (C * H, 0)), (2, (0, C * H))):  # down and up MatMuls of block 0
        weight = node(original, "MatMul", index).inputs[1]
        weight.const_value, weight.shape = ir.tensor(np.zeros(shape, np.float32)), ir.Shape(shape)
    for value in (node(original, "MatMul", 0).outputs[0], node(original, _op.SCALED_SILU, 0).outputs[0]):
        value.shape = ir.Shape(["batch", "seq", 0])
    fused = original.clone()
    report = fuse_with_report(fused)
    assert len(report.fused) == 1  # the final mix
    [rejected] = report.rejected
    assert "R >= 1" in rejected.reason
    assert_same_results(original, fused, hcfuse_lib, embeds(2, 3))


def test_per_feature_post_mix_with_h_equal_to_c_is_not_absorbed(hcfuse_lib):
    """post_mix (rows, C, H) with H == C ends in C like a (..., C) gate; with prev_block_output's shape
    unknown only the rank of streams tells the two apart."""
    h = c = 4
    original = ir.from_proto(make_decode_model(2, C=c, H=h, R=R, leading_dims=("rows",)))
    post = node(original, _op.POST_MIX, 0)  # the prologue of block 1
    gate = ir.Value(name="post_mix", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["rows", c, h]))
    block_output = ir.Value(name="block_output", type=ir.TensorType(ir.DataType.FLOAT))
    original.graph.inputs.extend([gate, block_output])
    post.replace_input_with(1, block_output)
    post.replace_input_with(2, gate)
    fused = original.clone()
    report = fuse_with_report(fused)
    assert len(report.fused) == 2
    [rejected] = report.rejected
    assert rejected.reason.startswith("prologue not fused: post_mix 'post_mix' must be (..., 4) with the leading dims")
    assert not report.fused[1].prologue
    rng = np.random.default_rng(2)
    feeds = {"inputs_embeds": rng.standard_normal((3, h)).astype(np.float32),
             "post_mix": rng.standard_normal((3, c, h)).astype(np.float32),
             "block_output": rng.standard_normal((3, h)).astype(np.float32)}
    assert_same_results(original, fused, hcfuse_lib, feeds)
