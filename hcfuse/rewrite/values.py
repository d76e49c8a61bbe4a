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


def outside_use(nodes, outputs) -> str | None:
    """Why matched nodes cannot all be replaced: a value they compute, other than the match's outputs,
    that is a graph output or read by another node; else None."""
    matched, outputs = set(nodes), set(outputs)
    for node in nodes:
        for value in node.outputs:
            if value in outputs:
                continue
            if value.is_graph_output():
                return f"intermediate {value.name!r} is a graph output"
            for user, _ in value.uses():
                if user not in matched:
                    return f"intermediate {value.name!r} is also consumed by {user.op_type} {user.name!r}"
    return None


def remove_unused_constants(values: list[ir.Value]) -> None:
    """Removes the constants (Constant nodes or initializers) among values that nothing reads any more."""
    for value in dict.fromkeys(values):
        if value.uses() or value.is_graph_output() or value.is_graph_input():
            continue
        producer = value.producer()
        if producer is not None:
            if producer.op_type == "Constant" and producer.graph is not None:
                producer.graph.remove(producer, safe=True)
        elif value.is_initializer() and value.graph is not None:
            del value.graph.initializers[value.name]
