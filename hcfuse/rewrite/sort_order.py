"""The node order the pass works in, and the one it gives back.

onnxruntime sorts a main graph's nodes itself, so a model it runs may list them in any order; the
pass needs producers before consumers (onnx-ir's Graph.clone, which copies the model for the
standard-ONNX trial, refuses a value used before its producer). sort_for_matching sorts every graph
of the model (the main graph, the model-local functions and the subgraphs of both) with onnx-ir's
stable topological sort and remembers the caller's order; CallerOrder.restore then gives that order
back to each graph whose nodes the pass did not change.

The order of the output, graph by graph:
- nothing fused or rewritten there: the caller's order, node for node (sorted or not);
- a block fused there: topologically sorted by onnx-ir's stable sort, which keeps the relative order
  of the (sorted) input wherever the dependencies allow: the nodes around a fused block keep their
  places in a sorted input, and an unsorted input comes out sorted.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir


@dataclasses.dataclass
class CallerOrder:
    """Each graph of a model and its nodes in the caller's order."""

    graphs: list[tuple[ir.Graph, list[ir.Node]]]

    def restore(self) -> None:
        """Puts back the caller's order in every graph that holds the same nodes as before."""
        for graph, nodes in self.graphs:
            now = list(graph)
            if now != nodes and len(now) == len(nodes) and set(now) == set(nodes):
                graph.extend(nodes)  # extending a graph by its own nodes moves them to the end, in this order


def model_graphs(model: ir.Model) -> list[ir.Graph]:
    """The main graph, the model-local functions' graphs and every subgraph (If/Loop bodies) of either."""
    graphs = list(model.graphs())
    for function in model.functions.values():
        graphs += [function.graph, *function.graph.subgraphs()]
    return graphs


def sort_for_matching(model: ir.Model) -> CallerOrder:
    """Sorts every graph of model topologically (in place); returns the caller's order to restore.

    Raises ValueError (one line, naming the graph or function) when a graph has a cycle, or reads a
    value that nothing in it or around it defines: onnxruntime runs neither.
    """
    order = CallerOrder([(graph, list(graph)) for graph in model_graphs(model)])
    check_defined(model)
    targets = [("graph", model.graph), *(("function", f) for f in model.functions.values())]
    for kind, target in targets:
        try:
            target.sort()
        except ValueError as e:
            name = target.name if kind == "graph" else f"{target.domain}::{target.name}"
            raise ValueError(f"hcfuse: the {kind} {name!r} has a cycle: its nodes cannot be ordered ({e})") from None
    return order


def check_defined(model: ir.Model) -> None:
    """Every node input is a graph or function input, an initializer or some node's output (in its own
    graph or an enclosing one). onnx-ir leaves a reference it cannot resolve (a sparse initializer,
    which it does not keep, or a name defined nowhere) as a value without producer."""
    for graph in model_graphs(model):
        for node in graph:
            for value in node.inputs:
                if value is None or value.producer() is not None or value.is_graph_input() or value.is_initializer():
                    continue
                if value.const_value is not None:
                    continue
                raise ValueError(f"hcfuse: node {node.name or node.op_type!r} reads {value.name!r}, which the model "
                                 "defines nowhere onnx-ir can see (onnx-ir drops sparse initializers: pass the "
                                 "ModelProto, whose sparse initializers hcfuse makes dense)")
