"""The node-order mutation, combined with every other: the main graph's nodes listed in a random order.

onnxruntime sorts a main graph itself and runs it in any order (not a function body or an If branch:
those it refuses unsorted), while onnx.checker demands sorted nodes. So a shuffled mutant is checked
through in_checker_order, and the pass must fuse it as it fuses the sorted one: the shuffle is drawn
from its own generator after every other mutation, and the same mutant unshuffled is the same model.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

KIND = "shuffle_order"
SHARE = 0.3  # of the mutants, bases included: each other kind meets it in about 3 of 10 mutants


def shuffle_order(proto: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    """Lists proto's main-graph nodes in a random order (in place); the label, or None when there is
    nothing to reorder (a chain wrapped in a function or an If is one node)."""
    nodes = list(proto.graph.node)
    if len(nodes) < 2:
        return None
    order = rng.permutation(len(nodes))
    del proto.graph.node[:]
    proto.graph.node.extend(nodes[i] for i in order)
    return f"{KIND}:{len(nodes)} nodes"


def in_checker_order(proto: onnx.ModelProto) -> onnx.ModelProto:
    """proto when its main graph is sorted, else a copy sorted as onnxruntime sorts it (onnx-ir's stable
    topological sort, subgraphs' reads of outer values included), for onnx.checker."""
    if is_sorted(proto.graph):
        return proto
    model = ir.from_proto(proto)
    index = {node: i for i, node in enumerate(model.graph)}
    model.graph.sort()
    order = [index[node] for node in model.graph]
    if order == sorted(order):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    del copy.graph.node[:]
    copy.graph.node.extend(proto.graph.node[i] for i in order)
    return copy


def is_sorted(graph: onnx.GraphProto, outer: frozenset = frozenset()) -> bool:
    """Whether every node of graph (and of its subgraphs) reads only names defined before it."""
    seen = set(outer) | {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    for node in graph.node:
        if not seen.issuperset(node.input):
            return False
        for attr in node.attribute:
            for sub in [*([attr.g] if attr.HasField("g") else []), *attr.graphs]:
                if not is_sorted(sub, frozenset(seen)):
                    return False
        seen.update(node.output)
    return True


def node_order(proto: onnx.ModelProto) -> list[tuple]:
    """The main graph's nodes by what identifies them when names may change: op, domain, outputs."""
    return [(node.domain, node.op_type, tuple(node.output)) for node in proto.graph.node]
