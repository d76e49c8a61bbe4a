"""HyperConnectionLowRankMix and HyperConnectionLowRankMixNBits in ONNX Runtime's symbolic shape inference
(onnxruntime.tools.symbolic_shape_infer).

Three entry points:
- `infer_shapes(model, ...)`: what hcfuse users call (a ModelProto, an onnx_ir.Model or a path; the
  last two never read weights). Works on a copy, rewrites the Constant forms ORT's
  tool crashes on, never writes ORT's `sym_shape_infer_temp.onnx` dump, and raises
  `IncompleteShapeInferenceError` naming the values left without a full shape.
- `HcSymbolicShapeInference`: the tool's class with our handlers in `dispatcher_`. When an onnxruntime
  release ships its own handler under the same op type, ours still wins: hcfuse's schema, kernels and
  tests define this op, so its shapes must not change with the onnxruntime version.
- `register_with_ort()`: for code bound to ORT's own entry points (quantization preprocessing,
  transformers' optimizer): inside the block every `SymbolicShapeInference` also knows our ops.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator

import numpy as np
import onnx
import onnx_ir as ir
import sympy
from onnx import helper, numpy_helper
from onnx.shape_inference import InferenceError
from onnxruntime.tools import symbolic_shape_infer as _ssi_module
from onnxruntime.tools.symbolic_shape_infer import (
    SymbolicShapeInference,
    get_opset,
    get_shape_from_sympy_shape,
    get_shape_from_value_info,
    is_literal,
)

from hcfuse import _op_nbits
from hcfuse._op import (
    DOWN_WEIGHT,
    INJECT_WEIGHT,
    INPUTS,
    NORM_SCALE,
    NUM_REQUIRED_INPUTS,
    OP_TYPE,
    OUTPUTS,
    POST_GATE,
    PRE_OUTPUT,
    PREV_BLOCK_OUTPUT,
    PREV_POST_GATE,
    STREAMS,
    STREAMS_OUT,
    UP_WEIGHT,
)
from hcfuse.files.proto_walk import proto_graphs
from hcfuse.files.sparse_initializers import sparse_to_dense
from hcfuse.shapes import nbits_schema
from hcfuse.shapes.schema import node_form_problem, register_schema

__all__ = [
    "HcSymbolicShapeInference",
    "apply_inferred_shapes",
    "IncompleteShapeInferenceError",
    "infer_hc_lowrank_mix",
    "infer_hc_lowrank_mix_nbits",
    "infer_shapes",
    "register_with_ort",
]


class IncompleteShapeInferenceError(RuntimeError):
    """Symbolic shape inference ended with values whose type or shape is not fully known."""


# ---- the handler ------------------------------------------------------------------------------


def _input_name(node: onnx.NodeProto, i: int) -> str:
    return node.input[i] if i < len(node.input) else ""


def _fmt(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _literal_mismatch(a, b) -> bool:
    return is_literal(a) and is_literal(b) and int(a) != int(b)  # None is no literal: any size


def infer_hc_lowrank_mix(ssi: SymbolicShapeInference, node: onnx.NodeProto) -> None:
    """Handler: pre_output (..., H), post_gate (..., C), streams_out (..., C*H) with H = C*H / C.

    H is a sympy expression when the width is symbolic and an int when it is known. Sizes are
    checked only where they are literals; a contradiction raises ValueError naming the node.
    """
    where = f"{OP_TYPE} node {node.name or node.output[0]!r}"
    attr = next((a for a in node.attribute if a.name == "num_branches"), None)
    problem = node_form_problem(attr, len(node.input), len(node.output))
    if problem:
        raise ValueError(f"{where}: {problem}")
    c = attr.i
    names = [_input_name(node, i) for i in range(len(INPUTS))]
    missing = [INPUTS[i] for i in range(NUM_REQUIRED_INPUTS) if not names[i]]
    if missing:
        raise ValueError(f"{where}: required input(s) {', '.join(missing)} missing")
    if bool(names[PREV_BLOCK_OUTPUT]) != bool(names[PREV_POST_GATE]):
        raise ValueError(
            f"{where}: prev_block_output and prev_post_gate come as a pair; got "
            f"prev_block_output={names[PREV_BLOCK_OUTPUT]!r}, prev_post_gate={names[PREV_POST_GATE]!r}"
        )
    present = [i for i, n in enumerate(names) if n]
    elem_types = {i: ssi.known_vi_[names[i]].type.tensor_type.elem_type for i in present if names[i] in ssi.known_vi_}
    known_types = {t for t in elem_types.values() if t}
    if len(known_types) > 1:
        found = ", ".join(f"{INPUTS[i]}={onnx.TensorProto.DataType.Name(t)}" for i, t in elem_types.items() if t)
        raise ValueError(f"{where}: all inputs must share one element type T; got {found}")
    if ssi._try_get_shape(node, STREAMS) is None:
        return  # rank unknown: nothing to add to what ONNX inferred
    streams = ssi._get_sympy_shape(node, STREAMS)
    if not streams:
        raise ValueError(f"{where}: streams must be (..., C*H) with rank >= 1; got a scalar")
    width, leading = streams[-1], streams[:-1]
    if is_literal(width) and int(width) % c:
        raise ValueError(f"{where}: streams width C*H = {width} is not divisible by num_branches = {c}")
    h = int(width) // c if is_literal(width) else sympy.simplify(width / c)

    shapes = {
        i: ssi._get_sympy_shape(node, i)
        for i in present
        if i != STREAMS and ssi._try_get_shape(node, i) is not None
    }
    r = shapes[DOWN_WEIGHT][1] if len(shapes.get(DOWN_WEIGHT, ())) == 2 else None  # R as down_weight states it
    expected = {  # None: any size
        NORM_SCALE: ("(C*H,)", [width]),
        DOWN_WEIGHT: ("(C*H, R)", [width, r]),
        UP_WEIGHT: ("(R, C*H)", [r, width]),
        INJECT_WEIGHT: ("(C*H, C)", [width, c]),
        PREV_BLOCK_OUTPUT: ("(..., H) with streams' leading dims", [*leading, h]),
        PREV_POST_GATE: ("(..., C) with streams' leading dims", [*leading, c]),
    }
    for i, got in shapes.items():
        spelled, want = expected[i]
        if len(got) != len(want) or any(_literal_mismatch(g, w) for g, w in zip(got, want)):
            shown = _fmt(["?" if w is None else w for w in want])
            raise ValueError(f"{where}: {INPUTS[i]} must be {spelled} = {shown}; got {_fmt(got)}")

    elem_type = elem_types.get(STREAMS) or next(iter(known_types), 0)
    _set_outputs(ssi, node, elem_type, leading, {PRE_OUTPUT: h, POST_GATE: c, STREAMS_OUT: width})


def _set_outputs(ssi: SymbolicShapeInference, node: onnx.NodeProto, elem_type: int, leading: list, last: dict) -> None:
    """Both ops' outputs: (*leading, last[o]) of elem_type, sympy dims; an omitted optional output is skipped."""
    for o, name in enumerate(node.output[: len(OUTPUTS)]):
        if not name:
            continue
        shape = [*leading, last[o]]
        ssi._update_computed_dims(shape)
        ssi.known_vi_[name].CopyFrom(helper.make_tensor_value_info(name, elem_type, get_shape_from_sympy_shape(shape)))


def _dim_of(d) -> nbits_schema.Dim:
    """A sympy dim as the schema's inference takes it: int when literal, the symbol's name, else unknown."""
    if is_literal(d):
        return int(d)
    return str(d) if isinstance(d, sympy.Symbol) else None


def infer_hc_lowrank_mix_nbits(ssi: SymbolicShapeInference, node: onnx.NodeProto) -> None:
    """Handler of the quantized op: the schema's rules (hcfuse.shapes.nbits_schema.infer_dims) on what the tool
    knows, then the outputs with sympy dims: pre_output (..., H), post_gate (..., C), streams_out (..., C*H),
    H = C*H / C also when the width is symbolic. A contradiction raises ValueError naming the node."""
    where = f"{_op_nbits.OP_TYPE} node {node.name or node.output[0]!r}"
    names = [_input_name(node, i) for i in range(len(_op_nbits.INPUTS))]
    present = [i for i, n in enumerate(names) if n]
    types = {i: ssi.known_vi_[names[i]].type.tensor_type.elem_type for i in present if names[i] in ssi.known_vi_}
    shapes = {i: None if ssi._try_get_shape(node, i) is None else [_dim_of(d) for d in ssi._get_sympy_shape(node, i)]
              for i in present}
    attributes = {a.name: a for a in node.attribute}
    try:
        found = nbits_schema.infer_dims(where, attributes.get, len(node.input), len(node.output), types, shapes)
    except InferenceError as e:
        raise ValueError(str(e)) from e
    if shapes[_op_nbits.STREAMS] is None or not found.elem_type:
        return  # rank or T unknown: nothing to add to what ONNX inferred
    streams = ssi._get_sympy_shape(node, _op_nbits.STREAMS)
    width, leading, c = streams[-1], streams[:-1], found.num_branches
    h = found.H if isinstance(found.H, int) else sympy.simplify(width / c)
    _set_outputs(ssi, node, found.elem_type, leading,
                 {PRE_OUTPUT: h, POST_GATE: c, STREAMS_OUT: width if found.H is None else h * c})


# ---- the tool with our handler ------------------------------------------------------------


def _add_handler(ssi: SymbolicShapeInference) -> None:
    ssi.dispatcher_[OP_TYPE] = functools.partial(infer_hc_lowrank_mix, ssi)
    ssi.dispatcher_[_op_nbits.OP_TYPE] = functools.partial(infer_hc_lowrank_mix_nbits, ssi)


def _register_schemas() -> None:
    """ORT's tool runs ONNX single-node inference first, which uses our schemas."""
    register_schema()
    nbits_schema.register_schema()


def _incomplete_values(ssi: SymbolicShapeInference) -> list[str]:
    bad = []
    for name, vi in ssi.known_vi_.items():
        if vi.type.WhichOneof("value") not in (None, "tensor_type"):
            continue
        shape = get_shape_from_value_info(vi)
        if not vi.type.tensor_type.elem_type or shape is None or any(d is None for d in shape):
            bad.append(f"{name} {shape}")
    return bad


class HcSymbolicShapeInference(SymbolicShapeInference):
    """ONNX Runtime's SymbolicShapeInference that also infers HyperConnectionLowRankMix and
    HyperConnectionLowRankMixNBits."""

    def __init__(self, int_max, auto_merge, guess_output_rank, verbose, prefix=""):
        super().__init__(int_max, auto_merge, guess_output_rank, verbose, prefix)
        _add_handler(self)

    def _onnx_infer_subgraph(self, node, subgraph, use_node_input=True, inc_subgraph_id=True):
        # The base class builds subgraph instances by its own name; give those our handler too.
        with register_with_ort():
            return super()._onnx_infer_subgraph(node, subgraph, use_node_input, inc_subgraph_id)

    @classmethod
    def infer_shapes(cls, in_mp, int_max=2**31 - 1, auto_merge=False, guess_output_rank=False, verbose=0):
        """The base driver loop with `cls`; raises instead of returning None or dumping a model file."""
        opset = get_opset(in_mp)
        if not opset or opset < 7:
            raise ValueError(f"symbolic shape inference needs an ONNX opset >= 7; the model imports {opset}")
        ssi = cls(int_max, auto_merge, guess_output_rank, verbose)
        ssi._preprocess(in_mp)
        complete = False
        while ssi.run_:
            complete = ssi._infer_impl()
        ssi._update_output_from_vi()
        if not complete:
            bad = _incomplete_values(ssi)
            raise IncompleteShapeInferenceError(
                f"symbolic shape inference left {len(bad)} value(s) without a full type and shape: "
                f"{'; '.join(bad[:8])}{' ...' if len(bad) > 8 else ''} (try auto_merge=True or guess_output_rank=True)"
            )
        return ssi.out_mp_


def _loaded_tool_classes() -> list[type]:
    # onnxruntime.transformers imports the same file a second time as top-level `symbolic_shape_infer`.
    modules = [_ssi_module, sys.modules.get("symbolic_shape_infer")]
    classes = [getattr(m, "SymbolicShapeInference", None) for m in modules if m is not None]
    return list(dict.fromkeys(c for c in classes if isinstance(c, type)))


@contextlib.contextmanager
def register_with_ort() -> Iterator[None]:
    """Within the block, every SymbolicShapeInference instance (ORT's entry points, its subclasses and
    subgraph passes included) also handles HyperConnectionLowRankMix and HyperConnectionLowRankMixNBits.
    Process-wide while active; restored in `finally`, so nesting and exceptions are safe."""
    _register_schemas()
    patched = []
    try:
        for klass in _loaded_tool_classes():
            original = klass.__dict__["__init__"]

            @functools.wraps(original)
            def __init__(self, *args, _original=original, **kwargs):
                _original(self, *args, **kwargs)
                _add_handler(self)

            klass.__init__ = __init__
            patched.append((klass, original))
        yield
    finally:
        for klass, original in reversed(patched):
            klass.__init__ = original


# ---- Constant forms ORT's tool cannot read ------------------------------------------------


_SCALAR_FORMS = {  # Constant attribute -> numpy dtype of the equivalent `value` tensor
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
    "value_string": object,
    "value_strings": object,
}


def _constant_value(attr: onnx.AttributeProto) -> onnx.TensorProto:
    if attr.name == "sparse_value":
        return sparse_to_dense(attr.sparse_tensor)
    return numpy_helper.from_array(np.array(helper.get_attribute_value(attr), dtype=_SCALAR_FORMS[attr.name]))


def _rewrite_constants(graph: onnx.GraphProto) -> int:
    """Turn Constant nodes using value_float/value_ints/.../sparse_value into `value` tensors (in place,
    subgraphs included); returns how many were rewritten."""
    count = 0
    for node in (node for g in proto_graphs(graph) for node in g.node):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1:
            attr = node.attribute[0]
            if attr.name in _SCALAR_FORMS or attr.name == "sparse_value":
                tensor = _constant_value(attr)
                node.ClearField("attribute")
                node.attribute.append(helper.make_attribute("value", tensor))
                count += 1
    return count


# ---- public API ---------------------------------------------------------------------------


def infer_shapes(
    model: onnx.ModelProto | ir.Model | str | os.PathLike,
    auto_merge: bool = True,
    guess_output_rank: bool = False,
    verbose: int = 0,
    int_max: int = 2**31 - 1,
):
    """ONNX Runtime's symbolic shape inference, HyperConnectionLowRankMix and its quantized form included.

    A ModelProto gives a new ModelProto with value_info for every value (Constants written as
    value_float/value_ints/... come back as equivalent `value` tensors). An onnx_ir.Model gives a
    copy with every value's type and shape set; a path gives the file's model as a ModelProto with
    them set, its external weights left as references to their files (relative to the model's
    folder). Neither of the last two reads a weight (initializers above a few KB enter inference as
    their shapes only), so a model with gigabytes of external data takes little memory. The
    caller's model is never modified.
    Raises IncompleteShapeInferenceError when some value ends without a full shape, ValueError on a
    node whose known sizes contradict each other (from the handler or ONNX's own inference); never
    writes files.
    """
    options = dict(auto_merge=auto_merge, guess_output_rank=guess_output_rank, verbose=verbose, int_max=int_max)
    if isinstance(model, (str, os.PathLike)):
        from hcfuse.files import model_io

        return ir.to_proto(apply_inferred_shapes(model_io.load(model), **options))
    if isinstance(model, ir.Model):
        return apply_inferred_shapes(model.clone(), **options)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"infer_shapes: expected an onnx.ModelProto, onnx_ir.Model or a path; got {type(model).__name__}")
    return _infer_proto(model, options)


def _infer_proto(model: onnx.ModelProto, options: dict) -> onnx.ModelProto:
    _register_schemas()
    work = onnx.ModelProto()
    work.CopyFrom(model)
    _rewrite_constants(work.graph)
    try:
        return HcSymbolicShapeInference.infer_shapes(work, **options)
    except InferenceError as e:  # ONNX's single-node pass (our schema's _infer) found the contradiction
        raise ValueError(str(e)) from e


def apply_inferred_shapes(model: ir.Model, **options) -> ir.Model:
    """Sets the inferred type and shape on every node output and graph output of ``model`` in place
    (weights not read); options as for infer_shapes. Returns model."""
    options = {"auto_merge": True, **options}
    from hcfuse.files.model_io import skeleton_proto

    inferred = ir.from_proto(_infer_proto(skeleton_proto(model), options))
    found = {}
    for graph in inferred.graphs():
        found.update({v.name: v for node in graph for v in node.outputs})
        found.update({v.name: v for v in graph.outputs})
    for graph in model.graphs():
        for value in [*(v for node in graph for v in node.outputs), *graph.outputs]:
            source = found.get(value.name)
            if source is not None and source.type is not None:
                value.type, value.shape = source.type, source.shape
    return model
