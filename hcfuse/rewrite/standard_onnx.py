"""ORT GenAI's standard-ONNX hyper-connection blocks, made fusable without touching what does not fuse.

ONNX Runtime GenAI's builder can write the block's four contrib ops as standard ONNX (see
standard_onnx_rules and hcfuse/models/genai_expansion.py). canonicalize_standard_onnx rewrites those
expansions as the contrib ops, so the fusion rules then fuse the block into HyperConnectionLowRankMix,
but only the expansions that end up inside a fused node: a rewritten expansion left outside one would
change the model's numerics (the contrib ops round at other points) for no gain.

Which those are is found by trial: the expansions are rewritten on a copy of the model (weights shared,
never read), the fusion (`trial`) runs on the copy, and the expansions whose contrib node it absorbed
are kept; this repeats with the kept set until the trial absorbs all of it (a block that fused only
thanks to a neighbour's expansion is dropped with it). Then the kept set is rewritten on the model
itself, and the real fusion, seeing the same graph as the last trial, fuses the same blocks.

Numerics: the expansion rounds at points the fused op does not (the norm's SimplifiedLayerNormalization
and its Mul by weight+1, the pre-mix products before ReduceMean, the post-mix product before Add); the
gap this leaves between the expansion model and the fused one is measured in tests/fusion/test_standard_onnx.py
and is within hcfuse.checking.verification's bounds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import onnx_ir as ir

from hcfuse import _op
from hcfuse.rewrite.report import Rejection
from hcfuse.rewrite.standard_onnx_rules import Candidate, _Recorder, make_ruleset
from hcfuse.rewrite.values import remove_unused_constants

_TRIAL = "hcfuse.standard_onnx.trial"  # graph meta key: this copy is a trial (nothing to canonicalize)


@dataclasses.dataclass
class StandardOnnxReport:
    """canonicalized: the expansions (by name) rewritten as contrib ops, each one to be fused;
    rejected: the expansions left as they are, with the reason."""

    canonicalized: list[str] = dataclasses.field(default_factory=list)
    rejected: list[Rejection] = dataclasses.field(default_factory=list)


def canonicalize_standard_onnx(
    model: ir.Model, *, trial: Callable[[ir.Model], object], shapes: Callable[[ir.Model], Callable] | None = None
) -> StandardOnnxReport:
    """Rewrites (in place) the standard-ONNX expansions of model that the fusion `trial` absorbs.

    trial(model) fuses a model in place (hcfuse.rewrite.fuse_with_report); when it returns a report
    with .rejected entries (anchor, reason), their reasons explain the expansions that were left.
    Inside a trial (a copy made here) this does nothing, so trial may be the function that calls it.
    shapes(model) gives the function value -> dims (int, symbol name or None each; None when the rank
    is unknown) the rules prove shapes with, for that model; by default the values' declared shapes.
    """
    if model.graph.meta.get(_TRIAL) or not _may_hold_expansions(model):
        return StandardOnnxReport()
    allowed, refused, first = None, {}, None
    while allowed is None or allowed:
        work = model.clone()
        recorder = _rewrite(work, allowed, shapes)
        first = first or recorder
        written = {key: c for key, c in recorder.candidates.items() if c.node is not None}
        if not written:  # nothing to try (refused candidates keep their reasons)
            allowed = set()
            break
        work.graph.meta[_TRIAL] = True
        try:
            result = trial(work)
        except Exception as e:  # noqa: BLE001 - whatever the fusion does with a copy, the model stays as it is
            refused.update({key: f"the trial fusion raised {type(e).__name__}: {e}" for key in written})
            allowed = set()
            break
        left = {key: c for key, c in written.items() if c.node.graph is not None}
        refused.update({key: _why_left(c, result) for key, c in left.items()})
        allowed = set(written) - set(left)
        if not left:
            break
    report = StandardOnnxReport()
    for key, c in sorted(first.candidates.items()):
        reason = c.reason or refused.get(key)
        if reason:
            report.rejected.append(Rejection(f"StandardOnnx{c.kind}", c.group, reason))
    report.rejected += [Rejection(f"StandardOnnx{c.kind}", c.group, c.reason) for c in first.elsewhere.values()]
    if allowed:
        recorder = _rewrite(model, allowed, shapes)
        remove_unused_constants(recorder.maybe_dead)
        report.canonicalized = [c.group for _, c in sorted(recorder.candidates.items()) if c.node is not None]
    return report


_EXPANSION_OPS = {"SimplifiedLayerNormalization", "ReduceMean", "Unsqueeze"}


def _may_hold_expansions(model: ir.Model) -> bool:
    """A quick look (no matching) for the ops only expansions bring: the contrib-op form has none of
    them but a SiLU-shaped Mul(Div(x, d), Sigmoid(Div(x, d)))."""
    graphs = [model.graph, *(f.graph for f in model.functions.values())]
    for node in (n for g in graphs for n in ir.traversal.RecursiveGraphIterator(g)):
        if node.op_type in _EXPANSION_OPS:
            return True
        if node.op_type == "Mul" and len(node.inputs) == 2 and None not in node.inputs:
            producers = {v.producer().op_type if v.producer() else "" for v in node.inputs}
            if producers == {"Div", "Sigmoid"}:
                return True
    return False


def _rewrite(model: ir.Model, allowed: set | None, shapes) -> _Recorder:
    """Applies the expansion rules to model's main graph; allowed: keys that may be rewritten."""
    graph = model.graph
    recorder = _Recorder(keys={node: i for i, node in enumerate(graph)}, allowed=allowed,
                         names={node.name for node in graph if node.name})
    if shapes is not None:
        recorder.dims = shapes(model)
    make_ruleset(recorder).apply_to_model(model)
    if any(c.node is not None for c in recorder.candidates.values()):
        model.opset_imports.setdefault(_op.DOMAIN, 1)
        graph.opset_imports.setdefault(_op.DOMAIN, 1)
    return recorder


def _block_anchor(node: ir.Node, fused: dict[str, str]) -> str | None:
    """The BranchwiseRMSNorm name (the fusion report's anchor) of the block a rewritten expansion
    belongs to: the node itself, the pre-mix's hn producer, the norm upstream of a SiLU (through its
    down MatMul and Split), or for a post-mix the next block's norm, or its fused node (fused: fused
    node name -> anchor)."""
    def is_norm(n):
        return n is not None and n.op_type == _op.BRANCH_NORM and n.domain == _op.DOMAIN

    if node.op_type == _op.POST_MIX:
        users = [user for user, _ in node.outputs[0].uses()]
        return next((user.name for user in users if is_norm(user)),
                    next((fused[user.name] for user in users if user.name in fused), None))
    current = node
    for _ in range(4):
        if is_norm(current):
            return current.name
        if current is None or not current.inputs or current.inputs[0] is None:
            return None
        current = current.inputs[0].producer()
    return None


def _why_left(candidate: Candidate, trial_result) -> str:
    rejected = {r.anchor: r.reason for r in getattr(trial_result, "rejected", None) or ()}
    fused = {b.node: b.anchor for b in getattr(trial_result, "fused", None) or ()}
    anchor = _block_anchor(candidate.node, fused)
    if candidate.kind != _op.POST_MIX:
        what = "its block did not fuse with it" + (f" (block {anchor!r})" if anchor else "")
    elif anchor is None:
        return "no block's norm reads its output: only the next block's fused node can absorb a post-mix"
    else:
        what = f"the next block ({anchor!r}) did not absorb it as its prologue"
    detail = rejected.get(anchor)
    return what + (f": {detail}" if detail else "")
