"""Rules that rewrite the block as onnxruntime's `mobius` exporter writes it (hcfuse/models/mobius_block.py)
as the contrib ops it stands for; they join the standard-ONNX rules, so the same trial keeps only what a
fused node absorbs (hcfuse.rewrite.standard_onnx).

    BranchwiseRMSNorm(x, scale, num_branches=C, epsilon=eps)
        <- Cast(Reshape(Mul(Mul(g, Reciprocal(Sqrt(Add(ReduceMean(Mul(g, g), [-1], keepdims=1), eps)))),
                            Reshape(Add(Cast(w, FLOAT), one), [C, H])), Shape(x)), to=T),
           g = Reshape(Cast(x, FLOAT), [.., C, H])   (float32: no Cast)
       scale = Cast(Add(Cast(w, FLOAT), one), to=T)  (float32: Add(w, one)), left in the graph as nodes of
       constants (onnxruntime folds them when the session starts); the weight is never read here
    ScaledSiLU(x, alpha=1/d)    <- Swish(Div(x, d))  (alpha 1)
    HyperConnectionPreMix(hn, g, reduction_scale=1/C)
                                <- Cast(ReduceMean(Cast(Mul(Reshape(g, [.., C, H]), Reshape(hn, [.., C, H])),
                                        FLOAT), [-2], keepdims=0), to=T)   (float32: no Cast; the mean
                                   in T is standard_onnx_rules' PreMixExpansion)
    HyperConnectionPostMix      <- standard_onnx_rules' PostMixExpansion (a Reshape by [0, 0, -1] included)

Numerics (the gap to the fused op; tests/fusion/test_mobius.py states what it measures: within
hcfuse.checking.verification's bounds, e.g. float16 4.3-5 ulp at the full size, 9-11 ulp over 96 blocks):
- the norm computes in float32 and rounds once to T, as the fused op does, but with the weight + 1 in
  float32; the fused op reads norm_scale in T, so in float16/bfloat16 the weight + 1 is rounded to T first
  (at most half an ulp of T relative to the scale, so at most about 1 ulp of hn); in float32 nothing
  changes but the order of the float32 operations (x * 1/sqrt(v + eps) against x / sqrt(v + eps));
- Div(x, C) rounds x / C, the fused op x * (1/C): the same for C a power of two, otherwise at most an ulp
  of Z where they differ; Swish is x * Sigmoid(x) with Sigmoid and the product rounded to T, as ScaledSiLU;
- the pre-mix rounds each product to T before the float32 mean; the fused op sums float32 products.
"""

from __future__ import annotations

import onnx_ir as ir

from hcfuse import _op
from hcfuse.rewrite.standard_onnx_facts import attr, constant_array, int_list, normalize_axis
from hcfuse.rewrite.standard_onnx_rules import (
    PreMixExpansion, ScaledSiLUExpansion, _element_type, _ExpansionRule, _reshape_allows_zero,
)
from hcfuse.rewrite.values import describe

FLOAT = ir.DataType.FLOAT


def _cast_to(node: ir.Node) -> ir.DataType | None:
    to = attr(node, "to", None)
    return None if to is None else ir.DataType(to)


def _scalar(value: ir.Value, what: str) -> float | str:
    array = constant_array(value)
    if array is None:
        return f"{what} ({describe(value)}) is not a true constant"
    if array.shape not in ((), (1,)) or array.dtype.kind != "f":
        return f"{what} {value.name!r} must be a float scalar of shape [] or [1]; got {array.dtype}{list(array.shape)}"
    return float(array.reshape(-1)[0])


class MobiusNormExpansion(_ExpansionRule):
    """mobius's float32 grouped RMS norm (Qwen4ExpGroupedRMSNorm); casts=False is its float32 export,
    where constant folding removed every Cast."""

    kind = _op.BRANCH_NORM

    def __init__(self, recorder, name, *, casts: bool):
        super().__init__(recorder, name)
        self._casts = casts

    def pattern(self, op, x, grouped_to, axes, eps, w, one, scale_to):
        xf = op.Cast(x, _allow_other_attributes=True, _outputs=["x_float"]) if self._casts else x
        grouped = op.Reshape(xf, grouped_to, _allow_other_attributes=True, _outputs=["grouped"])
        variance = op.ReduceMean(op.Mul(grouped, grouped), axes, _allow_other_attributes=True, _outputs=["variance"])
        normalized = op.Mul(grouped, op.Reciprocal(op.Sqrt(op.Add(variance, eps))))
        wf = op.Cast(w, _allow_other_attributes=True, _outputs=["w_float"]) if self._casts else w
        scale = op.Reshape(op.Add(wf, one), scale_to, _allow_other_attributes=True, _outputs=["scale"])
        shape = op.Shape(x, _allow_other_attributes=True, _outputs=["shape"])
        flat = op.Reshape(op.Mul(normalized, scale), shape, _allow_other_attributes=True, _outputs=["flat"])
        return op.Cast(flat, _allow_other_attributes=True, _outputs=["out"]) if self._casts else flat

    def group_name(self, root: ir.Node) -> str:
        return root.name.rsplit("/", 1)[0] if "/hc_norm/" in root.name else root.name

    def prove(self, context, b):
        T = _element_type(b["x"], b["w"])
        if isinstance(T, str):
            return T
        if not self._casts and T != FLOAT:
            return f"the norm of {b['x'].name!r} computes in {T.name} without casts: not the float32 norm"
        if self._casts:
            casts = {"the norm input": (b["x_float"], FLOAT), "the norm weight": (b["w_float"], FLOAT),
                     "the norm output": (b["out"], T)}
            for what, (value, to) in casts.items():
                if _cast_to(value.producer()) != to:
                    return f"{what} must be cast to {to.name}; Cast {value.producer().name!r} casts to " \
                           f"{_cast_to(value.producer())}"
        x_dims = self._rec.dims(b["x"])
        target = int_list(b["grouped_to"])
        if target is None or len(target) < 3 or min(target[-2:]) <= 0:
            return f"the norm's Reshape target ({describe(b['grouped_to'])}) must be a true constant (.., C, H)"
        C, H = target[-2:]
        if not x_dims or x_dims[-1] != C * H:
            return f"the norm input {b['x'].name!r} must be (..., {C * H}) for groups of ({C}, {H}); got {x_dims}"
        if any(_reshape_allows_zero(v.producer()) for v in (b["grouped"], b["scale"], b["flat"])):
            return "a Reshape has allowzero=1 (a 0 is then a size, not a copy)"
        axes = int_list(b["axes"])
        if axes is None or len(axes) != 1 or normalize_axis(axes[0], len(target)) != len(target) - 1:
            return f"the norm's ReduceMean must average the last axis only; got axes {describe(b['axes'])}"
        if attr(b["variance"].producer(), "keepdims", 1) != 1:
            return "the norm's ReduceMean must keep the averaged axis (keepdims=1)"
        shape_node = b["shape"].producer()
        if attr(shape_node, "start", 0) != 0 or attr(shape_node, "end", None) is not None:
            return f"Shape {shape_node.name!r} must give the whole shape of the norm input (no start or end)"
        eps = _scalar(b["eps"], "the norm's epsilon")
        if isinstance(eps, str):
            return eps
        one = _scalar(b["one"], "the constant added to the norm weight")
        if isinstance(one, str):
            return one
        if one != 1.0:
            return f"the norm weight must be offset by 1; {b['one'].name!r} is {one}"
        if int_list(b["scale_to"]) != [C, H]:
            return f"the norm weight + 1 must be reshaped to [{C}, {H}]; got {describe(b['scale_to'])}"
        if self._rec.dims(b["w"]) != (C * H,):
            return f"the norm weight {b['w'].name!r} must be ({C * H},); got {self._rec.dims(b['w'])}"
        return {"group": self.group_name(context.root), "C": C, "H": H, "T": T, "epsilon": eps,
                "constants": [b["grouped_to"], b["axes"], b["eps"], b["scale_to"]]}

    def build(self, op, name, b, facts):
        w = op.Cast(b["w"], to=FLOAT) if self._casts else b["w"]
        scale = op.Add(w, b["one"])
        if self._casts:
            scale = op.Cast(scale, to=facts["T"])
        scale.type, scale.shape = ir.TensorType(facts["T"]), ir.Shape([facts["C"] * facts["H"]])
        return self.emit(op, name, b["x"], scale, num_branches=facts["C"], epsilon=facts["epsilon"])


class SwishExpansion(ScaledSiLUExpansion):
    """Swish(Div(x, d)) (opset 24) with alpha 1 is x/d * sigmoid(x/d): ScaledSiLU with alpha 1/d."""

    def pattern(self, op, x, divisor):
        return op.Swish(op.Div(x, divisor), _allow_other_attributes=True)

    def prove(self, context, b):
        alpha = attr(context.root, "alpha", 1.0)
        if alpha != 1.0:
            return f"Swish {context.root.name!r} has alpha {alpha}: x * sigmoid(alpha * x) is no ScaledSiLU"
        return super().prove(context, b)


class FloatMeanPreMixExpansion(PreMixExpansion):
    """The pre-mix whose mean is taken in float32 between two casts (mobius's later revision)."""

    def pattern(self, op, hn, g, hn_to, g_to, axes):
        weighted = op.Cast(self.products(op, hn, g, hn_to, g_to), _allow_other_attributes=True,
                           _outputs=["weighted_float"])
        return op.Cast(self.mean(op, weighted, axes), _allow_other_attributes=True, _outputs=["out"])

    def prove(self, context, b):
        facts = super().prove(context, b)
        if isinstance(facts, str):
            return facts
        T = facts["hn"].dtype
        if _cast_to(b["weighted_float"].producer()) != FLOAT or _cast_to(b["out"].producer()) != T:
            return "the pre-mix products must be cast to FLOAT before the mean and the mean back to their type"
        return facts


def mobius_rules(recorder) -> list:
    return [
        MobiusNormExpansion.rule(recorder, "MobiusNorm", casts=True),
        MobiusNormExpansion.rule(recorder, "MobiusNormFloat32", casts=False),
        SwishExpansion.rule(recorder, "MobiusScaledSiLU"),
        FloatMeanPreMixExpansion.rule(recorder, "MobiusPreMix", axes_input=True),
    ]
