"""Fusion of the stock hyper-connection chain into com.microsoft.HyperConnectionLowRankMix.

One rule per variant of the block (SPEC.md):

    S    = HyperConnectionPostMix(streams, prev_block_output, prev_post_gate)   (prologue, optional)
    hn   = BranchwiseRMSNorm(S, norm_scale)
    down, inject = MatMul(hn, down_weight), MatMul(hn, inject_weight)
                   or Split(MatMul(hn, packed [C*H, R+C]), [R, C])            (ORT GenAI's packed form)
    d    = ScaledSiLU(down);  g = Sigmoid(MatMul(d, up_weight))
    pre  = HyperConnectionPreMix(hn, g)
    gate = [Mul](Sigmoid([Div](inject, gate_div)), gate_mul)                   (absent in the final mix)

Rules are named after the variant (HcLowRankMix + Packed/Prologue/GateMul/NoInject), most specific
first, so a block whose prologue fails a condition is fused by the rule without prologue (and its
PostMix stays). check() tests one condition per early return and records each failure for the
report; rewrite() emits the fused node, with new initializers written lazily (packed halves, a
flattened norm scale, the zero inject weight of the final mix), so weights are never loaded to fuse.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import _basics
from onnxscript.rewriter import pattern as orp
from onnxscript.rewriter._pattern_ir import AttrVar
from onnxscript.rewriter._rewrite_rule import RewriteRule, RewriteRuleClassBase, RewriteRuleSet

from hcfuse import _op
from hcfuse.rewrite._local_matcher import LocalMatcher

_TYPES = {ir.DataType(t) for t in _op.ELEMENT_TYPES}


@dataclasses.dataclass(frozen=True)
class CheckFailure:
    rule: str
    anchor: str
    reason: str
    prologue_only: bool  # a condition of the prologue alone: the rule without prologue may still fuse


class CheckLog:
    """Failures and fusions recorded by the rules during one pass (read by fuse_with_report)."""

    def __init__(self):
        self.failures: list[CheckFailure] = []
        self.fused: list[tuple[str, str, tuple[str, ...], str]] = []  # rule, node, replaced, anchor
        self.maybe_dead: list[ir.Value] = []  # constants the fused nodes no longer read

    def clear(self):
        self.__init__()


LOG = CheckLog()


@dataclasses.dataclass
class _Match:
    """Facts check() proved for rewrite() (per-match state, kept small)."""

    graph: ir.Graph
    anchor: str
    nodes: tuple[str, ...]
    attrs: dict
    C: int
    H: int
    R: int
    T: ir.DataType
    norm_layout: str  # "flat" | "grouped" (C, H) | "shared" (H)
    streams_out: bool


def _dims(value: ir.Value | None) -> tuple | None:
    if value is None or value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in value.shape.dims)


def _attr(attr: ir.Attr | None, default):
    return default if attr is None else attr.value


def _const_scalar(value: ir.Value | None) -> float | None:
    """The value of a constant of shape [] or [1] (initializer or Constant node), else None."""
    tensor = None if value is None else ir.convenience.get_const_tensor(value)
    if tensor is None or tuple(tensor.shape.dims) not in ((), (1,)):
        return None
    return float(tensor.numpy().reshape(-1)[0])


def _describe(value: ir.Value) -> str:
    producer = value.producer()
    if producer is not None:
        return f"{producer.op_type} output {value.name!r}"
    return f"initializer {value.name!r}" if value.const_value is not None else f"graph input {value.name!r}"


class HcLowRankMixFusion(RewriteRuleClassBase):
    def __init__(self, name: str, *, has_prologue: bool, has_gate_mul: bool, packed: bool, has_inject: bool = True):
        super().__init__(name)
        self._prologue = has_prologue
        self._gate_mul = has_gate_mul
        self._packed = packed
        self._inject = has_inject
        self._m: _Match | None = None

    @classmethod
    def rule(cls, name: str, **flags) -> RewriteRule:
        fusion = cls(name, **flags)
        return RewriteRule(fusion.pattern, fusion.rewrite, fusion.check, LocalMatcher, name=name)

    # -- pattern -------------------------------------------------------------------------------

    def pattern(self, op, streams, prev_block_output, prev_post_gate, norm_scale, down_weight, up_weight,
                inject_weight, packed_weight, split_sizes, gate_div, gate_mul):
        dom = _op.DOMAIN
        s = streams
        if self._prologue:
            s = op.HyperConnectionPostMix(
                streams, prev_block_output, prev_post_gate, _domain=dom, _allow_other_inputs=True,
                _allow_other_attributes=True, num_branches=AttrVar("post_C", can_match_none=True), _outputs=["s"],
            )
        hn = op.BranchwiseRMSNorm(
            s, norm_scale, _domain=dom, _allow_other_attributes=True, _outputs=["hn"],
            num_branches=AttrVar("norm_C", can_match_none=True), epsilon=AttrVar("epsilon", can_match_none=True),
        )
        inject = None
        if self._packed:
            down, inject = op.Split(
                op.MatMul(hn, packed_weight), split_sizes, _allow_other_attributes=True,
                axis=AttrVar("split_axis", can_match_none=True), _outputs=["down", "inject"],
            )
        else:
            down = op.MatMul(hn, down_weight, _outputs=["down"])
            if self._inject:
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
        if not self._inject:
            return (pre, s) if self._prologue else pre
        x = orp.OrValue([op.Div(inject, gate_div), inject], tag_var="has_gate_div", tag_values=[True, False])
        gate = op.Sigmoid(x)
        if self._gate_mul:
            gate = op.Mul(gate, gate_mul)
        return (pre, gate, s) if self._prologue else (pre, gate)

    # -- check ---------------------------------------------------------------------------------

    def check(self, context, **b) -> _basics.MatchResult:
        self._m = None
        anchor = b["hn"].producer().name or "<unnamed BranchwiseRMSNorm>"
        result = self._check(context, anchor, b)
        if isinstance(result, str):
            return self._fail(anchor, result, prologue_only=False)
        if isinstance(result, tuple):
            return self._fail(anchor, result[1], prologue_only=True)
        self._m = result
        return _basics.MatchResult()

    def _fail(self, anchor: str, reason: str, *, prologue_only: bool) -> _basics.MatchResult:
        LOG.failures.append(CheckFailure(self.name, anchor, reason, prologue_only))
        return _basics.MatchResult().fail(reason)

    def _check(self, context, anchor: str, b: dict):
        """A _Match when every condition holds; else the failure reason (a (True, reason) tuple for
        a condition of the prologue alone)."""
        C = _attr(b["norm_C"], None)
        if C is None:
            return "BranchwiseRMSNorm has no num_branches (it would read a flat input as grouped)"
        if _attr(b["pre_C"], None) != C:
            return f"num_branches differs: BranchwiseRMSNorm {C}, HyperConnectionPreMix {_attr(b['pre_C'], None)}"
        if self._prologue and _attr(b["post_C"], None) != C:
            return True, f"num_branches differs: BranchwiseRMSNorm {C}, HyperConnectionPostMix {_attr(b['post_C'], None)}"
        reason = self._check_consumers(context, b)
        if reason:
            return reason
        weights = self._weight_shapes(b, C)
        if isinstance(weights, str):
            return weights
        CH, R, H = weights
        T = self._element_type(b)
        if isinstance(T, str):
            return T
        norm_layout = self._norm_layout(b["norm_scale"], C, H)
        if norm_layout is None:
            return (f"norm scale {b['norm_scale'].name!r} must be ({CH},), or a constant ({C}, {H}) or ({H},); "
                    f"got {_dims(b['norm_scale'])}")
        streams = b["s"] if self._prologue else b["streams"]
        if _dims(streams) and _dims(streams)[-1] not in (None, CH):
            return f"streams {streams.name!r} must be (..., {CH}); got {_dims(streams)}"
        silu_alpha = self._silu_alpha(b)
        if isinstance(silu_alpha, str):
            return silu_alpha
        gates = self._gate_constants(b)
        if isinstance(gates, str):
            return gates
        if self._prologue:
            reason = self._prologue_inputs(b, C, H)
            if reason:
                return True, reason
        attrs = {
            "num_branches": int(C),
            "epsilon": float(_attr(b["epsilon"], _op.BRANCH_NORM_DEFAULT_EPSILON)),
            "reduction_scale": float(_attr(b["reduction_scale"], 1.0)),
            "silu_alpha": silu_alpha,
            **gates,
        }
        matched = set(context.nodes)
        s_used_outside = self._prologue and (
            b["s"].is_graph_output() or any(user not in matched for user, _ in b["s"].uses())
        )
        return _Match(
            graph=context.graph_or_function, anchor=anchor, nodes=tuple(n.name for n in context.nodes),
            attrs=attrs, C=int(C), H=H, R=R, T=T, norm_layout=norm_layout, streams_out=s_used_outside,
        )

    @staticmethod
    def _check_consumers(context, b: dict) -> str | None:
        """No value computed inside the block but pre, gate and S is used outside it."""
        matched = set(context.nodes)
        for user, _ in b["hn"].uses():
            if user not in matched:
                return f"hn {b['hn'].name!r} is also consumed by {user.op_type} {user.name!r}"
        outputs = set(context.output_values)
        for node in context.nodes:
            for value in node.outputs:
                if value in outputs:
                    continue
                if value.is_graph_output():
                    return f"intermediate {value.name!r} is a graph output"
                for user, _ in value.uses():
                    if user not in matched:
                        return f"intermediate {value.name!r} is also consumed by {user.op_type} {user.name!r}"
        return None

    def _weight_shapes(self, b: dict, C: int):
        """(C*H, R, H) proved from the weights' declared shapes, or a reason."""
        if self._packed:
            packed = _dims(b["packed_weight"])
            sizes = ir.convenience.get_const_tensor(b["split_sizes"])
            if sizes is None:
                return f"Split sizes {b['split_sizes'].name!r} are not a constant"
            sizes = [int(v) for v in sizes.numpy().reshape(-1)]
            if len(sizes) != 2 or sizes[1] != C:
                return f"Split sizes must be [R, {C}] (down, inject); got {sizes}"
            if packed is None or len(packed) != 2 or None in packed:
                return f"packed weight {b['packed_weight'].name!r} must be a 2-D weight of known shape; got {packed}"
            CH, R = packed[0], sizes[0]
            if packed[1] != R + C:
                return f"packed weight {b['packed_weight'].name!r} must be ({CH}, {R}+{C}); got {packed}"
            if b["packed_weight"].const_value is None:
                return f"packed weight is the {_describe(b['packed_weight'])}, not an initializer: it cannot be split"
            axis = _attr(b["split_axis"], 0)
            if axis != -1:
                return f"Split must cut the last axis (axis=-1); got axis={axis}"
        else:
            down = _dims(b["down_weight"])
            if down is None or len(down) != 2 or None in down:
                return f"down_weight {b['down_weight'].name!r} must be a 2-D weight of known shape; got {down}"
            CH, R = down
        if CH % C:
            return f"the block's width {CH} (rows of the down weight) is not divisible by num_branches {C}"
        H = CH // C
        up = _dims(b["up_weight"])
        if up != (R, CH):
            return f"up_weight {b['up_weight'].name!r} must be ({R}, {CH}); got {up}"
        if self._inject and not self._packed and _dims(b["inject_weight"]) != (CH, C):
            return f"inject_weight {b['inject_weight'].name!r} must be ({CH}, {C}); got {_dims(b['inject_weight'])}"
        return CH, R, H

    def _element_type(self, b: dict):
        names = ["streams", "norm_scale", "up_weight", "packed_weight" if self._packed else "down_weight"]
        if self._inject and not self._packed:
            names.append("inject_weight")
        if self._prologue:
            names += ["prev_block_output", "prev_post_gate"]
        found = {name: b[name].dtype for name in names if b[name] is not None and b[name].dtype is not None}
        types = set(found.values())
        if len(types) != 1:
            detail = ", ".join(f"{k} {v.name}" for k, v in found.items()) or "none known"
            return f"inputs must share one element type T; got {detail}"
        (T,) = types
        if T not in _TYPES:
            return f"element type must be float, float16 or bfloat16; got {T.name}"
        return T

    @staticmethod
    def _norm_layout(scale: ir.Value, C: int, H: int) -> str | None:
        dims = _dims(scale)
        if dims == (C * H,):
            return "flat"
        if scale.const_value is not None and dims == (C, H):
            return "grouped"
        if scale.const_value is not None and dims == (H,):
            return "shared"
        return None

    @staticmethod
    def _silu_alpha(b: dict):
        node = b["d"].producer()
        alpha = float(_attr(b["silu_alpha"], 1.0))
        if len(node.inputs) < 2 or node.inputs[1] is None:
            return alpha
        scale = node.inputs[1]
        tensor = ir.convenience.get_const_tensor(scale)
        if tensor is None:
            return f"ScaledSiLU {node.name!r} has a non-constant scale input ({_describe(scale)})"
        if tuple(tensor.shape.dims) != ():
            return f"ScaledSiLU {node.name!r}'s scale input must be a 0-d scalar; got shape {tuple(tensor.shape.dims)}"
        return float(tensor.numpy())

    def _gate_constants(self, b: dict):
        gates = {"gate_div": 1.0, "gate_mul": 1.0}
        if not self._inject:
            return gates
        present = [("gate_div", b["has_gate_div"]), ("gate_mul", self._gate_mul)]
        for name, used in present:
            if not used:
                continue
            value = _const_scalar(b[name])
            if value is None:
                return f"{name} ({_describe(b[name])}) must be a constant scalar of shape [] or [1]"
            gates[name] = value
        return gates

    @staticmethod
    def _prologue_inputs(b: dict, C: int, H: int) -> str | None:
        post = b["s"].producer()
        if len(post.inputs) > 3 and post.inputs[3] is not None:
            return f"HyperConnectionPostMix {post.name!r} has a stream_mix input"
        prev_out, gate = _dims(b["prev_block_output"]), _dims(b["prev_post_gate"])
        if prev_out is not None and (not prev_out or prev_out[-1] not in (None, H)):
            return f"prev_block_output {b['prev_block_output'].name!r} must be (..., {H}); got {prev_out}"
        if gate is None:
            return f"the shape of post_mix {b['prev_post_gate'].name!r} is unknown: cannot prove it is (..., {C})"
        if not gate or gate[-1] != C or (prev_out is not None and len(gate) != len(prev_out)):
            return f"post_mix {b['prev_post_gate'].name!r} must be (..., {C}); got {gate}"
        return None

    # -- rewrite -------------------------------------------------------------------------------

    def rewrite(self, op, **b):
        m = self._m
        scale = self._norm_scale(op, m, b["norm_scale"])
        if self._packed:
            down, inject = self._packed_halves(op, m, b["packed_weight"])
            LOG.maybe_dead += [b["packed_weight"], b["split_sizes"]]
        else:
            down = b["down_weight"]
            inject = b["inject_weight"] if self._inject else self._zero_inject(op, m)
        if self._inject:
            LOG.maybe_dead += [b[k] for k in ("gate_div", "gate_mul") if b[k] is not None]
        inputs = [b["streams"], scale, down, b["up_weight"], inject]
        if self._prologue:
            inputs += [b["prev_block_output"], b["prev_post_gate"]]
        prefix = m.anchor.rsplit("/", 1)[0] if "/" in m.anchor else m.anchor
        name = f"{prefix}/{_op.OP_TYPE}"
        outs = op.HyperConnectionLowRankMix(
            *inputs, _domain=_op.DOMAIN, _outputs=3 if m.streams_out else 2, _name=name, **m.attrs
        )
        LOG.fused.append((self.name, name, m.nodes, m.anchor))
        pre, gate = outs[0], outs[1]
        streams_out = outs[2] if m.streams_out else ir.Value()  # S unused elsewhere: a detached value
        if not self._inject:
            return (pre, streams_out) if self._prologue else pre
        return (pre, gate, streams_out) if self._prologue else (pre, gate)

    @staticmethod
    def _derived(op, m: _Match, name: str, shape: tuple, make) -> ir.Value:
        """An initializer computed lazily from others (shared when several blocks need the same one)."""
        existing = m.graph.initializers.get(name)
        if existing is not None:
            return existing
        return op.initializer(ir.LazyTensor(make, dtype=m.T, shape=ir.Shape(shape), name=name), name)

    def _packed_halves(self, op, m: _Match, packed: ir.Value) -> tuple[ir.Value, ir.Value]:
        R, CH = m.R, m.C * m.H
        source = packed.const_value

        def half(columns: slice, name: str):
            def make():
                tensor = source
                if isinstance(source, ir.ExternalTensor):
                    # A mapping of its own per half: parallel writers (model_io.save) evaluate both
                    # halves at once, and releasing a shared mapping under the other one fails.
                    tensor = ir.ExternalTensor(source.location, source.offset, source.length, source.dtype,
                                               shape=source.shape, name=source.name, base_dir=source.base_dir)
                data = np.ascontiguousarray(tensor.numpy()[:, columns])
                if tensor is not source:
                    tensor.release()  # unmap the packed weight: peak memory stays one tensor, not the model
                return ir.tensor(data, name=name)

            return make

        down_name, inject_name = f"{packed.name}.down", f"{packed.name}.inject"
        down = self._derived(op, m, down_name, (CH, R), half(slice(0, R), down_name))
        inject = self._derived(op, m, inject_name, (CH, m.C), half(slice(R, None), inject_name))
        return down, inject

    def _norm_scale(self, op, m: _Match, scale: ir.Value) -> ir.Value:
        if m.norm_layout == "flat":
            return scale
        LOG.maybe_dead.append(scale)
        source, C = scale.const_value, m.C
        name = f"{scale.name}.flat"
        if m.norm_layout == "grouped":
            make = lambda: ir.tensor(np.ascontiguousarray(source.numpy().reshape(-1)), name=name)  # noqa: E731
        else:
            make = lambda: ir.tensor(np.tile(source.numpy(), C), name=name)  # noqa: E731
        return self._derived(op, m, name, (C * m.H,), make)

    def _zero_inject(self, op, m: _Match) -> ir.Value:
        """The final mix has no inject half: pre_output does not depend on the inject weight, so a zero
        weight (post_gate = sigmoid(0)) leaves it unchanged and the unused post_gate is never read."""
        CH, C = m.C * m.H, m.C
        name = f"hcfuse.zero_inject_weight.{CH}x{C}.{m.T.name}"
        np_dtype = m.T.numpy()
        return self._derived(op, m, name, (CH, C), lambda: ir.tensor(np.zeros((CH, C), dtype=np_dtype), name=name))


def _variant_name(*, packed: bool, has_prologue: bool, has_gate_mul: bool, has_inject: bool) -> str:
    parts = ["HcLowRankMix", "Packed" if packed else "", "Prologue" if has_prologue else "",
             "GateMul" if has_gate_mul else "", "" if has_inject else "NoInject"]
    return "".join(parts)


def _make_rules() -> list[RewriteRule]:
    rules = []
    for packed in (True, False):
        for has_prologue in (True, False):
            for has_gate_mul in (True, False):
                flags = dict(packed=packed, has_prologue=has_prologue, has_gate_mul=has_gate_mul, has_inject=True)
                rules.append(HcLowRankMixFusion.rule(_variant_name(**flags), **flags))
    for has_prologue in (True, False):
        flags = dict(packed=False, has_prologue=has_prologue, has_gate_mul=False, has_inject=False)
        rules.append(HcLowRankMixFusion.rule(_variant_name(**flags), **flags))
    return rules


hc_lowrank_mix_rules: list[RewriteRule] = _make_rules()
hc_lowrank_mix_ruleset = RewriteRuleSet(hc_lowrank_mix_rules, commute=True)  # Mul(gate_mul, x) too
