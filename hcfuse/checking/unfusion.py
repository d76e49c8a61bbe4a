"""Expands every HyperConnectionLowRankMix node back into the stock contrib-op chain (docs/NUMERICS.md).

The result runs on an onnxruntime without hcfuse's library:

    S    = HyperConnectionPostMix(streams, prev_block_output, prev_post_gate)   (prologue only)
    hn   = BranchwiseRMSNorm(S, norm_scale);  d = ScaledSiLU(MatMul(hn, down_weight))
    g    = Sigmoid(MatMul(d, up_weight));     pre = HyperConnectionPreMix(hn, g)
    gate = Mul(Sigmoid(Div(MatMul(hn, inject_weight), gate_div)), gate_mul)     (Div/Mul when != 1)

streams_out becomes S, or Identity(streams) without a prologue. The scalar constants are shared
initializers of T, one per value, named like the exporter's ``/model/constants/<T>/<value>``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hcfuse import _op


def _attributes(node: ir.Node) -> dict[str, float | int]:
    values = _op.attribute_defaults()
    for name in _op.ATTRIBUTES:
        attr = node.attributes.get(name)
        if attr is not None:
            values[name] = attr.value
    if "num_branches" not in values:
        raise ValueError(f"{_op.OP_TYPE} node {node.name!r}: attribute num_branches is required; it is missing")
    return values


def _element_type(node: ir.Node) -> ir.DataType:
    """T from the first input (or weight) whose type is known."""
    for value in node.inputs:
        if value is not None and value.dtype is not None:
            return value.dtype
    raise ValueError(
        f"{_op.OP_TYPE} node {node.name!r}: element type T unknown; none of its inputs has a type"
    )


class _Constants:
    """Scalar initializers of T shared by every expanded node of a graph."""

    def __init__(self, graph: ir.Graph):
        self._graph = graph
        self._values: dict[tuple[ir.DataType, float], ir.Value] = {}

    def get(self, dtype: ir.DataType, number: float) -> ir.Value:
        key = (dtype, float(number))
        value = self._values.get(key)
        if value is None:
            name = f"/model/constants/{dtype.name}/{float(number):g}"
            while name in self._graph.initializers:
                name += "_"
            tensor = ir.tensor(np.array(number, dtype=dtype.numpy()), name=name)
            value = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape([]),
                             const_value=tensor)
            self._graph.register_initializer(value)
            self._values[key] = value
        return value


def _used(value: ir.Value | None) -> bool:
    return value is not None and (bool(value.uses()) or value.is_graph_output())


def _expand(node: ir.Node, constants: _Constants, base: str) -> None:
    """Replaces one fused node, in place, by its stock chain: nodes `base/<step>`, values `base/<step>_out`."""
    graph = node.graph
    attrs = _attributes(node)
    dtype = _element_type(node)
    inputs = list(node.inputs) + [None] * (len(_op.INPUTS) - len(node.inputs))
    streams, norm_scale, down_w, up_w, inject_w, prev_out, prev_gate = inputs
    if streams is None or any(w is None for w in (norm_scale, down_w, up_w, inject_w)):
        raise ValueError(
            f"{_op.OP_TYPE} node {node.name!r}: the first {_op.NUM_REQUIRED_INPUTS} inputs "
            f"{_op.INPUTS[:_op.NUM_REQUIRED_INPUTS]} are required; got {[v and v.name for v in inputs[:_op.NUM_REQUIRED_INPUTS]]}"
        )
    if (prev_out is None) != (prev_gate is None):
        raise ValueError(
            f"{_op.OP_TYPE} node {node.name!r}: prev_block_output and prev_post_gate come as a pair; "
            f"got only {'prev_block_output' if prev_gate is None else 'prev_post_gate'}"
        )
    c = int(attrs["num_branches"])
    tape = ir.tape.Tape()

    def op(op_type: str, args, attributes=None, *, contrib=False, step: str):
        return tape.op(op_type, args, attributes, domain=_op.DOMAIN if contrib else "",
                       name=f"{base}/{step}", output=ir.Value(name=f"{base}/{step}_out"))

    s = streams
    if prev_out is not None:
        s = op(_op.POST_MIX, [streams, prev_out, prev_gate], {"num_branches": c}, contrib=True,
               step="PostMix")
    hn = op(_op.BRANCH_NORM, [s, norm_scale], {"num_branches": c, "epsilon": float(attrs["epsilon"])},
            contrib=True, step="BranchwiseRMSNorm")
    down = op("MatMul", [hn, down_w], step="MatMul_down")
    hidden = op(_op.SCALED_SILU, [down], {"alpha": float(attrs["silu_alpha"])}, contrib=True,
                step="ScaledSiLU")
    up = op("MatMul", [hidden, up_w], step="MatMul_up")
    g = op("Sigmoid", [up], step="Sigmoid_g")
    pre = op(_op.PRE_MIX, [hn, g], {"num_branches": c, "reduction_scale": float(attrs["reduction_scale"])},
             contrib=True, step="PreMix")
    gate = op("MatMul", [hn, inject_w], step="MatMul_inject")
    if float(attrs["gate_div"]) != 1.0:
        gate = op("Div", [gate, constants.get(dtype, attrs["gate_div"])], step="Div")
    gate = op("Sigmoid", [gate], step="Sigmoid_gate")
    if float(attrs["gate_mul"]) != 1.0:
        gate = op("Mul", [gate, constants.get(dtype, attrs["gate_mul"])], step="Mul")

    old_outputs, new_outputs = list(node.outputs[:2]), [pre, gate]
    streams_out = node.outputs[2] if len(node.outputs) > 2 else None
    if _used(streams_out):
        if s is streams:  # no prologue: a copy keeps the output a distinct value
            s = op("Identity", [streams], step="streams_out")
        old_outputs.append(streams_out)
        new_outputs.append(s)
    for value in new_outputs:
        value.dtype = dtype
    ir.convenience.replace_nodes_and_values(
        graph, node, [node], tape.nodes, old_outputs, new_outputs
    )


def unfuse(model: ir.Model) -> int:
    """Expands every fused node of ``model`` in place; returns how many were expanded."""
    count = 0
    for graph in model.graphs():
        constants = _Constants(graph)
        fused = [n for n in graph if n.op_type == _op.OP_TYPE and n.domain == _op.DOMAIN]
        bases: set[str] = set()
        for node in fused:
            base = node.name or f"{_op.OP_TYPE}_{count}"
            while base in bases:  # fused nodes sharing a name: their chains' names must still be unique
                base += "_"
            bases.add(base)
            _expand(node, constants, base)
            count += 1
    if count:
        model.opset_imports.setdefault("", _op.ONNX_OPSET)
        model.opset_imports.setdefault(_op.DOMAIN, 1)
    return count
