"""Fusion of the stock hyper-connection chain into com.microsoft.HyperConnectionLowRankMix.

One rule per variant of the block (docs/NUMERICS.md):

    S    = HyperConnectionPostMix(streams, prev_block_output, prev_post_gate)   (prologue, optional)
    hn   = BranchwiseRMSNorm(S, norm_scale)
    down, inject = MatMul(hn, down_weight), MatMul(hn, inject_weight)
                   or Split(MatMul(hn, packed [C*H, R+C]), [R, C])            (ORT GenAI's packed form)
    d    = ScaledSiLU(down);  g = Sigmoid(MatMul(d, up_weight))
    pre  = HyperConnectionPreMix(hn, g)
    gate = [Mul](Sigmoid([Div](inject, gate_div)), gate_mul)                   (absent in the final mix)

Each MatMul may be a com.microsoft.MatMulNBits (onnxruntime's quantizer writes them); a block with one
becomes ai.hcfuse.HyperConnectionLowRankMixNBits (hcfuse._op_nbits), which takes the quantized weights as
they are (separate down and inject quantized: concatenated along N, losslessly).

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

from hcfuse import _op, _op_nbits
from hcfuse.rewrite import derived_weights, nbits_projection
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

    @staticmethod
    def _projection(op, x, weight, output: str):
        """MatMul(x, weight), or a MatMulNBits whose B binds weight (its other inputs are read by the check)."""
        return orp.OrValue([
            op.MatMul(x, weight, _outputs=[output]),
            op.MatMulNBits(x, weight, _domain=nbits_projection.DOMAIN, _allow_other_inputs=True,
                           _allow_other_attributes=True, _outputs=[output]),
        ])

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
                self._projection(op, hn, packed_weight, "packed_out"), split_sizes, _allow_other_attributes=True,
                axis=AttrVar("split_axis", can_match_none=True), _outputs=["down", "inject"],
            )
        else:
            down = self._projection(op, hn, down_weight, "down")
            if self.variant.has_inject:
                inject = self._projection(op, hn, inject_weight, "inject")
        d = op.ScaledSiLU(
            down, _domain=dom, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["d"],
            alpha=AttrVar("silu_alpha", can_match_none=True),
        )
        g = op.Sigmoid(self._projection(op, d, up_weight, "up_out"))
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
        if m.quantized:
            weights = self._quantized_weights(op, m, session, b)
            op_type, domain, attrs = _op_nbits.OP_TYPE, _op_nbits.DOMAIN, {**m.attrs, **m.nbits_attributes}
        else:
            weights = self._dense_weights(op, m, session, b)
            op_type, domain, attrs = _op.OP_TYPE, _op.DOMAIN, m.attrs
        if v.has_inject:
            session.maybe_dead += [b[k] for k in ("gate_div", "gate_mul") if b[k] is not None]
        inputs = [b["streams"], scale, *weights]
        if v.has_prologue:
            inputs += [b["prev_block_output"], b["prev_post_gate"]]
        while inputs[-1] is None:
            inputs.pop()
        prefix = m.anchor.rsplit("/", 1)[0] if "/" in m.anchor else m.anchor
        name = session.names.fresh(f"{prefix}/{op_type}")
        outputs = [session.names.fresh(f"{name}/{out}") for out in _op.OUTPUTS[: 3 if m.streams_out else 2]]
        outs = getattr(op, op_type)(*inputs, _domain=domain, _outputs=outputs, _name=name, **attrs)
        session.fused.append(Fusion(self.name, name, m.nodes, m.anchor, v.has_prologue))
        pre, gate = outs[0], outs[1]
        streams_out = outs[2] if m.streams_out else ir.Value()  # S unused elsewhere: a detached value
        if not v.has_inject:
            return (pre, streams_out) if v.has_prologue else pre
        return (pre, gate, streams_out) if v.has_prologue else (pre, gate)

    def _dense_weights(self, op, m, session: FusionSession, b: dict) -> list[ir.Value]:
        """The dense op's down, up and inject weights."""
        if self.variant.packed:
            down, inject = derived_weights.packed_halves(op, m.graph, session.weights, b["packed_weight"], m.R, m.C, m.T)
            session.maybe_dead += [b["packed_weight"], b["split_sizes"]]
        else:
            down = b["down_weight"]
            inject = b["inject_weight"] if self.variant.has_inject else derived_weights.zero_inject(
                op, m.graph, session.weights, m.C, m.H, m.T)
        return [down, b["up_weight"], inject]

    def _quantized_weights(self, op, m, session: FusionSession, b: dict) -> list[ir.Value | None]:
        """The quantized op's down_inject (weight, scales, zero points) and up (weight, scales, zero points)."""
        v, q = self.variant, m.quantized
        if v.packed:
            session.maybe_dead.append(b["split_sizes"])
            packed = q.get("packed")
            down_inject = _quantized_tensors(op, m, session, packed) if packed else [b["packed_weight"], None, None]
        elif "down" in q:
            down_inject = _quantized_down_inject(op, m, session, q["down"], q.get("inject"))
        else:
            inject = b["inject_weight"] if v.has_inject else derived_weights.Filled((m.C * m.H, m.C), 0)
            parts = [b["down_weight"], inject]
            session.maybe_dead += [p for p in parts if isinstance(p, ir.Value)]
            weight = derived_weights.concatenated(op, m.graph, session.weights, parts, 1,
                                                  f"{b['down_weight'].name}.down_inject", m.T)
            down_inject = [weight, None, None]
        up = q.get("up")
        return [*down_inject, *(_quantized_tensors(op, m, session, up) if up else [b["up_weight"], None, None])]


def _quantized_tensors(op, m, session: FusionSession, q) -> list[ir.Value | None]:
    """A projection's (B, scales, zero points) as the fused op takes them: flat scales and zero points (older
    quantizers' and Olive's form) as [N, columns] derived weights of the same bytes."""
    matrices = [nbits_projection.as_matrix(op, m.graph, session.weights, value, q.N)
                for value in (q.scales, q.zero_points)]
    session.maybe_dead += [old for old, new in zip((q.scales, q.zero_points), matrices) if new is not old]
    return [q.B, *matrices]


def _quantized_down_inject(op, m, session: FusionSession, down, inject) -> list[ir.Value | None]:
    """Separate down and inject MatMulNBits as one (B, scales, zero points), concatenated along N; the final
    mix's missing inject as C rows of scale 0 (weights of exactly 0, as the dense op's zero inject)."""
    C, kb = m.C, down.k_blocks
    blob = _op_nbits.blob_size(down.bits, down.block_size)
    if inject is None:
        inject_parts = [derived_weights.Filled((C, kb, blob), 0), derived_weights.Filled((C, kb), 0), None]
    else:
        inject_parts = [inject.B, inject.scales, inject.zero_points]
    tensors = []
    for role, (a, b) in zip(("B", "scales", "zero_points"), zip([down.B, down.scales, down.zero_points], inject_parts)):
        if a is None and b is None:
            tensors.append(None)
            continue
        if role == "zero_points":  # one projection without zero points: its defaults in the other's form
            given = a if a is not None else b
            a = a if a is not None else _default_zero_points(given, down, down.N)
            b = b if b is not None else _default_zero_points(given, down, C)
        source = a if isinstance(a, ir.Value) else b
        session.maybe_dead += [x for x in (a, b) if isinstance(x, ir.Value)]
        # scales and zero points row by row ([N, columns], also when given flat: the same bytes)
        columns = None if role == "B" else _row_columns(role, source, down)
        tensors.append(derived_weights.concatenated(op, m.graph, session.weights, [a, b], 0,
                                                    f"{source.name}.down_inject", source.dtype, columns=columns))
    return tensors


def _row_columns(role: str, tensor: ir.Value, q) -> int:
    """Columns of one row of q's scales or zero points ([N, columns]): k_blocks, or the packed bytes of a
    uint8 zero point row."""
    if role == "zero_points" and tensor.dtype == ir.DataType.UINT8:
        return _op_nbits.packed_zero_point_cols(q.k_blocks, q.bits)
    return q.k_blocks


def _default_zero_points(other: ir.Value, q, rows: int) -> derived_weights.Filled:
    """rows of zero points 2^(bits-1) (what an absent input stands for), in the form of other."""
    zp = _op_nbits.default_zero_point(q.bits)
    fill = zp | zp << 4 if q.bits == 4 and other.dtype == ir.DataType.UINT8 else zp
    return derived_weights.Filled((rows, _row_columns("zero_points", other, q)), fill)


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
