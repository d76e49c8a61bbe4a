"""A pattern matcher for multi-output patterns that looks only near the anchor node.

onnxscript's SimplePatternMatcher matches a pattern with K output nodes by trying every combination
of graph nodes of the right op types: O(N^(K-1)) attempts, which for a 96-block chain and the
three-output prologue pattern is ~10^6 attempts. A block's nodes are all connected through its own
intermediate values, so the other output nodes lie within `len(pattern)` hops of the anchor;
candidates come from that neighbourhood only (never crossing a constant or a weight, which many
blocks share), which makes each attempt O(1) and the pass linear in the number of blocks.

Removability (intermediates used outside the pattern) is not checked here: the rule's check() does
it, so a rejected candidate gets a reason that names the value and its outside consumer.
"""

from __future__ import annotations

import itertools

import onnx_ir as ir

from hcfuse.rewrite._onnxscript_api import MatchResult, SimplePatternMatcher


def _crosses(value: ir.Value | None) -> bool:
    """Whether the neighbourhood walk may pass through value: computed, and not by a Constant."""
    if value is None:
        return False
    producer = value.producer()
    return producer is not None and producer.op_type != "Constant"


def neighbourhood(anchor: ir.Node, radius: int) -> list[ir.Node]:
    """Nodes within radius hops of anchor, walking producers and consumers of computed values."""
    seen = {anchor}
    frontier = [anchor]
    for _ in range(radius):
        nxt = []
        for node in frontier:
            for value in (*node.inputs, *node.outputs):
                if not _crosses(value):
                    continue
                for other in (value.producer(), *(user for user, _ in value.uses())):
                    if other not in seen:
                        seen.add(other)
                        nxt.append(other)
        frontier = nxt
    return list(seen)


def _fits(pattern_node, node: ir.Node) -> bool:
    return pattern_node.op.matches(node.op_type) and pattern_node.domain.matches(node.domain)


class _Attempt(SimplePatternMatcher):
    """One match() call's matcher: SimplePatternMatcher keeps the match in progress on itself, so each
    call gets its own (a rule shared by threads never shares a match in progress)."""

    def run(self, model, graph_or_function, node, verbose, tracer):
        self._tracer = tracer
        self._graph = graph_or_function if isinstance(graph_or_function, ir.Graph) else graph_or_function.graph
        output_nodes = self.pattern.output_nodes
        if not _fits(output_nodes[0], node):
            return MatchResult().fail(f"OpType mismatch: expected {output_nodes[0].op_type}, got {node.op_type}.")
        if self.pattern.has_single_output_node:
            self._init_match(verbose)
            return self._match_single_output_node(model, graph_or_function, node, check_removable=False)
        near = neighbourhood(node, len(self.pattern))
        candidates = [[node]] + [
            [n for n in near if _fits(pattern_node, n)] for pattern_node in output_nodes[1:]
        ]
        best = None
        for combination in itertools.product(*candidates):
            self._init_match(verbose)
            match = self._multi_match(combination, check_removable=False)
            if match:
                return match
            if best is None or len(match.nodes) > len(best.nodes):
                best = match
        return best if best is not None else MatchResult().fail("No candidate nodes for the pattern's outputs.")


class LocalMatcher(SimplePatternMatcher):
    def match(self, model, graph_or_function, node, *, verbose=0, remove_nodes=True, tracer=None):
        del remove_nodes  # checked by the rule's check(), which can say why
        return _Attempt(self.pattern).run(model, graph_or_function, node, verbose, tracer)
