"""A quantized block the fused op cannot honour stays unfused, with the reason, and the other blocks fuse."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse.models.quantized import projection_names, quantize_model
from hcfuse.rewrite import fuse_with_report
from tests.fusion._chain import OVERRIDABLE, expect_left, graph_input, initializer, set_attr
from tests.fusion._nbits_chain import matmul_nbits, nbits_nodes, quantized_chain

BLOCKS = 2
FUSED_OTHERS = BLOCKS  # the other block and the final mix
UP, DOWN_INJECT = projection_names(0, "attn")["up"], projection_names(0, "attn")["down_inject"]


def _nbits(model: ir.Model, name: str) -> ir.Node:
    (node,) = [n for n in matmul_nbits(model) if n.name.startswith(name + "_Q")]
    return node


def _requantized(first: dict, second: dict, exclude_first: list[str], **options):
    """A chain quantized twice, as a user would get by two quantizer runs: first without exclude_first,
    then (second's settings) what the first left dense."""
    m = quantized_chain(BLOCKS, sublayer="identity", quantizer=dict(first, exclude=exclude_first), **options)
    return ir.from_proto(quantize_model(ir.to_proto(m), **{"accuracy_level": 4, **second}))


def _extra_input(position: int, make):
    def edit(m):
        node = _nbits(m, UP)
        inputs = [*node.inputs, *[None] * (position - len(node.inputs))]
        value = make(m)
        node.resize_inputs(position + 1)
        for i, v in enumerate(inputs[:position]):
            node.replace_input_with(i, v)
        node.replace_input_with(position, value)
    return edit


def _g_idx(m):
    return initializer(m.graph, "g_idx", np.arange(SMALL_K, dtype=np.int32))


def _bias(m):
    return initializer(m.graph, "bias", np.zeros(SMALL_N, dtype=np.float32))


SMALL_K, SMALL_N = 16, 256  # the up projection's K = R and N = C*H


def _attribute(name, value):
    return lambda m: set_attr(_nbits(m, UP), name, value)


def _b_as_graph_input(m):
    node = _nbits(m, UP)
    B = node.inputs[1]
    node.replace_input_with(1, graph_input(m, "B_fed", B.dtype, list(B.shape)))


def _b_overridable(m):
    m.graph.inputs.append(_nbits(m, UP).inputs[1])


CASES = {
    "g_idx": (_extra_input(4, _g_idx), "has a g_idx input ('g_idx')"),
    "bias": (_extra_input(5, _bias), "has a bias input ('bias')"),
    "weight_prepacked": (_attribute("weight_prepacked", 1), "has weight_prepacked set"),
    "K-attribute": (_attribute("K", 64), "must be [256, 2, 16] for K=64, N=256"),
    "N-attribute": (_attribute("N", 128), "B 'model.layers.0.attn_hyper_connection.input_mix_weight_up.MatMul."
                                         "weight_Q4' must be [128, 1, 16] for K=16, N=128"),
    "B-fed-at-run-time": (_b_as_graph_input, "its B (graph input 'B_fed') is not a constant initializer"),
    "B-overridable": (_b_overridable, f"{OVERRIDABLE}) is not a constant initializer"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_matmulnbits_the_op_cannot_honour(case):
    m = quantized_chain(BLOCKS, sublayer="identity")
    edit, reason = CASES[case]
    edit(m)
    node = _nbits(m, UP).name
    report = expect_left(m, fused=FUSED_OTHERS, anchor_index=0, reason=reason)
    assert report.rejected[0].reason.startswith(f"MatMulNBits '{node}': ")
    assert len(nbits_nodes(m)) == FUSED_OTHERS


def test_bits_other_than_4_and_8():
    m = quantized_chain(BLOCKS, sublayer="identity", quantizer=dict(bits=2))
    expect = "bits must be one of 4, 8; got 2"
    report = fuse_with_report(m)
    assert not report.fused and len(report.rejected) == BLOCKS + 1
    assert all(expect in item.reason for item in report.rejected), report.to_dict()


@pytest.mark.parametrize("name,second,found", [
    ("bits", dict(bits=8), "4, MatMulNBits '/model/layers.0/attn_hyper_connection/input_mix_weight_up/MatMul_Q8' 8"),
    ("block_size", dict(block_size=16), "32, MatMulNBits"),
    ("accuracy_level", dict(accuracy_level=None), "4, MatMulNBits"),
])
def test_projections_that_disagree(name, second, found):
    m = _requantized({}, second, [UP])
    report = expect_left(m, fused=FUSED_OTHERS, anchor_index=0, reason=f"{name} differs: MatMulNBits ")
    assert found in report.rejected[0].reason


@pytest.mark.parametrize("dense", ["inject", "down"])
def test_separate_down_and_inject_with_only_one_quantized(dense):
    names = projection_names(0, "attn", packed=False)
    m = quantized_chain(BLOCKS, packed=False, sublayer="identity", quantizer=dict(exclude=[names[dense]]))
    quantized = "down" if dense == "inject" else "inject"
    expect_left(m, fused=FUSED_OTHERS, anchor_index=0,
                reason=f"{quantized} is quantized (MatMulNBits '{names[quantized]}_Q4') but {dense} is a MatMul "
                       f"('{names[dense]}'): the fused op takes down and inject as one weight")


def test_separate_down_and_inject_with_zero_points_of_two_types():
    names = projection_names(0, "attn", packed=False)
    m = _requantized(dict(symmetric=False, zp_form="T"), dict(symmetric=False), [names["inject"]], packed=False)
    expect_left(m, fused=FUSED_OTHERS, anchor_index=0,
                reason=f"the zero points of down (MatMulNBits '{names['down']}_Q4', FLOAT) and inject "
                       f"('{names['inject']}_Q4', UINT8) differ in type: they cannot be one tensor")
