"""Expands every fused node back into the stock contrib-op chain (docs/NUMERICS.md).

The result runs on an onnxruntime without hcfuse's library:

    S    = HyperConnectionPostMix(streams, prev_block_output, prev_post_gate)   (prologue only)
    hn   = BranchwiseRMSNorm(S, norm_scale);  d = ScaledSiLU(MatMul(hn, down_weight))
    g    = Sigmoid(MatMul(d, up_weight));     pre = HyperConnectionPreMix(hn, g)
    gate = Mul(Sigmoid(Div(MatMul(hn, inject_weight), gate_div)), gate_mul)     (Div/Mul when != 1)

streams_out becomes S, or Identity(streams) without a prologue. The scalar constants are shared
initializers of T, one per value, named like the exporter's ``/model/constants/<T>/<value>``.

The quantized op (ai.hcfuse.HyperConnectionLowRankMixNBits, hcfuse._op_nbits) becomes the chain as
onnxruntime-genai's int4 builds hold it: its down+inject weight one MatMul (K = C*H, N = R+C) and a Split
by ``/model/constants/INT64/[R, C]``, each quantized projection a com.microsoft.MatMulNBits reading the
node's B, scales and zero points, with its bits, block_size and (when not 0, as the quantizer writes it)
accuracy_level.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hcfuse import _op, _op_nbits
from hcfuse._library import METADATA_KEY

_MATMUL_NBITS = "MatMulNBits"  # com.microsoft (_op.DOMAIN), onnxruntime's quantized MatMul


def _is_fused(node: ir.Node) -> bool:
    return (node.op_type, node.domain) in ((_op.OP_TYPE, _op.DOMAIN), (_op_nbits.OP_TYPE, _op_nbits.DOMAIN))


def _attributes(node: ir.Node) -> dict[str, float | int]:
    spec = _op_nbits if node.domain == _op_nbits.DOMAIN else _op
    values = spec.attribute_defaults()
    for name in spec.ATTRIBUTES:
        attr = node.attributes.get(name)
        if attr is not None:
            values[name] = attr.value
    if "num_branches" not in values:
        raise ValueError(f"{node.op_type} node {node.name!r}: attribute num_branches is required; it is missing")
    return values


def _element_type(node: ir.Node) -> ir.DataType:
    """T from the first input (or weight) whose type is known (a quantized weight's uint8 is not T)."""
    for value in node.inputs:
        if value is not None and value.dtype is not None and value.dtype != ir.DataType.UINT8:
            return value.dtype
    raise ValueError(
        f"{node.op_type} node {node.name!r}: element type T unknown; none of its inputs has a type"
    )


class _Constants:
    """Scalar initializers of T shared by every expanded node of a graph."""

    def __init__(self, graph: ir.Graph):
        self._graph = graph
        self._values: dict[tuple, ir.Value] = {}

    def get(self, dtype: ir.DataType, number: float | list[int]) -> ir.Value:
        """A scalar of dtype, or (a list) a 1-D tensor of its numbers, e.g. Split's INT64 sizes."""
        literal = str(list(number)) if isinstance(number, list) else f"{float(number):g}"
        key = (dtype, literal)
        value = self._values.get(key)
        if value is None:
            name = f"/model/constants/{dtype.name}/{literal}"
            while name in self._graph.initializers:
                name += "_"
            tensor = ir.tensor(np.array(number, dtype=dtype.numpy()), name=name)
            value = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(tensor.shape),
                             const_value=tensor)
            self._graph.register_initializer(value)
            self._values[key] = value
        return value


def _used(value: ir.Value | None) -> bool:
    return value is not None and (bool(value.uses()) or value.is_graph_output())


def _inputs(node: ir.Node) -> dict[str, ir.Value | None]:
    """The node's inputs by name; the required ones and the prologue pair checked."""
    spec = _op_nbits if node.domain == _op_nbits.DOMAIN else _op
    inputs = dict(zip(spec.INPUTS, [*node.inputs, *[None] * (len(spec.INPUTS) - len(node.inputs))]))
    required = spec.INPUTS[: _op.NUM_REQUIRED_INPUTS] if spec is _op else [spec.INPUTS[i] for i in spec.REQUIRED_INPUTS]
    if any(inputs[name] is None for name in required):
        raise ValueError(f"{node.op_type} node {node.name!r}: the inputs {list(required)} are required; got "
                         f"{[inputs[name] and inputs[name].name for name in required]}")
    if (inputs["prev_block_output"] is None) != (inputs["prev_post_gate"] is None):
        raise ValueError(
            f"{node.op_type} node {node.name!r}: prev_block_output and prev_post_gate come as a pair; "
            f"got only {'prev_block_output' if inputs['prev_post_gate'] is None else 'prev_post_gate'}"
        )
    return inputs


def _dim(node: ir.Node, value: ir.Value, axis: int) -> int:
    """A weight's dim (C*H or R+C), which the chain's MatMulNBits attributes and Split sizes spell out."""
    shape = value.shape
    dim = shape[axis] if shape is not None and len(shape) > axis else None
    if not isinstance(dim, int):
        raise ValueError(f"{node.op_type} node {node.name!r}: dim {axis} of {value.name!r} is needed to write the "
                         f"chain back; its shape is {shape}")
    return dim


def _expand(node: ir.Node, constants: _Constants, base: str) -> None:
    """Replaces one fused node, in place, by its stock chain: nodes `base/<step>`, values `base/<step>_out`."""
    graph = node.graph
    attrs = _attributes(node)
    dtype = _element_type(node)
    inputs = _inputs(node)
    streams, norm_scale = inputs["streams"], inputs["norm_scale"]
    prev_out, prev_gate = inputs["prev_block_output"], inputs["prev_post_gate"]
    c = int(attrs["num_branches"])
    tape = ir.tape.Tape()

    def op(op_type: str, args, attributes=None, *, contrib=False, step: str, outputs: int = 1):
        values = [ir.Value(name=f"{base}/{step}_out" + (f"_{i}" if outputs > 1 else "")) for i in range(outputs)]
        out = tape.op_multi_out(op_type, args, attributes, domain=_op.DOMAIN if contrib else "",
                                name=f"{base}/{step}", outputs=values)
        return out if outputs > 1 else out[0]

    def project(x: ir.Value, weight: ir.Value, scales: ir.Value | None, zero_points: ir.Value | None, K: int,
                N: int, step: str) -> ir.Value:
        """x @ weight: a MatMul, or the MatMulNBits a quantized weight came from."""
        if weight.dtype != ir.DataType.UINT8:
            return op("MatMul", [x, weight], step=f"MatMul_{step}")
        nbits = {"K": K, "N": N, "bits": int(attrs["bits"]), "block_size": int(attrs["block_size"])}
        if attrs["accuracy_level"]:
            nbits["accuracy_level"] = int(attrs["accuracy_level"])
        args = [x, weight, scales] + ([zero_points] if zero_points is not None else [])
        return op(_MATMUL_NBITS, args, nbits, contrib=True, step=f"{_MATMUL_NBITS}_{step}")

    s = streams
    if prev_out is not None:
        s = op(_op.POST_MIX, [streams, prev_out, prev_gate], {"num_branches": c}, contrib=True,
               step="PostMix")
    hn = op(_op.BRANCH_NORM, [s, norm_scale], {"num_branches": c, "epsilon": float(attrs["epsilon"])},
            contrib=True, step="BranchwiseRMSNorm")
    if node.domain == _op_nbits.DOMAIN:
        weight, up_w = inputs["down_inject_weight"], inputs["up_weight"]
        quantized = weight.dtype == ir.DataType.UINT8
        CH = _dim(node, up_w, 0 if up_w.dtype == ir.DataType.UINT8 else 1)
        R = _dim(node, weight, 0 if quantized else 1) - c
        packed = project(hn, weight, inputs["down_inject_scales"], inputs["down_inject_zero_points"], CH, R + c,
                         "down_inject")
        down, gate = op("Split", [packed, constants.get(ir.DataType.INT64, [R, c])], {"axis": -1}, step="Split",
                        outputs=2)
        hidden = op(_op.SCALED_SILU, [down], {"alpha": float(attrs["silu_alpha"])}, contrib=True, step="ScaledSiLU")
        up = project(hidden, up_w, inputs["up_scales"], inputs["up_zero_points"], R, CH, "up")
    else:
        down = op("MatMul", [hn, inputs["down_weight"]], step="MatMul_down")
        hidden = op(_op.SCALED_SILU, [down], {"alpha": float(attrs["silu_alpha"])}, contrib=True, step="ScaledSiLU")
        up = op("MatMul", [hidden, inputs["up_weight"]], step="MatMul_up")
        gate = op("MatMul", [hn, inputs["inject_weight"]], step="MatMul_inject")
    g = op("Sigmoid", [up], step="Sigmoid_g")
    pre = op(_op.PRE_MIX, [hn, g], {"num_branches": c, "reduction_scale": float(attrs["reduction_scale"])},
             contrib=True, step="PreMix")
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
        fused = [n for n in graph if _is_fused(n)]
        bases: set[str] = set()
        for node in fused:
            base = node.name or f"{node.op_type}_{count}"
            while base in bases:  # fused nodes sharing a name: their chains' names must still be unique
                base += "_"
            bases.add(base)
            _expand(node, constants, base)
            count += 1
    if count:
        model.opset_imports.setdefault("", _op.ONNX_OPSET)
        model.opset_imports.setdefault(_op.DOMAIN, 1)
        if not _uses_domain(model, _op_nbits.DOMAIN):
            model.opset_imports.pop(_op_nbits.DOMAIN, None)
        model.metadata_props.pop(METADATA_KEY, None)  # the stock chain needs no hcfuse kernel
    return count


def _uses_domain(model: ir.Model, domain: str) -> bool:
    graphs = [*model.graphs(), *model.functions.values()]
    return any(node.domain == domain for graph in graphs for node in graph)
