"""Fusion of the stock hyper-connection chain into com.microsoft.HyperConnectionLowRankMix.

One rule per variant of the block (docs/NUMERICS.md):

    S    = HyperConnectionPostMix(streams, prev_block_output, prev_post_gate)   (prologue, optional)
    hn   = BranchwiseRMSNorm(S, norm_scale)
    down, inject = MatMul(hn, down_weight), MatMul(hn, inject_weight)
                   or Split(MatMul(hn, packed [C*H, R+C]), [R, C])            (ORT GenAI's packed form)
    d    = ScaledSiLU(down);  g = Sigmoid(MatMul(d, up_weight))
    pre  = HyperConnectionPreMix(hn, g)
    gate = [Mul](Sigmoid([Div](inject, gate_div)), gate_mul)                   (absent in the final mix)

Rules are named after the variant (HcLowRankMix + Packed/Prologue/GateMul/NoInject), most specific
first, so a block whose prologue fails a condition is fused by the rule without prologue (and its
PostMix stays). The conditions live in block_check, the derived weights in derived_weights.

The rules keep no state between calls: what one call records (failures, fusions, shape facts, names
in use) lives in a FusionSession handed to the rules built for that call (make_rules(session)). The
exported hc_lowrank_mix_rules have none and make one per match, so they can be used directly in
onnxscript.rewriter.rewrite(model, pattern_rewrite_rules=hc_lowrank_mix_rules), from several threads.
"""

from __future__ import annotations

import threading

import onnx_ir as ir
from onnxscript.rewriter import pattern as orp

from hcfuse import _op
from hcfuse.rewrite import derived_weights
from hcfuse.rewrite._local_matcher import LocalMatcher
from hcfuse.rewrite._onnxscript_api import (
    AttrVar, MatchFailureError, MatchResult, RewriteRule, RewriteRuleClassBase, RewriteRuleSet,
)
from hcfuse.rewrite.block_check import BlockCheck, Reject, Variant
from hcfuse.rewrite.session import CheckFailure, Fusion, FusionSession


class HcLowRankMixFusion(RewriteRuleClassBase):
    def __init__(self, name: str, *, has_prologue: bool, has_gate_mul: bool, packed: bool, has_inject: bool = True,
                 session: FusionSession | None = None):
        super().__init__(name)
        self.variant = Variant(has_prologue=has_prologue, has_gate_mul=has_gate_mul, packed=packed,
                               has_inject=has_inject)
        self._session = session
        # check() hands its proof to the rewrite() that follows it in the same thread
        self._handoff = threading.local()

    @classmethod
    def rule(cls, name: str, **flags) -> RewriteRule:
        fusion = cls(name, **flags)
        return RewriteRule(fusion.pattern, fusion.rewrite, fusion.check, LocalMatcher, name=name)

    # -- pattern -------------------------------------------------------------------------------

    def pattern(self, op, streams, prev_block_output, prev_post_gate, norm_scale, down_weight, up_weight,
                inject_weight, packed_weight, split_sizes, gate_div, gate_mul):
        dom = _op.DOMAIN
        s = streams
        if self.variant.has_prologue:
            s = op.HyperConnectionPostMix(
                streams, prev_block_output, prev_post_gate, _domain=dom, _allow_other_inputs=True,
                _allow_other_attributes=True, num_branches=AttrVar("post_C", can_match_none=True), _outputs=["s"],
            )
        hn = op.BranchwiseRMSNorm(
            s, norm_scale, _domain=dom, _allow_other_attributes=True, _outputs=["hn"],
            num_branches=AttrVar("norm_C", can_match_none=True), epsilon=AttrVar("epsilon", can_match_none=True),
        )
        inject = None
        if self.variant.packed:
            down, inject = op.Split(
                op.MatMul(hn, packed_weight), split_sizes, _allow_other_attributes=True,
                axis=AttrVar("split_axis", can_match_none=True), _outputs=["down", "inject"],
            )
        else:
            down = op.MatMul(hn, down_weight, _outputs=["down"])
            if self.variant.has_inject:
                inject = op.MatMul(hn, inject_weight, _outputs=["inject"])
        d = op.ScaledSiLU(
            down, _domain=dom, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["d"],
            alpha=AttrVar("silu_alpha", can_match_none=True),
        )
        g = op.Sigmoid(op.MatMul(d, up_weight))
        pre = op.HyperConnectionPreMix(
            hn, g, _domain=dom, _allow_other_attributes=True, _outputs=["pre"],
            num_branches=AttrVar("pre_C", can_match_none=True),
            reduction_scale=AttrVar("reduction_scale", can_match_none=True),
        )
        if not self.variant.has_inject:
            return (pre, s) if self.variant.has_prologue else pre
        x = orp.OrValue([op.Div(inject, gate_div), inject], tag_var="has_gate_div", tag_values=[True, False])
        gate = op.Sigmoid(x)
        if self.variant.has_gate_mul:
            gate = op.Mul(gate, gate_mul)
        return (pre, gate, s) if self.variant.has_prologue else (pre, gate)

    # -- check ---------------------------------------------------------------------------------

    def check(self, context, **b) -> MatchResult:
        session = self._session or FusionSession(context.model)
        self._handoff.proof = None
        anchor = b["hn"].producer().name or "<unnamed BranchwiseRMSNorm>"
        try:
            proof = BlockCheck(self.variant, context, b, session.facts).prove()
        except Reject as failure:
            session.failures.append(CheckFailure(self.name, anchor, failure.reason, failure.prologue_only))
            return MatchResult().fail(failure.reason)
        except Exception as error:  # noqa: BLE001 - optimize never raises on a model ORT runs
            reason = f"internal error while checking the block: {type(error).__name__}: {error}"
            session.failures.append(CheckFailure(self.name, anchor, reason, False))
            return MatchResult().fail(reason)
        self._handoff.proof = (proof, session)
        return MatchResult()

    # -- rewrite -------------------------------------------------------------------------------

    def rewrite(self, op, **b):
        m, session = self._handoff.proof
        self._handoff.proof = None
        try:
            return self._fused_node(op, m, session, b)
        except Exception as error:  # noqa: BLE001 - the block stays as it is, with the reason in the report
            reason = f"internal error while rewriting the block: {type(error).__name__}: {error}"
            session.failures.append(CheckFailure(self.name, m.anchor, reason, False))
            raise MatchFailureError(reason) from error

    def _fused_node(self, op, m, session: FusionSession, b: dict):
        v = self.variant
        scale = b["norm_scale"]
        if m.norm_layout != "flat":
            session.maybe_dead.append(scale)
            scale = derived_weights.flat_norm_scale(op, m.graph, session.weights, scale, m.norm_layout, m.C, m.H)
        if v.packed:
            down, inject = derived_weights.packed_halves(op, m.graph, session.weights, b["packed_weight"], m.R, m.C, m.T)
            session.maybe_dead += [b["packed_weight"], b["split_sizes"]]
        else:
            down = b["down_weight"]
            inject = b["inject_weight"] if v.has_inject else derived_weights.zero_inject(
                op, m.graph, session.weights, m.C, m.H, m.T)
        if v.has_inject:
            session.maybe_dead += [b[k] for k in ("gate_div", "gate_mul") if b[k] is not None]
        inputs = [b["streams"], scale, down, b["up_weight"], inject]
        if v.has_prologue:
            inputs += [b["prev_block_output"], b["prev_post_gate"]]
        prefix = m.anchor.rsplit("/", 1)[0] if "/" in m.anchor else m.anchor
        name = session.names.fresh(f"{prefix}/{_op.OP_TYPE}")
        outputs = [session.names.fresh(f"{name}/{out}") for out in _op.OUTPUTS[: 3 if m.streams_out else 2]]
        outs = op.HyperConnectionLowRankMix(*inputs, _domain=_op.DOMAIN, _outputs=outputs, _name=name, **m.attrs)
        session.fused.append(Fusion(self.name, name, m.nodes, m.anchor, v.has_prologue))
        pre, gate = outs[0], outs[1]
        streams_out = outs[2] if m.streams_out else ir.Value()  # S unused elsewhere: a detached value
        if not v.has_inject:
            return (pre, streams_out) if v.has_prologue else pre
        return (pre, gate, streams_out) if v.has_prologue else (pre, gate)


def _variant_name(*, packed: bool, has_prologue: bool, has_gate_mul: bool, has_inject: bool) -> str:
    parts = ["HcLowRankMix", "Packed" if packed else "", "Prologue" if has_prologue else "",
             "GateMul" if has_gate_mul else "", "" if has_inject else "NoInject"]
    return "".join(parts)


def make_rules(session: FusionSession | None = None) -> list[RewriteRule]:
    """The rules, most specific first, recording into session (None: a session per match)."""
    rules = []
    variants = [dict(packed=p, has_prologue=pro, has_gate_mul=mul, has_inject=True)
                for p in (True, False) for pro in (True, False) for mul in (True, False)]
    variants += [dict(packed=False, has_prologue=pro, has_gate_mul=False, has_inject=False) for pro in (True, False)]
    for flags in variants:
        rules.append(HcLowRankMixFusion.rule(_variant_name(**flags), session=session, **flags))
    return rules


def make_ruleset(session: FusionSession | None = None) -> RewriteRuleSet:
    return RewriteRuleSet(make_rules(session), commute=True)  # Mul(gate_mul, x) too


# Stateless (a session per match): usable directly in onnxscript.rewriter.rewrite, in any thread.
hc_lowrank_mix_ruleset = make_ruleset()
hc_lowrank_mix_rules: list[RewriteRule] = list(hc_lowrank_mix_ruleset.rules)
