"""Weights the fused node needs in another layout than the model stores them, computed lazily.

- the halves of ORT GenAI's packed [C*H, R+C] down/inject weight,
- a (C, H) or (H) norm scale as the fused op's (C*H),
- the zero inject weight of the final mix (which has no inject half),
- for the quantized op, weights side by side (`concatenated`): separate down and inject MatMulNBits tensors
  along N (B, scales and zero points rows: lossless), dense down and inject as one [C*H, R+C] weight, or a
  part of one value (zero inject rows, default zero points) where the chain has none.

Each derived initializer is keyed by what it is derived from and its layout (kind, source value, C,
element type), so blocks that share a source share the derived weight only when the layout agrees too
(two blocks of different C sharing one (H) scale get two). Its name is new in the whole model.
Nothing is read to fuse: the data is computed when the model is saved or serialized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from hcfuse.rewrite.values import true_constant

_KEY = "hcfuse.derived_weight"  # Value.meta key (in memory only) holding the derivation key


class NameScope:
    """Names taken anywhere in a model (values and nodes of the graph, its subgraphs and its
    functions); fresh() hands out names that alias none of them. Scans the model when first asked."""

    def __init__(self, model: ir.Model):
        self._model = model
        self._taken: set[str] | None = None

    def _scan(self) -> set[str]:
        taken: set[str] = set()
        graphs = [*self._model.graphs()]
        for function in self._model.functions.values():
            graphs += [function, *function.subgraphs()]
        for graph in graphs:
            taken.update(v.name for v in graph.inputs if v.name)
            taken.update(v.name for v in graph.outputs if v.name)
            if isinstance(graph, ir.Graph):
                taken.update(graph.initializers)
            for node in graph:
                if node.name:
                    taken.add(node.name)
                taken.update(v.name for v in node.outputs if v.name)
        return taken

    def fresh(self, base: str) -> str:
        if self._taken is None:
            self._taken = self._scan()
        name, n = base, 0
        while name in self._taken:
            n += 1
            name = f"{base}.{n}"
        self._taken.add(name)
        return name


class DerivedWeights:
    """The derived weights of one call, found by key: those already in a graph (indexed once per
    graph, so a later call, or a later match with the stateless rules, reuses them) and new ones.
    A graph holds them as initializers; a model-local function, which has none, as Constant nodes."""

    def __init__(self, model: ir.Model):
        self.names = NameScope(model)
        self._index: dict[ir.Graph | ir.Function, dict[tuple, ir.Value]] = {}

    @staticmethod
    def _existing(where: ir.Graph | ir.Function) -> dict[tuple, ir.Value]:
        if isinstance(where, ir.Function):
            values = [node.outputs[0] for node in where if node.op_type == "Constant" and node.outputs]
        else:
            values = list(where.initializers.values())
        return {v.meta[_KEY]: v for v in values if _KEY in v.meta}

    def get(self, op, where: ir.Graph | ir.Function, key: tuple, base: str, dtype: ir.DataType, shape: tuple,
            make) -> ir.Value:
        index = self._index.get(where)
        if index is None:
            index = self._index[where] = self._existing(where)
        value = index.get(key)
        if value is None:
            name = self.names.fresh(base)
            tensor = ir.LazyTensor(lambda: make(name), dtype=dtype, shape=ir.Shape(shape), name=name)
            if isinstance(where, ir.Function):
                value = op.Constant(value=tensor, _outputs=[name])
                value.shape, value.type = ir.Shape(shape), ir.TensorType(dtype)
            else:
                value = op.initializer(tensor, name)
            value.meta[_KEY] = key
            index[key] = value
        return value


def _read(source: ir.TensorProtocol, index=Ellipsis) -> np.ndarray:
    """A copy of source's data (or of source[index]). An external tensor is read through a mapping of its
    own, released after: parallel writers evaluate several derived weights at once, and releasing a shared
    mapping under another one fails; peak memory stays one tensor, not the model."""
    tensor = source
    if isinstance(source, ir.ExternalTensor):
        tensor = ir.ExternalTensor(source.location, source.offset, source.length, source.dtype,
                                   shape=source.shape, name=source.name, base_dir=source.base_dir)
    data = np.ascontiguousarray(tensor.numpy()[index])
    if tensor is not source:
        tensor.release()
    return data


@dataclasses.dataclass(frozen=True)
class Filled:
    """A part of a concatenation that holds one number everywhere (in the concatenation's type)."""

    shape: tuple
    value: float


def concatenated(op, graph: ir.Graph | ir.Function, weights: DerivedWeights, parts: Sequence[ir.Value | Filled],
                 axis: int, base: str, dtype: ir.DataType, columns: int | None = None) -> ir.Value:
    """The constant parts (values, or Filled blocks) side by side along axis, as one weight of dtype; with
    columns, each part first as the matrix [-1, columns] of its bytes (a flat part listed row by row)."""
    parts = tuple(parts)
    sources = [part if isinstance(part, Filled) else true_constant(part) for part in parts]
    shapes = [tuple(source.shape) if isinstance(source, Filled) else tuple(source.shape.dims) for source in sources]
    if columns is not None:
        shapes = [(int(np.prod(s)) // columns, columns) for s in shapes]
    shape = list(shapes[0])
    shape[axis] = sum(s[axis] for s in shapes)

    def make(name: str) -> ir.Tensor:
        arrays = [np.full(s.shape, s.value, dtype=dtype.numpy()) if isinstance(s, Filled) else _read(s)
                  for s in sources]
        arrays = [a.reshape(part_shape) for a, part_shape in zip(arrays, shapes)]
        return ir.tensor(np.concatenate(arrays, axis=axis), name=name)

    return weights.get(op, graph, ("concat", axis, parts, dtype, columns), base, dtype, tuple(shape), make)


def reshaped(op, graph: ir.Graph | ir.Function, weights: DerivedWeights, value: ir.Value, shape: tuple) -> ir.Value:
    """A constant value's bytes in another shape (a flat tensor as the matrix it lists row by row)."""
    source = true_constant(value)
    make = lambda name: ir.tensor(_read(source).reshape(shape), name=name)  # noqa: E731
    return weights.get(op, graph, ("reshape", value, shape), f"{value.name}.matrix", source.dtype, shape, make)


def packed_halves(op, graph: ir.Graph | ir.Function, weights: DerivedWeights, packed: ir.Value, R: int, C: int,
                  dtype: ir.DataType) -> tuple[ir.Value, ir.Value]:
    """(down [C*H, R], inject [C*H, C]) sliced from a constant packed [C*H, R+C] weight."""
    source = true_constant(packed)
    CH = source.shape[0]

    def half(columns: slice):
        return lambda name: ir.tensor(_read(source, (slice(None), columns)), name=name)

    down = weights.get(op, graph, ("packed.down", packed, R, C), f"{packed.name}.down", dtype, (CH, R),
                    half(slice(0, R)))
    inject = weights.get(op, graph, ("packed.inject", packed, R, C), f"{packed.name}.inject", dtype, (CH, C),
                      half(slice(R, R + C)))
    return down, inject


def flat_norm_scale(op, graph: ir.Graph | ir.Function, weights: DerivedWeights, scale: ir.Value, layout: str, C: int,
                    H: int) -> ir.Value:
    """A constant (C, H) ("grouped") or (H) ("shared") norm scale as the fused op's (C*H)."""
    source = true_constant(scale)
    if layout == "grouped":
        make = lambda name: ir.tensor(np.ascontiguousarray(source.numpy().reshape(-1)), name=name)  # noqa: E731
    else:
        make = lambda name: ir.tensor(np.tile(source.numpy(), C), name=name)  # noqa: E731
    return weights.get(op, graph, ("norm." + layout, scale, C, H), f"{scale.name}.flat", source.dtype,
                    (C * H,), make)


def zero_inject(op, graph: ir.Graph | ir.Function, weights: DerivedWeights, C: int, H: int, dtype: ir.DataType) -> ir.Value:
    """The final mix has no inject half: pre_output does not depend on the inject weight, so a zero
    weight (post_gate = sigmoid(0)) leaves it unchanged and the unused post_gate is never read."""
    CH = C * H
    np_dtype = dtype.numpy()
    make = lambda name: ir.tensor(np.zeros((CH, C), dtype=np_dtype), name=name)  # noqa: E731
    return weights.get(op, graph, ("zero_inject", None, C, H, dtype), f"hcfuse.zero_inject_weight.{CH}x{C}.{dtype.name}",
                    dtype, (CH, C), make)
