"""Running the fusion rules on a model and reporting what they did."""

from __future__ import annotations

import collections
import sys

import onnx_ir as ir

from hcfuse import _op
from hcfuse._library import kernel_source_metadata
from hcfuse.rewrite._onnxscript_api import MatchingTracer, rule_matcher
from hcfuse.rewrite.derived_weights import NameScope
from hcfuse.rewrite.hc_lowrank_mix import hc_lowrank_mix_rules, make_ruleset
from hcfuse.rewrite.report import FusedBlock, FusionReport, Rejection
from hcfuse.rewrite.session import CheckFailure, FusionSession
from hcfuse.rewrite.shape_facts import ShapeFacts
from hcfuse.rewrite.sort_order import sort_for_matching
from hcfuse.rewrite.standard_onnx import canonicalize_standard_onnx
from hcfuse.rewrite.values import remove_unused_constants


def fuse_with_report(model: ir.Model, debug: bool = False) -> FusionReport:
    """Fuses every matching block of model in place; returns what was fused and what was left, and why.

    Registers the op's schema and the com.microsoft opset import; removes the constants and packed
    weights the fused nodes no longer read. Matches on topologically sorted graphs; a graph where
    something fused comes out sorted, any other keeps the caller's node order (sort_order).
    """
    from hcfuse.shapes.schema import register_schema

    register_schema()
    caller_order = sort_for_matching(model)
    # ORT GenAI's standard-ONNX expansions as contrib ops, only where the fusion below absorbs them
    standard = canonicalize_standard_onnx(model, trial=fuse_with_report, shapes=lambda m: ShapeFacts().dims)
    _name_anchors(model)
    session = FusionSession(model)
    count = make_ruleset(session).apply_to_model(model)
    report = FusionReport(fused=[FusedBlock(f.rule, f.node, f.replaced, f.anchor, f.prologue) for f in session.fused])
    remove_unused_constants(session.maybe_dead)
    if count:
        for graph in _all_graphs(model):
            graph.sort()
        model.opset_imports.setdefault(_op.DOMAIN, _op.SINCE_VERSION)
        model.graph.opset_imports.setdefault(_op.DOMAIN, _op.SINCE_VERSION)
        model.metadata_props.update(kernel_source_metadata())  # a run without the library then says what to do
    report.rejected = _rejections(model, session.failures, {block.anchor: block.rule for block in report.fused})
    report.rejected += standard.rejected
    if debug and not count:
        tracer = MatchingTracer()
        make_ruleset(FusionSession(model)).apply_to_model(model, tracer=tracer)
        tracer.report()
        for item in report.rejected:
            print(f"hcfuse: {item.anchor}: {item.reason}", file=sys.stderr)
    caller_order.restore()
    return report


def _name_anchors(model: ir.Model) -> None:
    """A name of its own (in the whole model, subgraphs and functions included) for each candidate's
    BranchwiseRMSNorm that has none or shares one: the report and the fused node's name go by it."""
    names = NameScope(model)
    seen: set[str] = set()
    for graph in _all_graphs(model):
        for node in graph:
            if node.op_type == _op.BRANCH_NORM and node.domain == _op.DOMAIN:
                if not node.name or node.name in seen:
                    node.name = names.fresh(node.name or _op.BRANCH_NORM)
                seen.add(node.name)


def _all_graphs(model: ir.Model) -> list[ir.Graph | ir.Function]:
    """The main graph, the model-local functions and every subgraph (If/Loop bodies) of either."""
    graphs: list[ir.Graph | ir.Function] = list(model.graphs())
    for function in model.functions.values():
        graphs += [function, *function.subgraphs()]
    return graphs


def fuse_hc_lowrank_mix(model: ir.Model, debug: bool = False) -> int:
    """Fuses every matching block of model in place; returns the number of fused blocks."""
    return len(fuse_with_report(model, debug=debug).fused)


_PARTS = {"Prologue": "prologue", "GateMul": "gate Mul"}  # rule-name tag -> the part it fuses


def _rejections(model: ir.Model, failures: list[CheckFailure], fused: dict[str, str]) -> list[Rejection]:
    """One entry per candidate BranchwiseRMSNorm left unfused (with the reason of the most specific
    rule that reached its conditions), and per block fused without the prologue it has."""
    by_anchor: dict[str, list[CheckFailure]] = collections.defaultdict(list)
    for failure in failures:
        by_anchor[failure.anchor].append(failure)
    out = []
    for anchor, items in by_anchor.items():
        if anchor in fused:
            # more specific rules failed, a less specific one fused: say which parts stay unfused, and why
            parts = [(words, _part_failure(tag, items)) for tag, words in _PARTS.items() if tag not in fused[anchor]]
            parts = [(words, f) for words, f in parts if f is not None]
            if parts:
                text = "; ".join(f"{words} not fused: {f.reason}" for words, f in parts)
                out.append(Rejection(parts[0][1].rule, anchor, text))
            continue
        blocking = [f for f in items if not f.prologue_only] or items
        out.append(Rejection(blocking[0].rule, anchor, blocking[0].reason))
    for where in _all_graphs(model):
        for node in where:
            if node.op_type == _op.BRANCH_NORM and node.domain == _op.DOMAIN and node.name not in by_anchor:
                out.append(Rejection("", node.name, _structural_reason(model, where, node)))
    return out


def _part_failure(tag: str, items: list[CheckFailure]) -> CheckFailure | None:
    """The failure that kept the part named by tag out of the fused node."""
    candidates = [f for f in items if tag in f.rule]
    if tag == "Prologue":  # a prologue-only condition, else the Prologue rule that needs no gate Mul
        candidates.sort(key=lambda f: (not f.prologue_only, "GateMul" in f.rule))
    else:
        candidates.sort(key=lambda f: f.prologue_only)
    return candidates[0] if candidates else None


def _structural_reason(model: ir.Model, where: ir.Graph | ir.Function, norm: ir.Node) -> str:
    """Why no rule's pattern fits the nodes around an unfused BranchwiseRMSNorm (its nearest miss)."""
    pre_mixes = [user for user, _ in norm.outputs[0].uses() if user.op_type == _op.PRE_MIX]
    if not pre_mixes:
        return f"its output is not consumed by a {_op.PRE_MIX}: not a hyper-connection block"
    best = None
    for rule in hc_lowrank_mix_rules:
        match = rule_matcher(rule).match(model, where, pre_mixes[0])
        if not match and (best is None or len(match.nodes) > len(best.nodes)):
            best = match
    if best is None:
        return "the block matches a rule's pattern but was not fused (internal error)"
    where = list(dict.fromkeys(x.name for x in best.failure_nodes_and_values if getattr(x, "name", None)))
    detail = f" (at {', '.join(map(repr, where))})" if where else ""
    return f"the nodes around it differ from the stock block: {best.reason}{detail}"
