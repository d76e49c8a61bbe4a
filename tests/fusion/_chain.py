"""Helpers of the fusion tests: small stock chains, the nodes in them, edits, and comparisons of the
stock and the fused model in onnxruntime (CPU, optimizations off)."""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from hcfuse import _op
from hcfuse.models.qwen_decode import make_decode_model
from hcfuse.rewrite import fuse_with_report
from tests._compare import cpu_session

C, H, R = 4, 16, 8
BF16 = np.dtype(ml_dtypes.bfloat16)
CHAIN_OPS = {*_op.CHAIN_CONTRIB_OPS, "Sigmoid", "Div", "Mul", "Split"}
# Largest |fused - stock| over max(1, |stock|) through a short chain: fp32 is accumulation order only;
# fp16 differs in post_gate too: onnxruntime's CPU provider runs the chain's Div, Sigmoid and Mul as one
# fp32 computation rounded once, where the contract rounds after each.
TOLERANCE = {np.dtype(np.float32): 2e-5, np.dtype(np.float16): 8e-3}
OVERRIDABLE = "which is also a graph input (an overridable default)"


def stock_chain(num_blocks: int = 3, **options) -> ir.Model:
    """A stock chain of num_blocks blocks (C, H, R above) and the final mix."""
    options = {"C": C, "H": H, "R": R, "final_mix": True, **options}
    return ir.from_proto(make_decode_model(num_blocks, **options))


def ops(model: ir.Model) -> collections.Counter:
    return collections.Counter(node.op_type for node in model.graph)


def node(model: ir.Model, op_type: str, index: int = 0) -> ir.Node:
    """The index-th node of op_type in the main graph, in graph order."""
    return [n for n in model.graph if n.op_type == op_type][index]


def fused_nodes(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == _op.OP_TYPE and n.domain == _op.DOMAIN]


def reasons(report) -> dict[str, str]:
    return {item.anchor: item.reason for item in report.rejected}


def set_attr(node: ir.Node, name: str, value) -> None:
    node.attributes[name] = ir.convenience.convert_attribute(name, value)


def graph_input(model: ir.Model, name: str, dtype: ir.DataType, dims) -> ir.Value:
    value = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(dims))
    model.graph.inputs.append(value)
    return value


def initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.tensor(array))
    graph.register_initializer(value)
    return value


def embeds(*leading, seed: int = 1) -> dict[str, np.ndarray]:
    return {"inputs_embeds": np.random.default_rng(seed).standard_normal((*leading, H)).astype(np.float32)}


def expect_left(model: ir.Model, *, fused: int, anchor_index: int, reason: str, prefix: str = ""):
    """Fuses model: `fused` blocks, and one report entry, for the anchor_index-th BranchwiseRMSNorm, that
    says `reason` (after `prefix` where the block fused without a part: 'prologue not fused: ')."""
    anchor = node(model, _op.BRANCH_NORM, anchor_index).name
    report = fuse_with_report(model)
    assert len(report.fused) == fused, report.to_dict()
    found = reasons(report)
    assert anchor in found, report.to_dict()
    assert reason in found[anchor], found[anchor]
    assert found[anchor].startswith(prefix) and ("not fused: " in found[anchor]) == bool(prefix)
    assert "internal error" not in found[anchor], found[anchor]
    assert len(found) == 1 and len(report.rejected) == 1, report.to_dict()
    return report


def _feeds(proto: onnx.ModelProto, leading: tuple, rng) -> dict[str, np.ndarray]:
    """Random values for every graph input (activations of unit scale, weights scaled like the builder's)."""
    feeds = {}
    for value in ir.from_proto(proto).graph.inputs:
        dims = [d if isinstance(d, int) else None for d in value.shape.dims]
        shape = (*leading, dims[-1]) if value.name in ("inputs_embeds", "hyper_states") else tuple(dims)
        scale = 1.0 if len(shape) != 2 else shape[0] ** -0.5
        array = rng.standard_normal(shape).astype(np.float32) * scale
        if value.name.endswith("hc_norm.weight"):
            array += 1.0
        feeds[value.name] = array.astype(value.dtype.numpy())
    return feeds


def assert_same_outputs(original: onnx.ModelProto, fused: onnx.ModelProto, library: str, leading=(2, 3), seed=0):
    """The fused model's first output matches the stock model's within the chain's TOLERANCE, on random
    values for every graph input."""
    feeds = _feeds(original, leading, np.random.default_rng(seed))
    expected = cpu_session(original, None).run(None, feeds)[0]
    actual = cpu_session(fused, library).run(None, feeds)[0]
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    gap = np.abs(actual.astype(np.float32) - expected.astype(np.float32)).max(initial=0.0)
    bound = TOLERANCE[expected.dtype] * max(1.0, float(np.abs(expected.astype(np.float32)).max(initial=0.0)))
    assert gap <= bound, f"fused differs from the stock chain by {gap} (bound {bound}), shape {expected.shape}"


def run(model: ir.Model, library, feeds) -> list[np.ndarray]:
    return cpu_session(ir.to_proto(model), library).run(None, feeds)


def assert_same_results(original: ir.Model, fused: ir.Model, library, feeds):
    """Every output of the fused (float32) model matches the stock model's on feeds."""
    for got, want in zip(run(fused, library, feeds), run(original, None, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
