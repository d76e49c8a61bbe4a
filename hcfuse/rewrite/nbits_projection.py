"""A com.microsoft.MatMulNBits standing where the stock chain has a MatMul: what the fusion may take from it.

The quantized fused op (hcfuse._op_nbits) reads a projection's B, scales and zero points exactly as
MatMulNBits does, bytes unchanged, so a MatMulNBits is accepted when the op can honour everything it
says: no g_idx, no bias, B not prepacked, bits 4 or 8, a power-of-two block_size >= 16, K and N that its
tensors' shapes agree with, and B, scales and zero points that are true constants (hcfuse.rewrite.values)
of the types MatMulNBits defines. `read` returns the projection or the reason it cannot be taken.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from hcfuse import _op_nbits
from hcfuse.rewrite import derived_weights
from hcfuse.rewrite.shape_facts import ShapeFacts
from hcfuse.rewrite.values import attr_value, describe, true_constant

OP_TYPE = "MatMulNBits"
DOMAIN = "com.microsoft"
_B, _SCALES, _ZERO_POINTS, _G_IDX, _BIAS = 1, 2, 3, 4, 5


@dataclasses.dataclass(frozen=True)
class QuantizedProjection:
    """One MatMulNBits' weight: B [N, k_blocks, blob], scales [N, k_blocks], zero points (None, packed uint8 or
    T) and the attributes that describe them."""

    node: str
    B: ir.Value
    scales: ir.Value
    zero_points: ir.Value | None
    K: int
    N: int
    bits: int
    block_size: int
    accuracy_level: int

    @property
    def k_blocks(self) -> int:
        return _op_nbits.k_blocks(self.K, self.block_size)

    @property
    def packed_zero_points(self) -> bool:
        return self.zero_points is not None and self.zero_points.dtype == ir.DataType.UINT8

    def nbits_attributes(self) -> tuple[int, int, int]:
        return self.bits, self.block_size, self.accuracy_level


def as_matrix(op, graph, weights, value: ir.Value | None, rows: int) -> ir.Value | None:
    """value (scales or zero points, [rows, columns] or flat [rows * columns]) as the fused op's [rows, columns]:
    itself, or a derived weight holding the same bytes."""
    if value is None or len(value.shape) == 2:
        return value
    return derived_weights.reshaped(op, graph, weights, value, (rows, value.shape[0] // rows))


def is_nbits(node: ir.Node | None) -> bool:
    return node is not None and node.op_type == OP_TYPE and node.domain == DOMAIN


def _int_attr(node: ir.Node, name: str, default):
    value = attr_value(node, name, default)
    if value is None:
        raise _Problem(f"attribute {name} refers to a function attribute: its value is only known at the call site")
    if not isinstance(value, int):
        raise _Problem(f"attribute {name} must be an integer; got {value!r}")
    return value


class _Problem(Exception):
    pass


def read(node: ir.Node, facts: ShapeFacts) -> QuantizedProjection | str:
    """The projection node quantizes, or why the fused op cannot take it (a sentence naming the node)."""
    try:
        return _read(node, facts)
    except _Problem as problem:
        return f"MatMulNBits {node.name!r}: {problem}"


def _read(node: ir.Node, facts: ShapeFacts) -> QuantizedProjection:
    inputs = list(node.inputs) + [None] * (6 - len(node.inputs))
    if inputs[_G_IDX] is not None:
        raise _Problem(f"has a g_idx input ({inputs[_G_IDX].name!r}): a reordered quantization the fused op "
                       "does not read")
    if inputs[_BIAS] is not None:
        raise _Problem(f"has a bias input ({inputs[_BIAS].name!r}), which the chain's MatMul does not have")
    if _int_attr(node, "weight_prepacked", 0):
        raise _Problem("has weight_prepacked set: its B is in an execution provider's layout, not MatMulNBits' own")
    bits, block_size = _int_attr(node, "bits", 4), _int_attr(node, "block_size", None)
    K, N = _int_attr(node, "K", None), _int_attr(node, "N", None)
    accuracy_level = _int_attr(node, "accuracy_level", 0)
    for name, value in (("block_size", block_size), ("K", K), ("N", N)):
        if value is None:
            raise _Problem(f"has no {name} attribute (it is required)")
    for problem in (_op_nbits.bits_problem(bits), _op_nbits.block_size_problem(block_size)):
        if problem:
            raise _Problem(problem)
    B, scales, zero_points = inputs[_B], inputs[_SCALES], inputs[_ZERO_POINTS]
    if scales is None:
        raise _Problem("has no scales input")
    k_blocks, blob = _op_nbits.k_blocks(K, block_size), _op_nbits.blob_size(bits, block_size)
    _expect(facts, B, "B", (N, k_blocks, blob), {ir.DataType.UINT8}, K, N)
    _expect(facts, scales, "scales", (N, k_blocks), None, K, N, flat_allowed=True)
    T = facts.dtype(scales)
    if zero_points is not None:
        packed = (N, _op_nbits.packed_zero_point_cols(k_blocks, bits))
        if facts.dtype(zero_points) == ir.DataType.UINT8:
            _expect(facts, zero_points, "zero_points", packed, {ir.DataType.UINT8}, K, N, flat_allowed=True)
        else:
            _expect(facts, zero_points, "zero_points", (N, k_blocks), {T}, K, N, flat_allowed=True)
    for role, value in (("B", B), ("scales", scales), ("zero_points", zero_points)):
        if value is not None and true_constant(value) is None:
            raise _Problem(f"its {role} ({describe(value)}) is not a constant initializer")
    return QuantizedProjection(node.name, B, scales, zero_points, K, N, bits, block_size, accuracy_level)


def _expect(facts: ShapeFacts, value: ir.Value, role: str, dims: tuple, types, K: int, N: int,
            flat_allowed: bool = False) -> None:
    """value's shape is dims (or, where flat_allowed, dims flattened: older quantizers and Olive's write scales
    and zero points as [N * columns], the same bytes row by row) and its type one of types."""
    found, dtype = facts.dims(value), facts.dtype(value)
    if found != dims and not (flat_allowed and found == (dims[0] * dims[1],)):
        raise _Problem(f"{role} {value.name!r} must be {list(dims)} for K={K}, N={N}; got "
                       f"{list(found) if found is not None else 'an unknown shape'}")
    if types is not None and dtype not in types:
        allowed = " or ".join(t.name for t in types if t is not None) or "the scales' type"
        raise _Problem(f"{role} {value.name!r} must be {allowed}; got {dtype.name if dtype else 'an unknown type'}")
