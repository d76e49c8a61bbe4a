"""Mutations of a quantized base's projection MatMulNBits (bases.QUANTIZED): each either still fuses
(same outputs) or must be refused with its reason (hcfuse/rewrite/nbits_projection.py); one that
onnxruntime cannot run is discarded."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from tests.fusion.fuzz.bases import PROJECTION
from tests.fusion.fuzz.edits import Context, graph_input, initializer, set_attr

KIND = "nbits"
_B, _SCALES, _ZERO_POINTS, _G_IDX, _BIAS = 1, 2, 3, 4, 5
_DOWN, _INJECT = "input_mix_weight_down/", "block_inject_weight/"


def _projections(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == "MatMulNBits" and PROJECTION in n.name]


def _set_input(node: ir.Node, index: int, value: ir.Value | None) -> None:
    if len(node.inputs) <= index:
        node.resize_inputs(index + 1)
    node.replace_input_with(index, value)


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _attribute(model: ir.Model, ctx: Context, node: ir.Node) -> str:
    name = ctx.pick(["K", "N", "bits", "block_size", "weight_prepacked", "accuracy_level"])
    if name == "weight_prepacked":
        value = 1
    elif name == "accuracy_level":  # the block's projections then disagree (or a lone one changes level)
        value = ctx.pick([0, 1, 4, None])
    elif name == "bits":
        value = ctx.pick([2, 8 if _attr(node, "bits", 4) == 4 else 4, None])
    elif name == "block_size":
        value = ctx.pick([8, 16, 32, 64, 128, 24, None])
    else:
        old = _attr(node, name)
        value = ctx.pick([old + 1, old - 1, 2 * old, None])
    set_attr(node, name, value)
    return f"{name}={value}"


def _extra_input(model: ir.Model, ctx: Context, node: ir.Node) -> str:
    K, N, block = _attr(node, "K"), _attr(node, "N"), _attr(node, "block_size")
    if ctx.rng.random() < 0.5:  # the identity order: the same product, but the fused op reads no g_idx
        _set_input(node, _G_IDX, initializer(model, ctx.name("g_idx"), (np.arange(K) // block).astype(np.int32)))
        return "g_idx"
    _set_input(node, _BIAS, initializer(model, ctx.name("bias"), (ctx.rng.standard_normal(N) * 0.1).astype(ctx.np_T)))
    return "bias"


def _not_constant(model: ir.Model, ctx: Context, node: ir.Node) -> str | None:
    """B, scales or zero points fed at run time: the same values as a new graph input, or the initializer
    itself made overridable (floats then fed perturbed)."""
    role = ctx.pick([r for r, i in (("B", _B), ("scales", _SCALES), ("zero_points", _ZERO_POINTS))
                     if len(node.inputs) > i and node.inputs[i] is not None])
    index = {"B": _B, "scales": _SCALES, "zero_points": _ZERO_POINTS}[role]
    value = node.inputs[index]
    if value.const_value is None:
        return None
    if ctx.rng.random() < 0.5:
        _set_input(node, index, graph_input(model, ctx, ctx.name(role), np.asarray(value.const_value.numpy())))
        return f"{role} graph input"
    if value.is_graph_input():
        return None
    model.graph.inputs.append(value)
    return f"{role} overridable"


def _zero_points_dropped_on_one(model: ir.Model, ctx: Context) -> str | None:
    """Separate down and inject, both asymmetric: one of them loses its zero points (2^(bits-1) then)."""
    nodes = _projections(model)
    pairs = [(d, i) for d in nodes if _DOWN in d.name for i in nodes
             if _INJECT in i.name and i.name.split(PROJECTION)[0] == d.name.split(PROJECTION)[0]]
    pairs = [p for p in pairs if all(len(n.inputs) > _ZERO_POINTS and n.inputs[_ZERO_POINTS] is not None for n in p)]
    if not pairs:
        return None
    node = pairs[int(ctx.rng.integers(len(pairs)))][int(ctx.rng.integers(2))]
    _set_input(node, _ZERO_POINTS, None)
    return f"zero_points dropped on {'down' if _DOWN in node.name else 'inject'} of two"


def _shared(model: ir.Model, ctx: Context) -> str | None:
    """A projection reads another block's B (or its B, scales and zero points) of the same shape and type."""
    nodes = [n for n in _projections(model) if len(n.inputs) > _SCALES and None not in n.inputs[_B:_SCALES + 1]]
    pairs = [(a, b) for a in nodes for b in nodes if a is not b and a.inputs[_B] is not b.inputs[_B]
             and a.inputs[_B].shape == b.inputs[_B].shape and a.inputs[_SCALES].dtype == b.inputs[_SCALES].dtype
             and all(_attr(a, k) == _attr(b, k) for k in ("K", "N", "bits", "block_size"))]
    if not pairs:
        return None
    source, target = pairs[int(ctx.rng.integers(len(pairs)))]
    if ctx.rng.random() < 0.5:
        _set_input(target, _B, source.inputs[_B])
        return "B shared by two blocks"
    for index in (_B, _SCALES, _ZERO_POINTS):
        _set_input(target, index, source.inputs[index] if len(source.inputs) > index else None)
    return "weight shared by two blocks"


def nbits(model, ctx):
    """One of the quantized projections changed as MatMulNBits allows or not (see the module doc)."""
    nodes = _projections(model)
    if not nodes:
        return None
    form = ctx.pick(["attribute", "extra_input", "scales_dropped", "not_constant", "zero_points_one", "shared"])
    node = ctx.pick(nodes)
    if form == "attribute":
        detail = _attribute(model, ctx, node)
    elif form == "extra_input":
        detail = _extra_input(model, ctx, node)
    elif form == "scales_dropped":
        _set_input(node, _SCALES, None)
        detail = "scales dropped"
    elif form == "not_constant":
        detail = _not_constant(model, ctx, node)
    elif form == "zero_points_one":
        detail = _zero_points_dropped_on_one(model, ctx)
    else:
        detail = _shared(model, ctx)
    return f"{KIND}:{detail}" if detail else None
