"""Shapes and element types of values, derived from the graph itself (never from a weight's data).

Exporters often write no value_info, and the contrib ops have no ONNX-side schema, so the shapes the
fusion's conditions need (a post gate is (..., C), a block output (..., H)) are not on the values.
They follow from the graph: the gate is Mul(Sigmoid(Div(MatMul(hn, inject[C*H, C])))), so (..., C).
ShapeFacts propagates declared shapes through the ops of the block and its neighbours, on demand and
memoized for one fusion call; nothing is written into the model.

A dim is an int, a symbol (str: equal symbols are equal dims) or None (unknown, equal to nothing).
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from hcfuse import _op
from hcfuse.rewrite.values import attr_value, true_constant

Dims = tuple  # of int | str | None


@dataclasses.dataclass(frozen=True)
class Fact:
    dtype: ir.DataType | None
    dims: Dims | None


_UNKNOWN = Fact(None, None)


def _declared(value: ir.Value) -> Fact:
    dtype = value.dtype
    shape = value.shape
    if shape is None and value.const_value is not None:
        shape = value.const_value.shape
    if dtype is None and value.const_value is not None:
        dtype = value.const_value.dtype
    if shape is None:
        return Fact(dtype, None)
    dims = tuple(d if isinstance(d, int) else (d.value if isinstance(d.value, str) else None) for d in shape.dims)
    return Fact(dtype, dims)


def _merge(declared: Fact, derived: Fact) -> Fact:
    """Declared and derived facts together: a known dim wins over an unknown one, an int over a symbol."""
    dtype = declared.dtype or derived.dtype
    a, b = declared.dims, derived.dims
    if a is None or b is None or len(a) != len(b):
        return Fact(dtype, a if a is not None else b)
    return Fact(dtype, tuple(_better(x, y) for x, y in zip(a, b)))


def _better(x, y):
    if isinstance(x, int):
        return x
    if isinstance(y, int):
        return y
    return x if x is not None else y


def _broadcast(a: Dims | None, b: Dims | None) -> Dims | None:
    if a is None or b is None:
        return None
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == y:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif isinstance(x, int) and x > 1 and not isinstance(y, int):
            out.append(x)  # the other must be x (or 1) for the node to run
        elif isinstance(y, int) and y > 1 and not isinstance(x, int):
            out.append(y)
        else:
            out.append(None)
    return tuple(out)


def _with_last(dims: Dims | None, last) -> Dims | None:
    return None if not dims else (*dims[:-1], last)


def _ints(value: ir.Value | None) -> list[int] | None:
    tensor = true_constant(value)
    return None if tensor is None else [int(v) for v in tensor.numpy().reshape(-1)]


def _matmul(a: Dims | None, b: Dims | None) -> Dims | None:
    if a is None or b is None or not a or not b:
        return None
    if len(b) == 1:
        return a[:-1]
    if len(a) == 1:
        return (*b[:-2], b[-1])
    lead = _broadcast(a[:-2], b[:-2])
    return None if lead is None else (*lead, a[-2], b[-1])


def _split(node: ir.Node, dims: Dims | None) -> list[Dims | None]:
    n = len(node.outputs)
    axis = attr_value(node, "axis", 0)
    if dims is None or not isinstance(axis, int) or not -len(dims) <= axis < len(dims):
        return [None] * n
    axis %= len(dims)
    sizes = _ints(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if sizes is None and isinstance(dims[axis], int) and dims[axis] % n == 0:
        sizes = [dims[axis] // n] * n
    if sizes is None or len(sizes) != n:
        return [None] * n
    return [(*dims[:axis], s, *dims[axis + 1 :]) for s in sizes]


def _reshape(node: ir.Node, dims: Dims | None) -> Dims | None:
    target = _ints(node.inputs[1]) if len(node.inputs) > 1 else None
    if target is None:
        return None
    allowzero = attr_value(node, "allowzero", 0)
    out = [dims[i] if (t == 0 and not allowzero and dims is not None and i < len(dims)) else t
           for i, t in enumerate(target)]
    if any(t == 0 and not allowzero for t in target) and dims is None:
        return None
    if -1 in out:
        known = [d for d in out if d != -1]
        if dims is None or not all(isinstance(d, int) for d in (*dims, *known)):
            return tuple(None if d == -1 else d for d in out)
        total = 1
        for d in dims:
            total *= d
        rest = 1
        for d in known:
            rest *= d
        out = [total // rest if d == -1 and rest else d for d in out]
    return tuple(out)


def _tile(node: ir.Node, dims: Dims | None) -> Dims | None:
    repeats = _ints(node.inputs[1]) if len(node.inputs) > 1 else None
    if dims is None or repeats is None or len(repeats) != len(dims):
        return None
    return tuple(d * r if isinstance(d, int) else (d if r == 1 else None) for d, r in zip(dims, repeats))


def _lowrank_mix(node: ir.Node, facts: list[Fact]) -> list[Dims | None]:
    streams = facts[0].dims
    C = attr_value(node, "num_branches", None)
    up = facts[3].dims if len(facts) > 3 else None
    width = streams[-1] if streams and isinstance(streams[-1], int) else (up[-1] if up and len(up) == 2 else None)
    H = width // C if isinstance(width, int) and isinstance(C, int) and C > 0 else None
    return [_with_last(streams, H), _with_last(streams, C), streams]


def _infer(node: ir.Node, facts: list[Fact]) -> list[Fact]:
    """Output facts of node from its inputs' facts (unknown for ops outside the block's neighbourhood)."""
    n = len(node.outputs)
    first = facts[0] if facts else _UNKNOWN
    op, dom = node.op_type, node.domain
    same = Fact(first.dtype, first.dims)
    if dom == _op.DOMAIN:
        if op in (_op.BRANCH_NORM, _op.SCALED_SILU, _op.POST_MIX):
            return [same] + [_UNKNOWN] * (n - 1)
        if op == _op.PRE_MIX:
            C = attr_value(node, "num_branches", 0)
            dims = first.dims
            if not dims:
                return [_UNKNOWN] * n
            if isinstance(C, int) and C > 0:
                last = dims[-1] // C if isinstance(dims[-1], int) and dims[-1] % C == 0 else None
                return [Fact(first.dtype, _with_last(dims, last))]
            return [Fact(first.dtype, (*dims[:-2], dims[-1]) if len(dims) >= 2 else None)]
        if op == _op.OP_TYPE:
            return [Fact(first.dtype, d) for d in _lowrank_mix(node, facts)][:n]
        return [_UNKNOWN] * n
    if dom not in ("", "ai.onnx"):
        return [_UNKNOWN] * n
    if op in ("Identity", "Sigmoid", "Relu", "Neg", "Tanh", "Sqrt", "Reciprocal"):
        return [same]
    if op in ("Div", "Mul", "Add", "Sub") and len(facts) == 2:
        return [Fact(first.dtype, _broadcast(first.dims, facts[1].dims))]
    if op == "MatMul" and len(facts) == 2:
        return [Fact(first.dtype, _matmul(first.dims, facts[1].dims))]
    if op == "Split":
        return [Fact(first.dtype, d) for d in _split(node, first.dims)]
    if op == "Reshape":
        return [Fact(first.dtype, _reshape(node, first.dims))]
    if op == "Tile":
        return [Fact(first.dtype, _tile(node, first.dims))]
    if op == "Cast":
        to = attr_value(node, "to", None)
        return [Fact(ir.DataType(to) if isinstance(to, int) else None, first.dims)]
    if op == "Constant":
        tensor = true_constant(node.outputs[0])
        return [Fact(tensor.dtype, tuple(tensor.shape.dims)) if tensor is not None else _UNKNOWN]
    return [_UNKNOWN] * n


class ShapeFacts:
    """Facts for the values of one fusion call, computed when first asked for (iteratively: a
    96-block chain is thousands of producers deep)."""

    def __init__(self):
        self._memo: dict[ir.Value, Fact] = {}

    def fact(self, value: ir.Value | None) -> Fact:
        if value is None:
            return _UNKNOWN
        memo = self._memo
        stack, expanded = [value], set()
        while stack:
            current = stack[-1]
            if current in memo:
                stack.pop()
                continue
            node = current.producer()
            if node is None:
                memo[current] = _declared(current)
                stack.pop()
                continue
            missing = [v for v in node.inputs if v is not None and v not in memo]
            if missing and node not in expanded:  # a cycle (invalid graph) falls through as unknown
                expanded.add(node)
                stack.extend(missing)
                continue
            derived = _infer(node, [memo.get(v, _UNKNOWN) if v is not None else _UNKNOWN for v in node.inputs])
            derived += [_UNKNOWN] * (len(node.outputs) - len(derived))
            for out, fact in zip(node.outputs, derived):
                memo[out] = _merge(_declared(out), fact)
            stack.pop()
        return memo[value]

    def dims(self, value: ir.Value | None) -> Dims | None:
        return self.fact(value).dims

    def dtype(self, value: ir.Value | None) -> ir.DataType | None:
        return self.fact(value).dtype
