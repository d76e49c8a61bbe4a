"""Inputs that verify runs both models on: a size for every symbolic dim and data for every graph input.

Sizes. A symbolic dim takes the size the caller names for it (``dims``), else what the graph says
it must be, else ``rows``; a genai decoder's ``sequence_length`` beside a past defaults to 1 instead
(a decode step: GroupQueryAttention takes several new tokens after a past only at batch size 1).
The graph says what a dim must be in three ways:
- a dim written as an expression (``past_sequence_length + 1``) is that expression of its names;
- a Concat whose output dim is a name and whose inputs' dims along the axis are known (ONNX shape
  inference fills the intermediate ones) makes that name their sum: a KV cache's
  ``present`` [batch, heads, total, head] = Concat(``past_key`` [.., past, ..], key [.., seq, ..]);
- onnxruntime-genai's model builder names its dims ``batch_size``, ``sequence_length``,
  ``past_sequence_length`` and ``total_sequence_length`` (= past + sequence) and computes the
  attention from the mask (GroupQueryAttention, no Concat), so its names carry that relation.

Data. Floating-point inputs are normal random; an attention mask is ones; position ids (and
``cache_position``) count on from the past length; an integer input used as Gather indices (token
ids) is random below the gathered axis' size; one used as a shape (Reshape, Expand, ConstantOfShape)
is the declared shape of that node's output (Expand's else ones, as Tile's repeats); an integer input
named like a dim holds that size (``seqlens_k`` the mask length - 1); other integer inputs are zeros.
An input no data can be made for (a string, sequence, map or optional input, one without a shape, a
shape input whose target is not declared) raises NotFeedable: verify reports the model as not
verified, naming it.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import onnx
import onnx_ir as ir
import sympy

# onnxruntime-genai's builder: total_sequence_length = past_sequence_length + sequence_length
_GENAI_TOTAL, _GENAI_PAST, _GENAI_SEQUENCE = "total_sequence_length", "past_sequence_length", "sequence_length"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
# node type -> index of the input that is a shape (whose value is the output's shape)
_SHAPE_INPUTS = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0}


class NotFeedable(ValueError):
    """No data can be made for a graph input; the message names it and says why."""


@dataclasses.dataclass(frozen=True)
class Relation:
    """name = expression of other names, and where the graph says so."""

    name: str
    expression: sympy.Expr
    source: str


def _dim_expression(dim) -> sympy.Expr | None:
    """A dim as a sympy expression: an int, a name, or an expression of names; None when unknown."""
    if isinstance(dim, int):
        return sympy.Integer(dim)
    text = str(dim.value) if getattr(dim, "value", None) else ""
    if not text:
        return None
    if _IDENTIFIER.fullmatch(text):
        return sympy.Symbol(text)
    names = {name: sympy.Symbol(name) for name in _IDENTIFIER.findall(text)}
    try:
        return sympy.sympify(text, locals=names)
    except (sympy.SympifyError, SyntaxError, TypeError):
        return sympy.Symbol(text)


def _shape_expressions(shape) -> list[sympy.Expr | None] | None:
    return None if shape is None else [_dim_expression(d) for d in shape]


def _inferred_shapes(model: ir.Model) -> dict[str, list]:
    """Every value's shape (as dim expressions) after ONNX's shape inference; declared shapes win."""
    from hcfuse.files.model_io import skeleton_proto

    try:
        proto = onnx.shape_inference.infer_shapes(skeleton_proto(model), data_prop=True)
        inferred = ir.from_proto(proto).graph
        values = [*inferred.inputs, *inferred.outputs, *(v for node in inferred for v in node.outputs)]
    except Exception:  # inference is a help here, never a requirement
        values = []
    graph = model.graph
    declared = [*graph.inputs, *graph.outputs, *(v for node in graph for v in node.outputs)]
    shapes = {}
    for value in [*values, *declared]:
        if value.shape is not None:
            shapes[value.name] = _shape_expressions(value.shape)
    return shapes


def _concat_relations(model: ir.Model, shapes: dict[str, list]) -> list[Relation]:
    relations = []
    for node in model.graph:
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx") or not node.outputs:
            continue
        out = shapes.get(node.outputs[0].name)
        axis_attr = node.attributes.get("axis")
        if out is None or axis_attr is None:
            continue
        axis = axis_attr.as_int()
        axis = axis + len(out) if axis < 0 else axis
        if not 0 <= axis < len(out) or not isinstance(out[axis], sympy.Symbol):
            continue
        parts = [shapes.get(v.name) if v is not None else None for v in node.inputs]
        if any(p is None or len(p) != len(out) or p[axis] is None for p in parts):
            continue
        total = sympy.Add(*(p[axis] for p in parts))
        if total.free_symbols and total != out[axis]:
            relations.append(Relation(str(out[axis]), total, f"Concat node {node.name!r}"))
    return relations


def _graph_dims(model: ir.Model) -> tuple[list[str], list[Relation]]:
    """The dim names of the graph inputs (in order), and the relations the graph states between names."""
    names: list[str] = []
    relations: list[Relation] = []
    for value in [*model.graph.inputs, *model.graph.outputs]:
        for dim in _shape_expressions(value.shape) or ():
            if dim is None or dim.is_Integer:
                continue
            if not dim.is_Symbol:  # an expression: the name it spells is that expression of its names
                relations.append(Relation(str(dim), dim, f"dim {str(dim)!r} of {value.name!r}"))
            for symbol in sorted(dim.free_symbols, key=str):
                if value in model.graph.inputs and str(symbol) not in names:
                    names.append(str(symbol))
    relations += _concat_relations(model, _inferred_shapes(model))
    # every layer's Concat states the same relation: keep one
    relations = list({(r.name, r.expression): r for r in relations}.values())
    defined = {r.name for r in relations}
    every = {str(s) for r in relations for s in r.expression.free_symbols} | set(names) | defined
    if {_GENAI_TOTAL, _GENAI_PAST, _GENAI_SEQUENCE} <= every and _GENAI_TOTAL not in defined:
        relations.append(Relation(_GENAI_TOTAL, sympy.Symbol(_GENAI_PAST) + sympy.Symbol(_GENAI_SEQUENCE),
                                  "onnxruntime-genai's dim names"))
    return names, relations


def resolve_dims(model: ir.Model, given: dict[str, int] | None, rows: int) -> dict[str, int]:
    """A size for every dim name the graph inputs use (see the module doc). Raises ValueError when
    ``given`` names a dim no input or output uses, or its sizes contradict a relation of the graph."""
    names, relations = _graph_dims(model)
    known_names = set(names) | {r.name for r in relations} | {
        str(s) for r in relations for s in r.expression.free_symbols}
    given = dict(given or {})
    unknown = sorted(set(given) - known_names)
    if unknown:
        raise ValueError(f"verify: dims {unknown} are not dims of the model; its inputs use "
                         f"{sorted(names) or 'no symbolic dims'}")
    sizes: dict[str, int] = {name: int(value) for name, value in given.items()}
    pending = list(relations)
    while True:
        progressed = False
        for relation in list(pending):
            equation = sympy.Eq(sympy.Symbol(relation.name), relation.expression).subs(_symbols(sizes))
            if equation == sympy.true:
                pending.remove(relation)
                continue
            if equation == sympy.false:
                raise ValueError(f"verify: {relation.name} = {sizes[relation.name]}, but {relation.source} makes it "
                                 f"{relation.expression} = {relation.expression.subs(_symbols(sizes))}; "
                                 "set the dims consistently")
            if len(equation.free_symbols) == 1:
                [unknown] = equation.free_symbols
                solved = sympy.solve(equation, unknown)
                if len(solved) == 1 and solved[0].is_Integer:
                    if solved[0] < 0:
                        raise ValueError(f"verify: {relation.source} makes {unknown} = {solved[0]} from the sizes "
                                         f"{sizes}; set the dims consistently")
                    sizes[str(unknown)] = int(solved[0])
                    progressed = True
        if progressed:
            continue
        order = [*names, *sorted(known_names)]
        defined = {r.name for r in pending}
        free = [n for n in order if n not in sizes and n not in defined] or [n for n in order if n not in sizes]
        if not free:
            return sizes
        decode_step = free[0] == _GENAI_SEQUENCE and _GENAI_PAST in known_names
        sizes[free[0]] = 1 if decode_step else rows


def _symbols(sizes: dict[str, int]) -> dict:
    return {sympy.Symbol(name): size for name, size in sizes.items()}


def _evaluated(shape, sizes: dict[str, int]) -> list[int] | None:
    dims = _shape_expressions(shape)
    if dims is None or any(d is None for d in dims):
        return None
    values = [d.subs(_symbols(sizes)) for d in dims]
    return [int(v) for v in values] if all(v.is_Integer for v in values) else None


def _integer_data(model: ir.Model, value: ir.Value, shape: list[int], sizes: dict[str, int], mask_length,
                  rng: np.random.Generator) -> np.ndarray:
    name = value.name.lower()
    if "mask" in name:
        return np.ones(shape)
    if "position" in name:  # position_ids, cache_position: the new tokens' positions after the past
        length = shape[-1] if shape else 1
        start = max(mask_length - length, 0) if mask_length is not None else 0
        return np.broadcast_to(np.arange(start, start + length), shape) if shape else np.array(start)
    if value.name in sizes:
        return np.full(shape, sizes[value.name])
    if value.name == _GENAI_TOTAL and mask_length is not None:
        return np.full(shape, mask_length)
    if name == "seqlens_k" and mask_length is not None:
        return np.full(shape, mask_length - 1)
    for node, index in value.uses():
        if node.op_type == "Gather" and index == 1 and node.inputs[0] is not None:
            data_shape = node.inputs[0].shape
            axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 0
            size = data_shape[axis] if data_shape is not None and len(data_shape) > axis else None
            if isinstance(size, int) and size > 0:
                return rng.integers(0, size, shape)
        if node.op_type == "Tile" and index == 1:
            return np.ones(shape)
        if _SHAPE_INPUTS.get(node.op_type) == index and node.domain in ("", "ai.onnx"):
            target = _evaluated(node.outputs[0].shape, sizes)
            if target is not None and [len(target)] == list(shape):
                return np.array(target)
            if node.op_type == "Expand":
                return np.ones(shape)  # broadcasts to the data's own shape
            raise NotFeedable(f"graph input {value.name!r} is the shape of {node.op_type} node {node.name!r}, whose "
                              "output has no declared shape to take its value from")
    return np.zeros(shape)


def make_feeds(model: ir.Model, sizes: dict[str, int], rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Data for every graph input that is not an initializer (see the module doc)."""
    inputs = [v for v in model.graph.inputs if v.name not in model.graph.initializers]
    shapes = {}
    for value in inputs:
        if not isinstance(value.type, ir.TensorType):
            kind = type(value.type).__name__ if value.type is not None else "value without a type"
            raise NotFeedable(f"graph input {value.name!r} is a {kind}; verify makes tensor inputs only")
        if value.dtype == ir.DataType.STRING:
            raise NotFeedable(f"graph input {value.name!r} is a string tensor; verify makes numeric inputs only")
        if value.shape is None:
            raise NotFeedable(f"graph input {value.name!r} has no shape (not even a rank) to make data for")
        dims = _shape_expressions(value.shape)
        shapes[value.name] = [rows if d is None else int(d.subs(_symbols(sizes)))
                              for d in dims]
    masks = [shapes[v.name] for v in inputs if "mask" in v.name.lower() and shapes[v.name]]
    mask_length = masks[0][-1] if masks else None
    feeds = {}
    for value in inputs:
        shape = shapes[value.name]
        if value.dtype.is_floating_point():
            data = rng.standard_normal(shape)
            static = all(isinstance(d, int) for d in value.shape)
            if static and len(shape) >= 2 and shape[-2] > 0:
                data /= np.sqrt(shape[-2])  # a weight fed as an input: products stay of unit size
        elif value.dtype == ir.DataType.BOOL:
            data = np.ones(shape) if "mask" in value.name.lower() else rng.integers(0, 2, shape)
        else:
            data = _integer_data(model, value, shape, sizes, mask_length, rng)
        feeds[value.name] = np.asarray(data).astype(value.dtype.numpy())  # 0-d stays 0-d
    return feeds
