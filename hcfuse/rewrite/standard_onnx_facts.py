"""What the standard-ONNX rules may read from a graph: true constants and provable shapes.

A true constant is a Constant node's value or an initializer that is not also a graph input (ONNX
makes such an initializer only a default that a caller may override). Shapes come from the values'
declared types; a symbolic dim is equal to another only when both carry the same name.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hcfuse import _op
from hcfuse.rewrite.values import true_constant

FLOAT_TYPES = {ir.DataType(t) for t in _op.ELEMENT_TYPES}
Dims = tuple  # of int (static), str (named symbol) or None (unknown)


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """true_constant's data as an array, else None."""
    tensor = true_constant(value)
    return None if tensor is None else tensor.numpy()


def dims(value: ir.Value | None) -> Dims | None:
    """Declared dims of value (None when its rank is unknown)."""
    if value is None or value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else (d.value or None) for d in value.shape.dims)


def same_dims(a: Dims, b: Dims) -> bool:
    """Provably equal: same rank, and every pair the same int or the same named symbol."""
    return len(a) == len(b) and all(x is not None and x == y for x, y in zip(a, b))


def int_list(value: ir.Value | None) -> list[int] | None:
    """A true constant 1-D int64 tensor as a list (Reshape shapes, axes), else None."""
    array = constant_array(value)
    if array is None or array.ndim != 1 or array.dtype != np.int64:
        return None
    return [int(v) for v in array]


def keeps_leading(codes: list[int], leading: Dims) -> bool:
    """Whether Reshape target entries `codes` (in front of a fixed tail whose size equals the input's
    trailing size) reproduce `leading`: each a 0 (copy), the same static size, or one -1 (inferred as
    the only dim not otherwise fixed)."""
    if len(codes) != len(leading) or codes.count(-1) > 1:
        return False
    return all(c == 0 or c == -1 or (c > 0 and c == d) for c, d in zip(codes, leading))


def normalize_axis(axis: int, rank: int) -> int | None:
    return axis + rank if -rank <= axis < 0 else axis if 0 <= axis < rank else None


class UnresolvedAttribute(Exception):
    """An attribute that refers to an enclosing function's (ref_attr_name): its value is unknown here."""


def attr(node: ir.Node, name: str, default):
    """An attribute's value, or default when absent; raises UnresolvedAttribute for a reference."""
    found = node.attributes.get(name)
    if found is None:
        return default
    if found.is_ref():
        raise UnresolvedAttribute(f"{node.op_type} {node.name!r}: attribute {name!r} refers to {found.ref_attr_name!r}")
    return found.value
