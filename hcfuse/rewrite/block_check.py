"""The conditions under which a matched stock block may become one fused node.

Each condition is one short method that returns what it proved or raises Reject with a reason naming
the value or node that failed it. Together they prove everything the fused node's run-time validation
(ResolveHcLowRankMixParams in kernels/include/hcfuse/hc_params.h) would check, from facts that hold
whenever the stock chain runs: shapes come from ShapeFacts, constants only from true constants
(hcfuse.rewrite.values), and what is unknown is refused, never assumed.

A projection may be a com.microsoft.MatMulNBits where the chain has a MatMul (hcfuse.rewrite.nbits_projection
says what it must be); the block then becomes the quantized op (hcfuse._op_nbits), whose down and inject
are one weight, both dense or both quantized, and whose quantized projections share bits, block_size and
accuracy_level.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from hcfuse import _op
from hcfuse.rewrite import nbits_projection
from hcfuse.rewrite.nbits_projection import QuantizedProjection
from hcfuse.rewrite.shape_facts import ShapeFacts
from hcfuse.rewrite.values import describe, outside_use, true_constant

_TYPES = {ir.DataType(t) for t in _op.ELEMENT_TYPES}


class Reject(Exception):
    """A failed condition: reason names it; prologue_only when only the prologue cannot be absorbed."""

    def __init__(self, reason: str, *, prologue_only: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.prologue_only = prologue_only


@dataclasses.dataclass(frozen=True)
class Variant:
    has_prologue: bool
    has_gate_mul: bool
    packed: bool
    has_inject: bool


@dataclasses.dataclass(frozen=True)
class Proof:
    """What check proved and rewrite needs (per match, kept small)."""

    graph: ir.Graph | ir.Function
    anchor: str
    nodes: tuple[str, ...]
    attrs: dict
    C: int
    H: int
    R: int
    T: ir.DataType
    norm_layout: str  # "flat" (C*H) | "grouped" (C, H) | "shared" (H)
    streams_out: bool
    # the MatMulNBits projections by role ("packed", "down", "inject", "up"); empty: the dense op
    quantized: dict[str, QuantizedProjection] = dataclasses.field(default_factory=dict)

    @property
    def nbits_attributes(self) -> dict[str, int]:
        """bits, block_size and accuracy_level, which every quantized projection shares."""
        first = next(iter(self.quantized.values()))
        return dict(zip(("bits", "block_size", "accuracy_level"), first.nbits_attributes()))


def _node_name(node: ir.Node) -> str:
    return f"{node.op_type} {node.name!r}"


class BlockCheck:
    """The conditions for one match: b holds the pattern's bindings."""

    def __init__(self, variant: Variant, context, b: dict, facts: ShapeFacts):
        self.v, self.context, self.b, self.facts = variant, context, b, facts
        self.q: dict[str, QuantizedProjection] = {}

    def dims(self, name: str):
        return self.facts.dims(self.b[name])

    def attr(self, var: str, node_key: str, name: str, default):
        """An attribute bound by the pattern; a reference to a function attribute is not resolved."""
        attr = self.b[var]
        if attr is None:
            return default
        if attr.is_ref():
            node = self.b[node_key].producer()
            raise Reject(f"attribute {name} of {_node_name(node)} refers to the function attribute "
                         f"{attr.ref_attr_name!r}: its value is only known at the call site")
        return attr.value

    def prove(self) -> Proof:
        C = self.branches()
        self.consumers()
        self.q = self.quantized_projections()
        CH, R = self.weight_shapes(C)
        H = CH // C
        T = self.element_type()
        layout = self.norm_layout(C, H)
        self.streams(CH)
        attrs = {
            "num_branches": C,
            "epsilon": self.float_attr("epsilon", "hn", "epsilon", _op.BRANCH_NORM_DEFAULT_EPSILON),
            "reduction_scale": self.float_attr("reduction_scale", "pre", "reduction_scale", 1.0),
            "silu_alpha": self.silu_alpha(),
            **self.gate_constants(),
        }
        if self.v.has_prologue:
            self.prologue(C, H)
        nodes = self.context.nodes
        s = self.b.get("s")
        streams_out = s is not None and (s.is_graph_output() or any(user not in set(nodes) for user, _ in s.uses()))
        return Proof(graph=self.context.graph_or_function, anchor=self.b["hn"].producer().name,
                     nodes=tuple(n.name for n in nodes), attrs=attrs, C=C, H=H, R=R, T=T,
                     norm_layout=layout, streams_out=streams_out, quantized=self.q)

    def float_attr(self, var: str, node_key: str, name: str, default: float, fused_name: str | None = None):
        """A float attribute's value; a float attribute of a function body that refers to the function's
        own attribute passes on to the fused node as the same reference (resolved at each call site)."""
        attr = self.b[var]
        if attr is not None and attr.is_ref() and attr.type == ir.AttributeType.FLOAT:
            return ir.RefAttr(fused_name or name, attr.ref_attr_name, ir.AttributeType.FLOAT)
        value = self.attr(var, node_key, name, default)
        if not isinstance(value, (int, float)):
            raise Reject(f"attribute {name} of {_node_name(self.b[node_key].producer())} must be a float; got {value!r}")
        return float(value)

    def branches(self) -> int:
        C = self.attr("norm_C", "hn", "num_branches", None)
        if C is None:
            raise Reject("BranchwiseRMSNorm has no num_branches (it would read a flat input as grouped)")
        if not isinstance(C, int) or C < 0:
            raise Reject(f"BranchwiseRMSNorm's num_branches must be a non-negative integer; got {C!r}")
        if C == 0:
            raise Reject("BranchwiseRMSNorm has num_branches=0 (the grouped form, streams (..., C, H)): its "
                         "MatMuls act on each branch's H features, which is not the fused op's (C*H) product")
        pre_C = self.attr("pre_C", "pre", "num_branches", None)
        if pre_C != C:
            raise Reject(f"num_branches differs: BranchwiseRMSNorm {C}, HyperConnectionPreMix {pre_C} "
                         f"(at {_node_name(self.b['pre'].producer())})")
        if self.v.has_prologue:
            post_C = self.attr("post_C", "s", "num_branches", None)
            if post_C != C:
                raise Reject(f"num_branches differs: BranchwiseRMSNorm {C}, HyperConnectionPostMix {post_C} "
                             f"(at {_node_name(self.b['s'].producer())})", prologue_only=True)
        return C

    def consumers(self) -> None:
        """No value computed inside the block but pre, gate and S is used outside it."""
        matched = set(self.context.nodes)
        hn = self.b["hn"]
        for user, _ in hn.uses():
            if user not in matched:
                raise Reject(f"hn {hn.name!r} is also consumed by {_node_name(user)}")
        reason = outside_use(self.context.nodes, self.context.output_values)
        if reason is not None:
            raise Reject(reason)

    def projections(self) -> dict[str, tuple[str, str]]:
        """The block's projections: role -> (the pattern's name of its weight, of its output)."""
        if self.v.packed:
            roles = {"packed": ("packed_weight", "packed_out")}
        else:
            roles = {"down": ("down_weight", "down")}
            if self.v.has_inject:
                roles["inject"] = ("inject_weight", "inject")
        return {**roles, "up": ("up_weight", "up_out")}

    def quantized_projections(self) -> dict[str, QuantizedProjection]:
        """The MatMulNBits among the projections, each one the fused op can take, agreeing on bits, block_size
        and accuracy_level; down and inject quantized both or neither."""
        found = {}
        for role, (_, output) in self.projections().items():
            node = self.b[output].producer()
            if nbits_projection.is_nbits(node):
                q = nbits_projection.read(node, self.facts)
                if isinstance(q, str):
                    raise Reject(q)
                found[role] = q
        self._down_and_inject_alike(found)
        self._one_setting(found)
        return found

    def _down_and_inject_alike(self, found: dict[str, QuantizedProjection]) -> None:
        """Separate down and inject become one weight: both quantized or neither, zero points of one type."""
        if ("down" in found) != ("inject" in found) and self.v.has_inject and not self.v.packed:
            quantized, dense = ("down", "inject") if "down" in found else ("inject", "down")
            raise Reject(f"{quantized} is quantized (MatMulNBits {found[quantized].node!r}) but {dense} is a MatMul "
                         f"({self.b[dense].producer().name!r}): the fused op takes down and inject as one weight, "
                         "both dense or both quantized")
        if "down" in found and "inject" in found:
            down, inject = (found[r].zero_points for r in ("down", "inject"))
            if down is not None and inject is not None and down.dtype != inject.dtype:
                raise Reject(f"the zero points of down (MatMulNBits {found['down'].node!r}, {down.dtype.name}) and "
                             f"inject ({found['inject'].node!r}, {inject.dtype.name}) differ in type: they cannot "
                             "be one tensor")

    @staticmethod
    def _one_setting(found: dict[str, QuantizedProjection]) -> None:
        """The fused op has one bits, block_size and accuracy_level for every quantized projection."""
        first = next(iter(found.values()), None)
        for q in found.values():
            for name, a, b in zip(("bits", "block_size", "accuracy_level"), first.nbits_attributes(),
                                  q.nbits_attributes()):
                if a != b:
                    raise Reject(f"{name} differs: MatMulNBits {first.node!r} {a}, MatMulNBits {q.node!r} {b} "
                                 f"(the fused op has one {name} for every quantized projection)")

    def _shape(self, role: str, name: str):
        """(K, N) of a projection: a MatMulNBits' attributes (proved against its tensors), or the dense weight's
        dims."""
        q = self.q.get(role)
        return (q.K, q.N) if q is not None else self.dims(name)

    def _wrong_shape(self, role: str, name: str, expected: str, got, label: str | None = None) -> Reject:
        q = self.q.get(role)
        if q is not None:
            return Reject(f"MatMulNBits {q.node!r} must have (K, N) = {expected}; got {got}")
        return Reject(f"{label or name} {self.b[name].name!r} must be {expected}; got {got}")

    def _matrix(self, name: str) -> tuple[int, int]:
        dims = self.dims(name)
        if dims is None or len(dims) != 2 or not all(isinstance(d, int) for d in dims):
            raise Reject(f"{name} {self.b[name].name!r} must be a 2-D weight of known shape; got {dims}")
        return dims

    def weight_shapes(self, C: int) -> tuple[int, int]:
        """(C*H, R) proved from the weights' shapes."""
        if self.v.packed:
            CH, R = self.packed_shape(C)
        else:
            CH, R = self._shape("down", "down_weight") if "down" in self.q else self._matrix("down_weight")
        if R < 1 or CH < 1:
            raise Reject(f"down_weight must be (C*H, R) with C*H and R >= 1; got ({CH}, {R})")
        if CH % C:
            raise Reject(f"the block's width {CH} (rows of the down weight) is not divisible by num_branches {C}")
        up = self._shape("up", "up_weight")
        if up != (R, CH):
            raise self._wrong_shape("up", "up_weight", f"({R}, {CH})", up)
        if self.v.has_inject and not self.v.packed:
            inject = self._shape("inject", "inject_weight")
            if inject != (CH, C):
                raise self._wrong_shape("inject", "inject_weight", f"({CH}, {C})", inject)
        if self.q and not self.v.packed and "down" not in self.q:
            # dense down (and inject) beside a quantized up: one [C*H, R+C] weight, made by concatenation
            for name in ("down_weight", "inject_weight") if self.v.has_inject else ("down_weight",):
                if true_constant(self.b[name]) is None:
                    raise Reject(f"{name} ({describe(self.b[name])}) must be a constant: the quantized op takes "
                                 "down and inject as one weight, which is made from it")
        return CH, R

    def packed_shape(self, C: int) -> tuple[int, int]:
        sizes_value = self.b["split_sizes"]
        sizes = true_constant(sizes_value)
        if sizes is None:
            raise Reject(f"Split sizes ({describe(sizes_value)}) are not a constant")
        sizes = [int(v) for v in sizes.numpy().reshape(-1)]
        if len(sizes) != 2 or sizes[1] != C:
            raise Reject(f"Split sizes must be [R, {C}] (down, inject); got {sizes} "
                         f"(at {_node_name(self.b['down'].producer())})")
        CH, width = self._shape("packed", "packed_weight") if "packed" in self.q else self._matrix("packed_weight")
        R = sizes[0]
        if width != R + C:
            raise self._wrong_shape("packed", "packed_weight", f"({CH}, {R}+{C})", f"({CH}, {width})", "packed weight")
        packed = self.b["packed_weight"]
        if not self.q and true_constant(packed) is None:  # the dense op takes it as two halves
            if packed.is_initializer():
                raise Reject(f"packed weight {describe(packed)}: it cannot be split at fuse time")
            raise Reject(f"packed weight is the {describe(packed)}, not an initializer: it cannot be split")
        axis = self.attr("split_axis", "down", "axis", 0)
        rank = len(self.facts.dims(self.b["down"].producer().inputs[0]) or ())
        if axis != -1 and not (rank and axis == rank - 1):
            raise Reject(f"Split must cut the last axis (axis=-1); got axis={axis} "
                         f"(at {_node_name(self.b['down'].producer())})")
        return CH, R

    def element_type(self) -> ir.DataType:
        v = self.v
        values = {name: self.b[name] for name in ["streams", "norm_scale"]}
        for role, (name, _) in self.projections().items():
            q = self.q.get(role)
            values.update({f"{name} scales": q.scales} if q is not None else {name: self.b[name]})
        if v.has_prologue:
            values.update({name: self.b[name] for name in ("prev_block_output", "prev_post_gate")})
        found = {name: self.facts.dtype(value) for name, value in values.items()}
        found = {k: t for k, t in found.items() if t is not None}
        types = set(found.values())
        if len(types) != 1:
            detail = ", ".join(f"{k} {t.name}" for k, t in found.items()) or "none known"
            raise Reject(f"inputs must share one element type T; got {detail}")
        (T,) = types
        if T not in _TYPES:
            raise Reject(f"element type must be float, float16 or bfloat16; got {T.name}")
        return T

    def norm_layout(self, C: int, H: int) -> str:
        scale = self.b["norm_scale"]
        dims = self.facts.dims(scale)
        if dims == (C * H,):
            return "flat"
        layout = {(C, H): "grouped", (H,): "shared"}.get(dims)
        if layout is not None and true_constant(scale) is not None:
            return layout
        raise Reject(f"norm scale ({describe(scale)}) must be ({C * H},), or a constant ({C}, {H}) or ({H},); "
                     f"got {dims}")

    def streams(self, CH: int) -> None:
        streams = self.b["s"] if self.v.has_prologue else self.b["streams"]
        dims = self.facts.dims(streams)
        if dims is not None and (not dims or dims[-1] not in (None, CH) and isinstance(dims[-1], int)):
            raise Reject(f"streams {streams.name!r} must be (..., {CH}); got {dims}")

    def silu_alpha(self) -> float | ir.Attr:
        node = self.b["d"].producer()
        alpha = self.float_attr("silu_alpha", "d", "alpha", 1.0, fused_name="silu_alpha")
        if len(node.inputs) < 2 or node.inputs[1] is None:
            return alpha
        scale = node.inputs[1]
        tensor = true_constant(scale)
        if tensor is None:
            raise Reject(f"ScaledSiLU {node.name!r} has a non-constant scale input ({describe(scale)})")
        if tuple(tensor.shape.dims) != ():
            raise Reject(f"ScaledSiLU {node.name!r}'s scale input must be a 0-d scalar; got shape "
                         f"{tuple(tensor.shape.dims)}")
        return float(tensor.numpy())

    def gate_constants(self) -> dict[str, float]:
        gates = {"gate_div": 1.0, "gate_mul": 1.0}
        if not self.v.has_inject:
            return gates
        for name, used in (("gate_div", self.b["has_gate_div"]), ("gate_mul", self.v.has_gate_mul)):
            if not used:
                continue
            tensor = true_constant(self.b[name])
            if tensor is None or tuple(tensor.shape.dims) not in ((), (1,)):
                raise Reject(f"{name} ({describe(self.b[name])}) must be a constant scalar of shape [] or [1]")
            gates[name] = float(tensor.numpy().reshape(-1)[0])
        return gates

    def prologue(self, C: int, H: int) -> None:
        """The PostMix's inputs are what the fused op's prologue takes: post_mix (..., C) with the rank of
        streams (it may also be (..., C, 1) or (..., C, H), which the fused op cannot take)."""
        b = self.b
        post = b["s"].producer()
        if len(post.inputs) > 3 and post.inputs[3] is not None:
            raise Reject(f"HyperConnectionPostMix {post.name!r} has a stream_mix input", prologue_only=True)
        prev_out, gate = self.dims("prev_block_output"), self.dims("prev_post_gate")
        streams = self.dims("streams")
        if prev_out is not None and (len(prev_out) < 1 or isinstance(prev_out[-1], int) and prev_out[-1] != H):
            raise Reject(f"prev_block_output {b['prev_block_output'].name!r} must be (..., {H}); got {prev_out}",
                         prologue_only=True)
        if gate is None:
            raise Reject(f"the shape of post_mix {b['prev_post_gate'].name!r} is unknown: cannot prove it is "
                         f"(..., {C})", prologue_only=True)
        if not gate or gate[-1] != C:
            raise Reject(f"post_mix {b['prev_post_gate'].name!r} must be (..., {C}); got {gate}", prologue_only=True)
        if streams is None:
            raise Reject(f"the rank of streams {b['streams'].name!r} is unknown: cannot prove post_mix "
                         f"{b['prev_post_gate'].name!r} {gate} is (..., {C}) rather than (..., {C}, H)",
                         prologue_only=True)
        for name, dims in (("post_mix", gate), ("prev_block_output", prev_out)):
            if dims is not None and len(dims) != len(streams):
                value = b["prev_post_gate" if name == "post_mix" else "prev_block_output"]
                raise Reject(f"{name} {value.name!r} must be (..., {C if name == 'post_mix' else H}) with the "
                             f"leading dims of streams {streams}; got {dims}", prologue_only=True)
