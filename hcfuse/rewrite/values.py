"""What the fusion may read from a value at fuse time.

ONNX makes an initializer that is also listed among the graph inputs an overridable default: a caller
may feed another value at run time. Only a Constant node's output or an initializer that is not a
graph input is a true constant; nothing else is ever folded into an attribute or a derived weight.
"""

from __future__ import annotations

import onnx_ir as ir


def true_constant(value: ir.Value | None) -> ir.Tensor | None:
    """The value's tensor when it cannot change at run time, else None (without reading external data)."""
    if value is None or value.is_graph_input():
        return None
    producer = value.producer()
    if producer is not None:
        if producer.op_type != "Constant" or producer.domain not in ("", "ai.onnx"):
            return None
        if any(attr.is_ref() for attr in producer.attributes.values()):
            return None  # a function's Constant whose value comes from the call site
        try:
            return ir.convenience.get_const_tensor(value)
        except Exception:  # noqa: BLE001 - an unusual Constant (sparse, strings): not a usable constant
            return None
    return value.const_value if value.is_initializer() else None


def attr_value(node: ir.Node, name: str, default):
    """The node's attribute value, default when absent, None when it refers to a function attribute."""
    attr = node.attributes.get(name)
    if attr is None:
        return default
    return None if attr.is_ref() else attr.value


def describe(value: ir.Value) -> str:
    """The value as a reason names it: what produces it, and whether a caller may override it."""
    producer = value.producer()
    if producer is not None:
        return f"{producer.op_type} output {value.name!r}"
    if value.is_initializer():
        if value.is_graph_input():
            return f"initializer {value.name!r}, which is also a graph input (an overridable default)"
        return f"initializer {value.name!r}"
    return f"graph input {value.name!r}"
