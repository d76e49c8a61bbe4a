"""Rules that rewrite ONNX Runtime GenAI's standard-ONNX expansions as the contrib ops they stand for.

    BranchwiseRMSNorm(x, w)     <- Mul(Reshape(SimplifiedLayerNormalization(Reshape(x, [.., C, H]), ones(H)),
                                       [.., C*H]), w)
    ScaledSiLU(x, alpha=1/d)    <- Mul(z, Sigmoid(z)), z = Div(x, d)
    HyperConnectionPreMix(hn, g, reduction_scale=1/C)
                                <- ReduceMean(Mul(Reshape(hn, [.., C, H]), Reshape(g, [.., C, H])), [-2], keepdims=0)
    HyperConnectionPostMix(s, out, gate)
                                <- Add(s, Reshape(Mul(Unsqueeze(out, [-2]), Unsqueeze(gate, [-1])), [.., C*H]))

(either operand order of Mul and Add; mobius's forms, hcfuse.rewrite.mobius_rules, in its order). Each
rule rewrites only what its check proves equivalent: true constants (standard_onnx_facts), reshapes that
keep the leading dims, axes and attributes that match, no broadcasting between leading dims (the contrib
ops allow none), no intermediate used elsewhere.
The rules carry a per-call _Recorder: which candidates (keyed by their root node's index in the
original graph) may be rewritten, what was rewritten, and why each other candidate was refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import onnx_ir as ir

from hcfuse import _op
from hcfuse.rewrite._onnxscript_api import (
    MatchResult, RewriteRule, RewriteRuleClassBase, RewriteRuleSet, SimplePatternMatcher,
)
from hcfuse.rewrite.standard_onnx_facts import dims as declared_dims
from hcfuse.rewrite.standard_onnx_facts import (
    FLOAT_TYPES, UnresolvedAttribute, attr, constant_array, int_list, keeps_leading, normalize_axis,
    same_dims,
)
from hcfuse.rewrite.values import describe, outside_use


@dataclasses.dataclass
class Candidate:
    kind: str  # the contrib op the expansion stands for
    group: str  # the expansion's name (its builder-given prefix), used for the report and the new node
    node: ir.Node | None = None  # the contrib node written in its place
    reason: str = ""  # why it was refused, when it was


@dataclasses.dataclass
class _Recorder:
    keys: dict  # root node -> its index in the main graph before any rewrite
    allowed: set | None  # keys that may be rewritten (None: every provable one)
    names: set  # node names in use, so new names stay unique
    dims: Callable[[ir.Value], tuple | None] = declared_dims  # a value's dims (declared, or derived)
    candidates: dict = dataclasses.field(default_factory=dict)  # key -> Candidate
    elsewhere: dict = dataclasses.field(default_factory=dict)  # root -> Candidate, in a function or subgraph
    maybe_dead: list = dataclasses.field(default_factory=list)  # constants the removed nodes read


class _UncheckedRemoval(SimplePatternMatcher):
    """Leaves the removability check to check(), which can say which value has which other consumer;
    refuses a node of another op type at once (most nodes, for every rule: the pass stays cheap)."""

    def match(self, model, graph_or_function, node, *, verbose=0, remove_nodes=True, tracer=None):
        root = self.pattern.output_nodes[0]
        if not (root.op.matches(node.op_type) and root.domain.matches(node.domain)):
            return MatchResult().fail(f"expected a {root.op_type} node; got {node.op_type}")
        return super().match(model, graph_or_function, node, verbose=verbose, remove_nodes=False, tracer=tracer)


NOT_A_CANDIDATE = "the nodes only look like the pattern"  # prove's answer for what is no candidate at all


def _reshape_allows_zero(node: ir.Node) -> bool:
    return attr(node, "allowzero", 0) != 0


def _single_axis(node: ir.Node, axes_value: ir.Value | None, rank: int) -> int | None:
    """The one axis of a ReduceMean/Unsqueeze (input or attribute), normalized for rank, else None."""
    axes = int_list(axes_value) if axes_value is not None else attr(node, "axes", None)
    if axes is None or len(axes) != 1:
        return None
    return normalize_axis(int(axes[0]), rank)


class _ExpansionRule(RewriteRuleClassBase):
    kind = ""

    def __init__(self, recorder: _Recorder, name: str):
        super().__init__(name)
        self._rec = recorder
        self._facts: dict | None = None
        self._key = self._root_name = None

    @classmethod
    def rule(cls, recorder: _Recorder, name: str, **flags) -> RewriteRule:
        instance = cls(recorder, name, **flags)
        return RewriteRule(instance.pattern, instance.rewrite, instance.check, _UncheckedRemoval, name=name)

    def group_name(self, root: ir.Node) -> str:
        return root.name

    def check(self, context, **b) -> MatchResult:
        self._facts = None
        root = context.root
        key = self._rec.keys.get(root)
        if key is None or context.graph_or_function is not context.model.graph:
            reason = "inside a model-local function or a subgraph: expansions are rewritten in the main graph only"
            group = self.group_name(root) or f"<unnamed {root.op_type}>"
            self._rec.elsewhere.setdefault(root, Candidate(self.kind, group, reason=reason))
            return MatchResult().fail(reason)
        if self._rec.allowed is not None and key not in self._rec.allowed:
            return MatchResult().fail("left as it is: its block does not fuse")
        try:
            facts = self.prove(context, b)
        except UnresolvedAttribute as e:
            facts = str(e)
        if facts is NOT_A_CANDIDATE:  # nothing to report
            return MatchResult().fail(facts)
        reason = facts if isinstance(facts, str) else outside_use(context.nodes, context.output_values)
        if reason:
            group = self.group_name(root) or f"<unnamed {root.op_type} node {key}>"
            self._rec.candidates.setdefault(key, Candidate(self.kind, group, reason=reason))
            return MatchResult().fail(reason)
        self._facts, self._key, self._root_name = facts, key, root.name
        return MatchResult()

    def prove(self, context, b: dict) -> dict | str:
        raise NotImplementedError

    def emit(self, op, name: str, *inputs, **attributes) -> ir.Value:
        return getattr(op, self.kind)(*inputs, _domain=_op.DOMAIN, _name=name, **attributes)

    def rewrite(self, op, **b):
        root_name = self._facts.pop("group")
        name = root_name
        while name and name != self._root_name and name in self._rec.names:  # the root's name is free once removed
            name = f"{name}/{self.kind}"
        self._rec.names.add(name)
        self._rec.maybe_dead += [v for v in self._facts.pop("constants") if v is not None]
        out = self.build(op, name, b, self._facts)
        self._rec.candidates[self._key] = Candidate(self.kind, root_name, node=out.producer())
        return out

    def build(self, op, name: str, b: dict, facts: dict) -> ir.Value:
        raise NotImplementedError


def _element_type(*values: ir.Value) -> ir.DataType | str:
    types = {v.dtype for v in values}
    if len(types) != 1 or None in types:
        return "inputs must share one known element type; got " + ", ".join(
            f"{v.name!r} {v.dtype.name if v.dtype else 'unknown'}" for v in values)
    (T,) = types
    return T if T in FLOAT_TYPES else f"element type must be float, float16 or bfloat16; got {T.name}"


def _grouping(reshape_to: ir.Value, x: ir.Value, what: str, dims: Callable):
    """(C, H, leading dims) proved for Reshape(x, reshape_to) = x as (..., C, H), else a reason."""
    x_dims = dims(x)
    if x_dims is None or not x_dims:
        return f"the shape of {what} {x.name!r} is unknown: cannot prove the Reshape keeps its leading dims"
    target = int_list(reshape_to)
    if target is None:
        return f"the Reshape target of {what} ({describe(reshape_to)}) is not a true int64 constant"
    if len(target) != len(x_dims) + 1 or min(target[-2:]) <= 0:
        return f"the Reshape of {what} must split its last dim in two, (..., C, H); got target {target} for {x_dims}"
    C, H = target[-2:]
    if x_dims[-1] != C * H:
        return f"{what} {x.name!r} must be (..., {C * H}) for the Reshape to (..., {C}, {H}); got {x_dims}"
    if not keeps_leading(target[:-2], x_dims[:-1]):
        return f"the Reshape of {what} to {target} does not provably keep the leading dims {x_dims[:-1]}"
    return C, H, x_dims[:-1]


def _flattening(reshape_to: ir.Value, leading: tuple, width: int, what: str) -> str | None:
    """None when Reshape(x, reshape_to) of x (*leading, ..., width in all) gives (*leading, width): the last
    entry width, or -1 (then inferred as width) behind leading dims kept without a -1."""
    target = int_list(reshape_to)
    if target is None:
        return f"the Reshape target of {what} ({describe(reshape_to)}) is not a true int64 constant"
    last_ok = target[-1:] == [width] or (target[-1:] == [-1] and -1 not in target[:-1])
    if len(target) != len(leading) + 1 or not last_ok or not keeps_leading(target[:-1], leading):
        return f"the Reshape of {what} must give (..., {width}) keeping the leading dims {leading}; got target {target}"
    return None


class BranchwiseRMSNormExpansion(_ExpansionRule):
    kind = _op.BRANCH_NORM

    def pattern(self, op, x, grouped_to, ones, flat_to, weight):
        grouped = op.Reshape(x, grouped_to, _allow_other_attributes=True, _outputs=["grouped"])
        normalized = op.SimplifiedLayerNormalization(
            grouped, ones, _allow_other_attributes=True, _outputs=["normalized"])
        flat = op.Reshape(normalized, flat_to, _allow_other_attributes=True, _outputs=["flat"])
        return op.Mul(flat, weight)

    def group_name(self, root: ir.Node) -> str:
        return root.name.rsplit("/", 1)[0] if root.name.endswith("/Scale") else root.name

    def prove(self, context, b):
        dims = self._rec.dims
        grouping = _grouping(b["grouped_to"], b["x"], "the norm input", dims)
        if isinstance(grouping, str):
            return grouping
        C, H, leading = grouping
        reshapes = (b["grouped"].producer(), b["flat"].producer())
        if any(_reshape_allows_zero(n) for n in reshapes):
            return "a Reshape has allowzero=1 (a 0 is then a size, not a copy)"
        sln = b["normalized"].producer()
        if len(sln.inputs) > 2 and sln.inputs[2] is not None:
            return f"SimplifiedLayerNormalization {sln.name!r} has a bias input"
        if normalize_axis(int(attr(sln, "axis", -1)), len(leading) + 2) != len(leading) + 1:
            axis = attr(sln, "axis", -1)
            return f"SimplifiedLayerNormalization {sln.name!r} must normalize the last axis; got axis={axis}"
        if attr(sln, "stash_type", 1) != 1:
            return f"SimplifiedLayerNormalization {sln.name!r} must compute in float (stash_type=1)"
        ones = constant_array(b["ones"])
        if ones is None:
            return (f"the SimplifiedLayerNormalization scale ({describe(b['ones'])}) is not a true constant: "
                    f"cannot prove it is all ones")
        if ones.shape != (H,) or not (ones == 1).all():
            return f"the SimplifiedLayerNormalization scale {b['ones'].name!r} must be ones of shape ({H},)"
        reason = _flattening(b["flat_to"], leading, C * H, "the normalized streams")
        if reason:
            return reason
        if dims(b["weight"]) != (C * H,):
            return f"the norm weight {b['weight'].name!r} must be ({C * H},); got {dims(b['weight'])}"
        T = _element_type(b["x"], b["weight"])
        if isinstance(T, str):
            return T
        return {"group": self.group_name(context.root), "C": C, "epsilon": float(attr(sln, "epsilon", 1e-5)),
                "constants": [b["grouped_to"], b["ones"], b["flat_to"]]}

    def build(self, op, name, b, facts):
        return self.emit(op, name, b["x"], b["weight"], num_branches=facts["C"], epsilon=facts["epsilon"])


class ScaledSiLUExpansion(_ExpansionRule):
    kind = _op.SCALED_SILU

    def pattern(self, op, x, divisor):
        z = op.Div(x, divisor, _outputs=["z"])
        return op.Mul(z, op.Sigmoid(z))

    def prove(self, context, b):
        T = _element_type(b["x"])
        if isinstance(T, str):
            return T
        divisor = constant_array(b["divisor"])
        if divisor is None:
            return f"the Div divisor ({describe(b['divisor'])}) is not a true constant"
        if divisor.shape not in ((), (1,)):
            return f"the Div divisor {b['divisor'].name!r} must be a scalar of shape [] or [1]; got {divisor.shape}"
        x_dims = self._rec.dims(b["x"])
        if divisor.shape == (1,) and not x_dims:
            return f"the rank of {b['x'].name!r} is unknown or 0: a [1] divisor may change the output's shape"
        value = float(divisor.reshape(-1)[0])
        if not math.isfinite(value) or value == 0 or not math.isfinite(1.0 / value):
            return f"the Div divisor {b['divisor'].name!r} is {value}: 1/divisor is no finite alpha"
        return {"group": context.root.name, "alpha": 1.0 / value, "constants": [b["divisor"]]}

    def build(self, op, name, b, facts):
        return self.emit(op, name, b["x"], alpha=facts["alpha"])


class PreMixExpansion(_ExpansionRule):
    kind = _op.PRE_MIX

    def __init__(self, recorder, name, *, axes_input: bool):
        super().__init__(recorder, name)
        self._axes_input = axes_input

    def pattern(self, op, hn, g, hn_to, g_to, axes):
        return self.mean(op, self.products(op, hn, g, hn_to, g_to), axes)

    def products(self, op, hn, g, hn_to, g_to):
        a = op.Reshape(hn, hn_to, _allow_other_attributes=True, _outputs=["a"])
        b = op.Reshape(g, g_to, _allow_other_attributes=True, _outputs=["b"])
        return op.Mul(a, b)

    def mean(self, op, weighted, axes):
        if self._axes_input:
            return op.ReduceMean(weighted, axes, _allow_other_attributes=True, _outputs=["mean"])
        return op.ReduceMean(weighted, _allow_other_attributes=True, _outputs=["mean"])

    def prove(self, context, b):
        dims = self._rec.dims
        if b["a"] is b["b"]:  # Mul(x, x) of one Reshape: a square (mobius's norm), no pre-mix
            return NOT_A_CANDIDATE
        if _is_sigmoid(b["hn"]) and not _is_sigmoid(b["g"]):  # Mul(gate, hn): the gate is the Sigmoid's
            b["hn"], b["g"], b["hn_to"], b["g_to"] = b["g"], b["hn"], b["g_to"], b["hn_to"]
        hn_grouping = _grouping(b["hn_to"], b["hn"], "hn", dims)
        if isinstance(hn_grouping, str):
            return hn_grouping
        g_grouping = _grouping(b["g_to"], b["g"], "the pre-mix gate", dims)
        if isinstance(g_grouping, str):
            return g_grouping
        C, H, leading = hn_grouping
        if g_grouping[:2] != (C, H) or not same_dims(leading, g_grouping[2]):
            return (f"hn {b['hn'].name!r} {dims(b['hn'])} and the gate {b['g'].name!r} {dims(b['g'])} are not "
                    f"provably the same shape (HyperConnectionPreMix does not broadcast)")
        if any(_reshape_allows_zero(v.producer()) for v in (b["a"], b["b"])):
            return "a Reshape has allowzero=1 (a 0 is then a size, not a copy)"
        mean = b["mean"].producer()
        rank = len(leading) + 2
        if _single_axis(mean, b.get("axes") if self._axes_input else None, rank) != rank - 2:
            return f"ReduceMean {mean.name!r} must average the branch axis only (axes=[-2])"
        if attr(mean, "keepdims", 1) != 0:
            return f"ReduceMean {mean.name!r} must drop the branch axis (keepdims=0)"
        T = _element_type(b["hn"], b["g"])
        if isinstance(T, str):
            return T
        constants = [b["hn_to"], b["g_to"], b.get("axes") if self._axes_input else None]
        return {"group": mean.name, "C": C, "constants": constants, "hn": b["hn"], "g": b["g"]}

    def build(self, op, name, b, facts):
        C = facts["C"]
        return self.emit(op, name, facts["hn"], facts["g"], num_branches=C, reduction_scale=1.0 / C)


def _is_sigmoid(value: ir.Value) -> bool:
    producer = value.producer()
    return producer is not None and producer.op_type == "Sigmoid" and producer.domain in ("", "ai.onnx")


class PostMixExpansion(_ExpansionRule):
    kind = _op.POST_MIX

    def pattern(self, op, streams, block_output, gate, output_axes, gate_axes, flat_to):
        out = op.Unsqueeze(block_output, output_axes, _outputs=["u"])
        weight = op.Unsqueeze(gate, gate_axes, _outputs=["v"])
        flat = op.Reshape(op.Mul(out, weight), flat_to, _allow_other_attributes=True, _outputs=["flat"])
        return op.Add(streams, flat)

    def prove(self, context, b):
        dims = self._rec.dims
        out_dims, gate_dims, stream_dims = dims(b["block_output"]), dims(b["gate"]), dims(b["streams"])
        if None in (out_dims, gate_dims, stream_dims) or not out_dims:
            return ("the shapes of the block output, post gate and streams must be known to prove the post-mix "
                    f"does not broadcast; got {out_dims}, {gate_dims}, {stream_dims}")
        leading = out_dims[:-1]
        if not (same_dims(leading, gate_dims[:-1]) and same_dims(leading, stream_dims[:-1])):
            return (f"the block output {out_dims}, post gate {gate_dims} and streams {stream_dims} do not provably "
                    f"share their leading dims (HyperConnectionPostMix does not broadcast)")
        H, C = out_dims[-1], gate_dims[-1]
        if not isinstance(H, int) or not isinstance(C, int) or stream_dims[-1] != C * H:
            return (f"the streams must be (..., C*H) for a block output (..., H) and a post gate (..., C); "
                    f"got {stream_dims}")
        rank = len(leading) + 2
        if _single_axis(b["u"].producer(), b["output_axes"], rank) != rank - 2:
            return f"the block output {b['block_output'].name!r} must be unsqueezed at axis -2"
        if _single_axis(b["v"].producer(), b["gate_axes"], rank) != rank - 1:
            return f"the post gate {b['gate'].name!r} must be unsqueezed at axis -1"
        if _reshape_allows_zero(b["flat"].producer()):
            return "a Reshape has allowzero=1 (a 0 is then a size, not a copy)"
        reason = _flattening(b["flat_to"], leading, C * H, "the weighted block output")
        if reason:
            return reason
        T = _element_type(b["streams"], b["block_output"], b["gate"])
        if isinstance(T, str):
            return T
        return {"group": context.root.name, "C": C,
                "constants": [b["output_axes"], b["gate_axes"], b["flat_to"]]}

    def build(self, op, name, b, facts):
        return self.emit(op, name, b["streams"], b["block_output"], b["gate"], num_branches=facts["C"])


def make_ruleset(recorder: _Recorder) -> RewriteRuleSet:
    """The four expansion rules (both ReduceMean forms), with either operand order of Mul and Add, and
    mobius's forms (hcfuse.rewrite.mobius_rules) in the exporter's operand order (its norm has five Muls
    and Adds: 32 orders to try at every Cast), bound to one call's recorder."""
    from hcfuse.rewrite.mobius_rules import mobius_rules

    rules = [
        BranchwiseRMSNormExpansion.rule(recorder, "StandardOnnxBranchwiseRMSNorm"),
        ScaledSiLUExpansion.rule(recorder, "StandardOnnxScaledSiLU"),
        PreMixExpansion.rule(recorder, "StandardOnnxPreMix", axes_input=True),
        PreMixExpansion.rule(recorder, "StandardOnnxPreMixAxesAttribute", axes_input=False),
        PostMixExpansion.rule(recorder, "StandardOnnxPostMix"),
    ]
    commuted = [variant for rule in rules for variant in rule.commute()]
    return RewriteRuleSet([*commuted, *mobius_rules(recorder)])
