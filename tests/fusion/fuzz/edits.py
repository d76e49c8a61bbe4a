"""Building blocks of the fuzz's mutations: the per-mutant context (rng, feeds of the graph inputs the
mutations add, late edits of the proto) and small onnx_ir edits (new initializers, graph inputs, nodes)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import onnx_ir as ir

from tests.fusion.fuzz.bases import Base, blocks

@dataclasses.dataclass
class Context:
    base: Base
    rng: np.random.Generator
    feeds: dict = dataclasses.field(default_factory=dict)  # values of the graph inputs mutations add
    late: list = dataclasses.field(default_factory=list)  # (function, arguments) applied to the proto
    names: itertools.count = dataclasses.field(default_factory=itertools.count)

    @property
    def T(self) -> ir.DataType:
        return ir.DataType.from_numpy(np.dtype(self.base.dtype))

    @property
    def np_T(self) -> np.dtype:
        return np.dtype(self.base.dtype)

    def name(self, stem: str) -> str:
        return f"fuzz/{stem}/{next(self.names)}"

    def pick(self, items):
        items = [x for x in items if x is not None]
        return items[int(self.rng.integers(len(items)))] if items else None

    def block(self, model: ir.Model, need: tuple = ()) -> dict | None:
        return self.pick([b for b in blocks(model) if all(b.get(k) is not None for k in need)])




def initializer(model: ir.Model, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     shape=ir.Shape(array.shape), const_value=ir.tensor(array, name=name))
    model.graph.register_initializer(value)
    return value


def graph_input(model: ir.Model, ctx: Context, name: str, array: np.ndarray, dims=None) -> ir.Value:
    """A new graph input fed with array, declared with dims (None: array's shape; False: its rank only,
    every dim unknown: ONNX wants a graph input's shape field, not its dims)."""
    shape = ir.Shape([None] * array.ndim if dims is False else array.shape if dims is None else dims)
    value = ir.Value(name=name, type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), shape=shape)
    model.graph.inputs.append(value)
    ctx.feeds[name] = array
    return value


def constant_node(model: ir.Model, before: ir.Node, name: str, attributes: dict, dtype, shape) -> ir.Value:
    out = ir.Value(name=name, type=ir.TensorType(dtype), shape=None if shape is None else ir.Shape(shape))
    model.graph.insert_before(before, ir.node("Constant", [], attributes, outputs=[out], name=name + "/node"))
    return out


def add_node(model: ir.Model, before: ir.Node, op_type: str, inputs, attributes=None, *, dtype, shape,
              name: str, domain: str = "") -> ir.Value:
    out = ir.Value(name=name, type=ir.TensorType(dtype), shape=None if shape is None else ir.Shape(shape))
    model.graph.insert_before(before, ir.node(op_type, inputs, attributes or {}, domain=domain, outputs=[out],
                                              name=name + "/node"))
    return out


def as_initializer(model: ir.Model, value: ir.Value) -> ir.Value:
    """value itself when it is an initializer; a Constant node's output is turned into one."""
    if value.const_value is not None and value.producer() is None:
        return value
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    init = initializer(model, value.name + ".init", np.asarray(tensor.numpy()))
    value.replace_all_uses_with(init)
    return init


def declared_lead(ctx: Context) -> list:
    return list(ctx.base.leading_dims)


def unknown_dims(ctx: Context) -> ir.Shape:
    """The rank of every activation of a block, no dims: what a graph output without value_info declares."""
    return ir.Shape([None] * (len(ctx.base.leading_dims) + 1))


def random_like(ctx: Context, shape, scale: float = 1.0) -> np.ndarray:
    return (ctx.rng.standard_normal(shape) * scale).astype(ctx.np_T)


def set_attr(node: ir.Node, name: str, value) -> None:
    if value is None:
        node.attributes.pop(name, None)
    else:
        node.attributes[name] = ir.convenience.convert_attribute(name, value)


def nodes_before(model: ir.Model, node: ir.Node) -> set:
    out = set()
    for n in model.graph:
        if n is node:
            return out
        out.add(n)
    return out


def add_silu_scale(model: ir.Model, ctx: Context, b: dict, array: np.ndarray) -> ir.Value:
    silu = b["silu"]
    value = initializer(model, ctx.name("silu_scale"), array)
    silu.resize_inputs(2)
    silu.replace_input_with(1, value)
    return value


# ---- the mutations -------------------------------------------------------------------------------
