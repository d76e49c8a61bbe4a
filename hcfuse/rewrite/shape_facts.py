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

from hcfuse import _op, _op_nbits
from hcfuse.rewrite.values import attr_value, true_constant

Dims = tuple  # of int | str | None


@dataclasses.dataclass(frozen=True)
class Fact:
    dtype: ir.DataType | None
    dims: Dims | None


_UNKNOWN = Fact(None, None)


def _declared(value: ir.Value) -> Fact:
    dtype, shape = value.dtype, value.shape
    # an overridable default's tensor says nothing of what a caller may feed: only its declared type counts
    default = value.const_value if not value.is_graph_input() else None
    if shape is None and default is not None:
        shape = default.shape
    if dtype is None and default is not None:
        dtype = default.dtype
    if shape is None:
        return Fact(dtype, None)
    dims = tuple(d if isinstance(d, int) else (d.value if isinstance(d.value, str) else None) for d in shape.dims)
    return Fact(dtype, dims)


def _merge(declared: Fact, derived: Fact) -> Fact:
    """Declared and derived facts together: a known dim wins over an unknown one, an int over a symbol;
    where the two contradict each other (a wrong value_info), nothing is known."""
    if declared.dtype and derived.dtype and declared.dtype != derived.dtype:
        dtype = None
    else:
        dtype = declared.dtype or derived.dtype
    a, b = declared.dims, derived.dims
    if a is None or b is None:
        return Fact(dtype, a if a is not None else b)
    if len(a) != len(b):
        return Fact(dtype, None)
    return Fact(dtype, tuple(_better(x, y) for x, y in zip(a, b)))


def _better(x, y):
    if isinstance(x, int) and isinstance(y, int):
        return x if x == y else None
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
    if out.count(-1) == 1:
        out[out.index(-1)] = _inferred_dim(dims, [d for d in out if d != -1])
    return tuple(out)


def _inferred_dim(dims: Dims | None, others: list):
    """Reshape's -1: the input's size over the other output dims' (symbols must cancel out)."""
    if dims is None or None in dims or None in others:
        return None
    if sorted(d for d in dims if isinstance(d, str)) != sorted(d for d in others if isinstance(d, str)):
        return None
    total, rest = 1, 1
    for d in dims:
        total *= d if isinstance(d, int) else 1
    for d in others:
        rest *= d if isinstance(d, int) else 1
    return total // rest if rest and total % rest == 0 else None


def _tile(node: ir.Node, dims: Dims | None) -> Dims | None:
    repeats = _ints(node.inputs[1]) if len(node.inputs) > 1 else None
    if dims is None or repeats is None or len(repeats) != len(dims):
        return None
    return tuple(d * r if isinstance(d, int) else (d if r == 1 else None) for d, r in zip(dims, repeats))


def _up_width(node: ir.Node, facts: list[Fact]) -> int | str | None:
    """C*H from the fused node's up weight: a dense [R, C*H] or (quantized op) MatMulNBits' B [C*H, kb, blob]."""
    if node.domain == _op_nbits.DOMAIN:
        up = facts[_op_nbits.UP_WEIGHT] if len(facts) > _op_nbits.UP_WEIGHT else _UNKNOWN
        if up.dtype == ir.DataType.UINT8:
            return up.dims[0] if up.dims and len(up.dims) == 3 else None
    else:
        up = facts[_op.UP_WEIGHT] if len(facts) > _op.UP_WEIGHT else _UNKNOWN
    return up.dims[-1] if up.dims and len(up.dims) == 2 else None


def _lowrank_mix(node: ir.Node, facts: list[Fact]) -> list[Dims | None]:
    """The outputs of either fused op (dense or quantized): (..., H), (..., C), (..., C*H)."""
    streams = facts[0].dims
    C = attr_value(node, "num_branches", None)
    width = streams[-1] if streams and isinstance(streams[-1], int) else _up_width(node, facts)
    H = width // C if isinstance(width, int) and isinstance(C, int) and C > 0 else None
    return [_with_last(streams, H), _with_last(streams, C), streams]


def _pre_mix(node: ir.Node, dims: Dims | None) -> Dims | None:
    C = attr_value(node, "num_branches", 0)
    if not dims:
        return None
    if isinstance(C, int) and C > 0:
        return _with_last(dims, dims[-1] // C if isinstance(dims[-1], int) and dims[-1] % C == 0 else None)
    return (*dims[:-2], dims[-1]) if len(dims) >= 2 else None  # grouped (..., C, H) -> (..., H)


def _unsqueeze(node: ir.Node, dims: Dims | None) -> Dims | None:
    axes = _ints(node.inputs[1]) if len(node.inputs) > 1 else attr_value(node, "axes", None)
    if dims is None or not axes:
        return None
    rank = len(dims) + len(axes)
    if any(not -rank <= a < rank for a in axes):
        return None
    axes = {a % rank for a in axes}
    rest = iter(dims)
    return tuple(1 if i in axes else next(rest) for i in range(rank))


def _transpose(node: ir.Node, dims: Dims | None) -> Dims | None:
    perm = attr_value(node, "perm", None)
    if dims is None:
        return None
    perm = list(perm) if perm is not None else list(range(len(dims)))[::-1]
    return tuple(dims[p] for p in perm) if sorted(perm) == list(range(len(dims))) else None


def _expand(node: ir.Node, dims: Dims | None) -> Dims | None:
    shape = _ints(node.inputs[1]) if len(node.inputs) > 1 else None
    return None if shape is None else _broadcast(dims, tuple(shape))


def _matmul_nbits(node: ir.Node, dims: Dims | None) -> Dims | None:
    N = attr_value(node, "N", None)
    return _with_last(dims, N) if isinstance(N, int) else None


_SAME = {"Identity", "Sigmoid", "Relu", "Neg", "Tanh", "Sqrt", "Reciprocal", "Erf", "Abs", "Exp", "Softmax",
         "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "Gelu"}
_ONE_INPUT = {"Reshape": _reshape, "Tile": _tile, "Unsqueeze": _unsqueeze, "Transpose": _transpose,
              "Expand": _expand}
_CONTRIB_SAME = {_op.BRANCH_NORM, _op.SCALED_SILU, _op.POST_MIX, "SkipSimplifiedLayerNormalization",
                 "SkipLayerNormalization", "SimplifiedLayerNormalization", "FastGelu", "QuickGelu", "BiasGelu"}


def _infer(node: ir.Node, facts: list[Fact]) -> list[Fact]:
    """Output facts of node from its inputs' facts (unknown for ops not listed here)."""
    n = len(node.outputs)
    first = facts[0] if facts else _UNKNOWN
    op, T = node.op_type, first.dtype
    if node.domain == _op.DOMAIN:
        if op in _CONTRIB_SAME:
            return [first] + [_UNKNOWN] * (n - 1)
        if op == _op.PRE_MIX:
            return [Fact(T, _pre_mix(node, first.dims))]
        if op == "MatMulNBits":
            return [Fact(T, _matmul_nbits(node, first.dims))]
        if op == _op.OP_TYPE:
            return [Fact(T, d) for d in _lowrank_mix(node, facts)][:n]
        return [_UNKNOWN] * n
    if node.domain == _op_nbits.DOMAIN and op == _op_nbits.OP_TYPE:
        return [Fact(T, d) for d in _lowrank_mix(node, facts)][:n]
    if node.domain not in ("", "ai.onnx"):
        return [_UNKNOWN] * n
    if op in _SAME:
        return [first] + [_UNKNOWN] * (n - 1)
    if op in ("Div", "Mul", "Add", "Sub") and len(facts) == 2:
        return [Fact(T, _broadcast(first.dims, facts[1].dims))]
    if op == "MatMul" and len(facts) == 2:
        return [Fact(T, _matmul(first.dims, facts[1].dims))]
    if op == "Split":
        return [Fact(T, d) for d in _split(node, first.dims)]
    if op in _ONE_INPUT:
        return [Fact(T, _ONE_INPUT[op](node, first.dims))]
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
