"""Walking an onnx.ModelProto: every graph, the subgraphs of If, Loop and Scan included, and every node."""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs in node's attributes (an If's branches, a Loop's or Scan's body)."""
    return [g for attr in node.attribute for g in (*([attr.g] if attr.HasField("g") else []), *attr.graphs)]


def proto_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """graph and every graph nested in its nodes, outer before inner."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from proto_graphs(sub)


def proto_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of the model: its graph's, its functions' and those of every subgraph in them."""
    for graph in proto_graphs(model.graph):
        yield from graph.node
    for function in model.functions:
        for node in function.node:
            yield node
            for sub in subgraphs(node):
                for graph in proto_graphs(sub):
                    yield from graph.node
