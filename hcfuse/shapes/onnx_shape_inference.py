"""hcfuse's ops in onnx-shape-inference (the `onnx-shape-inference` package: `pip install hcfuse[shape-inference]`).

    import onnx_ir as ir, onnx_shape_inference
    import hcfuse.shapes.onnx_shape_inference

    hcfuse.shapes.onnx_shape_inference.register()
    model = onnx_shape_inference.infer_symbolic_shapes(ir.load("model.onnx"))

`register()` adds one handler per op of OPS to the package's registry (by domain, op type and since_version,
as the package registers its own ops). A handler runs the op's ONNX schema inference (hcfuse/shapes/schema.py,
nbits_schema.py) on what the node's inputs know, so these shapes, ONNX's and onnxruntime's symbolic handler's
(hcfuse/shapes/ort_symbolic_shape.py) come from the same rules: symbolic leading dims pass through, omitted
outputs stay unset, and a symbolic width C*H gives H as C*H / C. A contradiction is the package's
ShapeInferenceError naming the node (raised, or kept in the context's errors under policy "skip").
"""

from __future__ import annotations

import re

import onnx
import onnx_ir as ir
import sympy
from onnx_shape_inference import OpShapeInferenceRegistry, ShapeInferenceContext
from onnx_shape_inference import registry as default_registry

from hcfuse import _op, _op_nbits
from hcfuse.shapes import nbits_schema, schema

__all__ = ["OPS", "register"]

# (domain, op type, since_version, schema registration) of every op the handlers serve. Each op's outputs are
# (pre_output (..., H), post_gate (..., C), streams_out (..., C*H)) from streams (..., C*H) at input 0.
OPS = (
    (_op.DOMAIN, _op.OP_TYPE, _op.SINCE_VERSION, schema.register_schema),
    (_op_nbits.DOMAIN, _op_nbits.OP_TYPE, _op_nbits.SINCE_VERSION, nbits_schema.register_schema),
)


def register(registry: OpShapeInferenceRegistry = default_registry) -> None:
    """Register the handlers of OPS with `registry` (the package's own by default); calling it again changes
    nothing. They take precedence over any handler the package itself ships for these ops: hcfuse's schema,
    kernels and tests define them."""
    registry.collect()  # the package's own handlers first, so that ours are the last registered and win
    for domain, op_type, since_version, register_schema in OPS:
        register_schema()
        if registry.get(domain, op_type, since_version) is not infer_outputs:
            registry.register(domain, op_type, since_version)(infer_outputs)


# ---- the handler --------------------------------------------------------------------------------


def _dim_text(dim) -> str | None:
    """A symbolic dim as ONNX spells it (dim_param), None when unnamed."""
    return None if dim.value is None else str(dim.value)


def _type_proto(value: ir.Value | None) -> onnx.TypeProto:
    """What the value knows as ONNX's TypeProto (element type 0 and no shape where unknown)."""
    if value is None or not isinstance(value.type, ir.TensorType | None):
        return onnx.TypeProto()
    elem_type = value.dtype.value if value.dtype is not None else 0
    if value.shape is None:
        return onnx.helper.make_tensor_type_proto(elem_type, None) if elem_type else onnx.TypeProto()
    dims = [d if isinstance(d, int) else _dim_text(d) for d in value.shape.dims]
    return onnx.helper.make_tensor_type_proto(elem_type, dims)


def _node_proto(node: ir.Node) -> onnx.NodeProto:
    """The node as ONNX inference reads it: inputs and outputs renamed by position ("" where absent)."""
    proto = onnx.helper.make_node(
        node.op_type,
        [f"input{i}" if v is not None else "" for i, v in enumerate(node.inputs)],
        [f"output{i}" if v.name != "" else "" for i, v in enumerate(node.outputs)],
        name=node.name or "",
        domain=node.domain,
    )
    proto.attribute.extend(ir.serde.serialize_attribute(a) for a in node.attributes.values() if not a.is_ref())
    return proto


def _message(error: Exception, node: ir.Node) -> str:
    """The schema's message without its own node prefix (the package's error names the node)."""
    text = str(error).strip()
    op, name = re.escape(node.op_type), re.escape(node.name or "")
    prefix = re.match(rf"{op} \(node {op}\[[^\]]*\](?: \({name}\))?\): ", text)
    return text[prefix.end() :] if prefix else text


def _h_from_width(streams: ir.Value | None, num_branches: ir.Attr | None) -> ir.SymbolicDim | None:
    """H = C*H / C when streams' width is a named symbol (as onnxruntime's handler states it), else None."""
    if streams is None or streams.shape is None or not streams.shape.rank() or num_branches is None:
        return None
    width = streams.shape.dims[-1]
    if isinstance(width, int) or _dim_text(width) is None:
        return None
    return ir.SymbolicDim(str(sympy.simplify(sympy.sympify(_dim_text(width)) / num_branches.as_int())))


def infer_outputs(ctx: ShapeInferenceContext, node: ir.Node) -> None:
    """Handler of every op in OPS: the op's ONNX schema inference on the node's known inputs, its results set
    on the node's outputs; a dim the schema leaves open keeps the symbol it came from, or gets a new one."""
    domain = node.domain
    versions = {**ctx.opset_imports, "": ctx.opset, domain: ctx.get_opset_version(domain)}
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in versions.items()]
    proto = _node_proto(node)
    types = {name: _type_proto(v) for name, v in zip(proto.input, node.inputs) if name}
    op_schema = onnx.defs.get_schema(node.op_type, ctx.get_opset_version(domain), domain)
    try:
        inferred = onnx.shape_inference.infer_node_outputs(op_schema, proto, types, opset_imports=opsets)
    except onnx.shape_inference.InferenceError as e:
        ctx.record_error(node, _message(e, node))
        return
    symbols = {
        _dim_text(d): d
        for v in node.inputs
        if v is not None and v.shape is not None
        for d in v.shape.dims
        if not isinstance(d, int) and _dim_text(d) is not None
    }
    streams = node.inputs[_op.STREAMS] if node.inputs else None
    h = _h_from_width(streams, node.attributes.get("num_branches"))
    for o, (name, output) in enumerate(zip(proto.output, node.outputs)):
        tp = inferred.get(name) if name else None
        if tp is None or not tp.tensor_type.elem_type:
            continue
        shape = None
        if tp.tensor_type.HasField("shape"):
            dims = []
            for k, d in enumerate(tp.tensor_type.shape.dim):
                last = k == len(tp.tensor_type.shape.dim) - 1
                if d.HasField("dim_value"):
                    dims.append(d.dim_value)
                elif d.HasField("dim_param"):
                    dims.append(symbols.get(d.dim_param) or ir.SymbolicDim(d.dim_param))
                elif last and o == _op.PRE_OUTPUT and h is not None:
                    dims.append(h)
                else:
                    dims.append(ctx.new_symbolic_dim())
            shape = ir.Shape(dims)
        ctx.set_shape_and_dtype(output, shape, ir.DataType(tp.tensor_type.elem_type))
