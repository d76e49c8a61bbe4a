"""ONNX schema of com.microsoft::HyperConnectionLowRankMix with type and shape inference.

`_infer` runs on whatever ONNX knows, which inside ONNX Runtime's symbolic shape inference is often
partial (that tool calls ONNX single-node inference before its own handlers). So it fills in what
the known facts imply and raises `InferenceError` only when known facts contradict each other:
an exception raised here escapes ONNX's inference even outside strict mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import onnx
from onnx import TensorProto, TypeProto
from onnx.defs import OpSchema
from onnx.shape_inference import InferenceError

from hcfuse._op import (
    ATTRIBUTES,
    DOMAIN,
    DOWN_WEIGHT,
    ELEMENT_TYPES,
    FLOAT_ATTRIBUTES,
    INJECT_WEIGHT,
    INPUTS,
    NORM_SCALE,
    NUM_REQUIRED_INPUTS,
    NUM_REQUIRED_OUTPUTS,
    OP_TYPE,
    OUTPUTS,
    POST_GATE,
    PRE_OUTPUT,
    PREV_BLOCK_OUTPUT,
    PREV_POST_GATE,
    SINCE_VERSION,
    STREAMS,
    STREAMS_OUT,
    UP_WEIGHT,
)

_DOC = f"""
Fused hyper-connection block: optional prologue, branchwise RMS norm, low-rank gate, stream reduction
and post gate. Replaces the chain HyperConnectionPostMix -> BranchwiseRMSNorm -> MatMul -> ScaledSiLU
-> MatMul -> Sigmoid -> HyperConnectionPreMix plus MatMul -> [Div] -> Sigmoid -> [Mul].

Shapes (C = num_branches; `...` any leading dims, rows = their product, zero rows valid):
streams (..., C*H), norm_scale (C*H), down_weight (C*H, R), up_weight (R, C*H), inject_weight (C*H, C),
optional pair prev_block_output (..., H) and prev_post_gate (..., C) (both or neither);
outputs pre_output (..., H), post_gate (..., C), optional streams_out (..., C*H).

Per row (c indexes branches, h features within a branch):
  S    = streams + prev_post_gate[c] * prev_block_output[h]   (prologue; else S = streams)
  hn   = S / sqrt(mean_h(S^2) + epsilon) * norm_scale          per branch
  d    = ScaledSiLU(hn @ down_weight, silu_alpha)
  g    = sigmoid(d @ up_weight)
  pre_output = reduction_scale * sum_c(hn * g)
  post_gate  = sigmoid((hn @ inject_weight) / gate_div) * gate_mul
  streams_out = S

Numerics contract: every matrix product and reduction accumulates in fp32; each step is rounded once
to T where the equivalent standard operator would round: S, hn, down, Z = silu_alpha * down,
SG = sigmoid(Z), hidden = Z * SG, up, g, pre_output, inject, and the gate as the stock Div, Sigmoid
and Mul round it: post_gate = T(T(sigmoid(T(inject / gate_div))) * gate_mul). Sigmoid is an accurate
fp32 sigmoid rounded once to T. Accumulation order is fixed: results are deterministic and row
independent.
Type T: {", ".join(f"tensor({TensorProto.DataType.Name(t).lower()})" for t in ELEMENT_TYPES)}.
"""

_TYPE_STRS = [f"tensor({TensorProto.DataType.Name(t).lower()})" for t in ELEMENT_TYPES]

# What each input, output and attribute is (onnxruntime's schema of the op says the same).
_DESCRIPTIONS = {
    "streams": "The C streams of width H, flattened: (..., C*H). With the prologue, the streams before the "
               "previous block's post-mix.",
    "norm_scale": "Per-branch RMS norm weight: (C*H).",
    "down_weight": "Down projection of the gate network: (C*H, R), row-major [K, N].",
    "up_weight": "Up projection of the gate network: (R, C*H), row-major [K, N].",
    "inject_weight": "Projection of hn to the gate logits: (C*H, C), row-major [K, N].",
    "prev_block_output": "Optional output of the previous block: (..., H). Given together with prev_post_gate, "
                         "the previous block's post-mix is applied first.",
    "prev_post_gate": "Optional post_gate of the previous call: (..., C). Given together with prev_block_output.",
    "pre_output": "Input of the next transformer block: (..., H), reduction_scale * sum over branches of hn * g.",
    "post_gate": "Post-mix gate for the next call: (..., C), sigmoid(inject / gate_div) * gate_mul.",
    "streams_out": "Optional streams after the prologue, S: the shape of streams. Equal to streams without "
                   "the prologue inputs.",
    "num_branches": "Number of streams C. The last dim of streams is C*H.",
    "epsilon": "Added to each branch's mean square before the reciprocal square root.",
    "reduction_scale": "Multiplier of the sum over branches that forms pre_output.",
    "silu_alpha": "Scale of the ScaledSiLU between the down and up projections.",
    "gate_div": "Divisor of the gate logits (hn @ inject_weight) before the sigmoid. Must not be zero.",
    "gate_mul": "Multiplier of the sigmoid of the gate logits.",
}


def make_schema() -> OpSchema:
    """The OpSchema of the fused op, inference function attached."""
    single, optional = OpSchema.FormalParameterOption.Single, OpSchema.FormalParameterOption.Optional

    def param(name: str, index: int, required: int) -> OpSchema.FormalParameter:
        return OpSchema.FormalParameter(name, "T", _DESCRIPTIONS[name],
                                        param_option=single if index < required else optional)

    attrs = [OpSchema.Attribute("num_branches", OpSchema.AttrType.INT, _DESCRIPTIONS["num_branches"], required=True)]
    attrs += [
        OpSchema.Attribute(name, onnx.helper.make_attribute(name, float(ATTRIBUTES[name])), _DESCRIPTIONS[name])
        for name in FLOAT_ATTRIBUTES
    ]
    schema = OpSchema(
        OP_TYPE,
        DOMAIN,
        SINCE_VERSION,
        _DOC,
        inputs=[param(n, i, NUM_REQUIRED_INPUTS) for i, n in enumerate(INPUTS)],
        outputs=[param(n, i, NUM_REQUIRED_OUTPUTS) for i, n in enumerate(OUTPUTS)],
        type_constraints=[("T", _TYPE_STRS, "float, float16 or bfloat16; the same for every input and output")],
        attributes=attrs,
        node_determinism=OpSchema.NodeDeterminism.Deterministic,
    )
    schema.set_type_and_shape_inference_function(_infer)
    return schema


def _is_registered(op_type: str, since_version: int, domain: str) -> bool:
    try:
        return onnx.defs.get_schema(op_type, since_version, domain).since_version == since_version
    except onnx.defs.SchemaError:
        return False


def register_op_schema(schema: OpSchema) -> bool:
    """Register a schema (of either op) with ONNX unless ONNX already knows the op; True when this call added it."""
    if _is_registered(schema.name, schema.since_version, schema.domain):
        return False
    onnx.defs.register_schema(schema)
    return True


def deregister_op_schema(op_type: str, since_version: int, domain: str) -> None:
    """Remove an op's schema; a no-op when it is not registered."""
    if _is_registered(op_type, since_version, domain):
        onnx.defs.deregister_schema(op_type, since_version, domain)


def register_schema() -> bool:
    """Register the schema with ONNX unless ONNX already knows the op; True when this call added it."""
    return register_op_schema(make_schema())


def deregister_schema() -> None:
    """Remove the schema (tests); a no-op when it is not registered."""
    deregister_op_schema(OP_TYPE, SINCE_VERSION, DOMAIN)


# ---- inference ------------------------------------------------------------------------------

# A dim is an int (known), a str (symbol) or None (unknown); a shape is a list of dims or None.
Dim = int | str | None


def _shape_of(tp: TypeProto | None) -> list[Dim] | None:
    if tp is None or not tp.tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None)
        for d in tp.tensor_type.shape.dim
    ]


def _known(d: Dim) -> bool:
    return isinstance(d, int)


def _fmt(shape: list[Dim]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


class _Facts:
    """Known sizes gathered from the inputs; `agree` records a size or raises on a contradiction."""

    def __init__(self, where: str):
        self.where = where
        self.sizes: dict[str, tuple[int, str]] = {}  # "CH" -> (value, "input[dim]" it came from)

    def agree(self, key: str, value: Dim, source: str) -> None:
        if not _known(value):
            return
        seen = self.sizes.get(key)
        if seen is None:
            self.sizes[key] = (value, source)
        elif seen[0] != value:
            raise InferenceError(
                f"{self.where}: {source} = {value} but {seen[1]} = {seen[0]}; both must be {key}"
            )

    def get(self, key: str) -> int | None:
        return self.sizes[key][0] if key in self.sizes else None


def _elem_type(ctx, present: list[int], where: str) -> int:
    """T from streams (else the first typed input); every known element type must agree."""
    found, source = 0, ""
    for i in present:
        tp = ctx.get_input_type(i)
        t = tp.tensor_type.elem_type if tp is not None else 0
        if not t:
            continue
        name = TensorProto.DataType.Name(t)
        if t not in ELEMENT_TYPES:
            raise InferenceError(f"{where}: {INPUTS[i]} has element type {name}; T must be one of {_TYPE_STRS}")
        if found and t != found:
            raise InferenceError(
                f"{where}: {INPUTS[i]} has element type {name} but {source} has "
                f"{TensorProto.DataType.Name(found)}; all inputs must share T"
            )
        if not found:
            found, source = t, INPUTS[i]
    return found


def _check_rank(name: str, shape: list[Dim] | None, rank: int, spelled: str, where: str) -> None:
    if shape is not None and len(shape) != rank:
        raise InferenceError(f"{where}: {name} must be {spelled}; got rank {len(shape)} shape {_fmt(shape)}")


def agree_dims(facts: _Facts, name: str, shape: list[Dim] | None, keys: Sequence[str], spelled: str) -> None:
    """Checks an input's rank (one dim per key) and records each known dim under its key."""
    _check_rank(name, shape, len(keys), spelled, facts.where)
    for k, (key, d) in enumerate(zip(keys, shape or ())):
        facts.agree(key, d, f"{name}[{k}]")


def _merge_leading(where: str, lead: list[tuple[str, list[Dim]]]) -> list[Dim] | None:
    """Leading dims shared by streams and the prologue inputs (no broadcasting): values win over symbols."""
    lead = [(n, s) for n, s in lead if s is not None]
    if not lead:
        return None
    first_name, merged = lead[0][0], list(lead[0][1])
    for name, dims in lead[1:]:
        if len(dims) != len(merged):
            raise InferenceError(
                f"{where}: {name} has {len(dims)} leading dims {_fmt(dims)} but {first_name} has "
                f"{len(merged)} {_fmt(merged)}; leading dims must be equal (no broadcasting)"
            )
        for k, (a, b) in enumerate(zip(merged, dims)):
            if _known(a) and _known(b) and a != b:
                raise InferenceError(
                    f"{where}: {name} leading dim {k} is {b} but {first_name} has {a} there; leading dims must be equal"
                )
            if not _known(a) and (_known(b) or a is None):
                merged[k] = b
    return merged


class OpLayout(NamedTuple):
    """Where an op keeps the inputs both ops share, for the inference steps they share."""

    inputs: tuple[str, ...]  # the op's input names
    required: Sequence[int]
    streams: int
    prologue: tuple[int, int]  # prev_block_output, prev_post_gate
    width_key: str  # the facts' key of C*H (in the messages of a contradiction)


_LAYOUT = OpLayout(INPUTS, range(NUM_REQUIRED_INPUTS), STREAMS, (PREV_BLOCK_OUTPUT, PREV_POST_GATE), "CH")


def check_present(where: str, present: Sequence[int], layout: OpLayout) -> None:
    """Raises when a required input is missing or the prologue inputs do not come as a pair."""
    names = layout.inputs
    missing = [names[i] for i in layout.required if i not in present]
    if missing:
        raise InferenceError(f"{where}: required input(s) {', '.join(missing)} missing")
    has_prev = [i in present for i in layout.prologue]
    if has_prev[0] != has_prev[1]:
        given, absent = (names[layout.prologue[0]], names[layout.prologue[1]])[:: 1 if has_prev[0] else -1]
        raise InferenceError(f"{where}: {given} is given without {absent}; the prologue inputs come as a pair")


def streams_width(facts: _Facts, shapes: dict[int, list[Dim] | None], layout: OpLayout) -> None:
    """Records C*H from streams' last dim; raises on a scalar streams."""
    streams = shapes[layout.streams]
    if streams is not None and not streams:
        raise InferenceError(f"{facts.where}: streams must be (..., C*H) with rank >= 1; got a scalar")
    if streams is not None:
        facts.agree(layout.width_key, streams[-1], "streams[-1]")


def leading_dims(facts: _Facts, c: int, shapes: dict[int, list[Dim] | None],
                 layout: OpLayout) -> tuple[list[Dim] | None, Dim, Dim]:
    """H from C*H, and the outputs' leading dims from streams and the prologue inputs: (leading, H, C*H), each
    None when unknown."""
    where, key = facts.where, layout.width_key
    width = facts.get(key)
    if width is not None and width % c:
        raise InferenceError(f"{where}: width C*H = {width} ({facts.sizes[key][1]}) is not divisible by "
                             f"num_branches = {c}")
    if width is not None:
        facts.agree("H", width // c, f"{facts.sizes[key][1]} / num_branches")
    streams = shapes[layout.streams]
    lead = [(layout.inputs[layout.streams], streams[:-1] if streams else None)]
    for i, last in zip(layout.prologue, ("H", "C")):
        s = shapes.get(i)
        if s is not None and not s:
            raise InferenceError(f"{where}: {layout.inputs[i]} must be (..., {last}) with rank >= 1; got a scalar")
        if s:
            facts.agree(last, s[-1], f"{layout.inputs[i]}[-1]")
            lead.append((layout.inputs[i], s[:-1]))
    h = facts.get("H")
    return _merge_leading(where, lead), h, (h * c if h is not None else (streams[-1] if streams else None))


def set_outputs(ctx, elem_type: int, leading: list[Dim] | None, last: dict[int, Dim]) -> None:
    """Types the node's present outputs: T, the leading dims and each output's last dim."""
    if not elem_type:  # nothing tells T yet: an UNDEFINED element type would be an error, so set nothing
        return
    for o in range(ctx.get_num_outputs()):
        if ctx.has_output(o):
            shape = None if leading is None else [*leading, last[o]]
            ctx.set_output_type(o, onnx.helper.make_tensor_type_proto(elem_type, shape))


def node_form_problem(num_branches, num_inputs: int, num_outputs: int) -> str | None:
    """What is wrong with a node's num_branches attribute (an AttributeProto or None) and its number of
    inputs and outputs, or None: the checks the schema and onnxruntime's symbolic handler share."""
    if num_branches is None:
        return "required attribute num_branches is missing"
    if num_branches.type != onnx.AttributeProto.INT:
        return (f"num_branches must be an INT attribute; got a "
                f"{onnx.AttributeProto.AttributeType.Name(num_branches.type)} attribute")
    if num_branches.i <= 0:
        return f"num_branches must be > 0; got {num_branches.i}"
    for what, count, names in (("outputs", num_outputs, OUTPUTS), ("inputs", num_inputs, INPUTS)):
        if count > len(names):
            return f"has {count} {what}; the op has at most {len(names)} ({', '.join(names)})"
    return None


def _infer(ctx) -> None:
    """Type and shape inference: fill what the known facts imply, raise only on contradictions."""
    where = f"{OP_TYPE} ({ctx.get_display_name()})"
    attr = ctx.get_attribute("num_branches")
    problem = node_form_problem(attr, ctx.get_num_inputs(), ctx.get_num_outputs())
    if problem:
        raise InferenceError(f"{where}: {problem}")
    c = attr.i

    present = [i for i in range(ctx.get_num_inputs()) if ctx.has_input(i)]
    check_present(where, present, _LAYOUT)
    elem_type = _elem_type(ctx, present, where)
    shapes = {i: _shape_of(ctx.get_input_type(i)) for i in present}

    facts = _Facts(where)
    facts.agree("C", c, "num_branches")
    streams_width(facts, shapes, _LAYOUT)
    for i, spelled, keys in (
        (NORM_SCALE, "(C*H,)", ("CH",)),
        (DOWN_WEIGHT, "(C*H, R)", ("CH", "R")),
        (UP_WEIGHT, "(R, C*H)", ("R", "CH")),
        (INJECT_WEIGHT, "(C*H, C)", ("CH", "C")),
    ):
        agree_dims(facts, INPUTS[i], shapes.get(i), keys, spelled)
    leading, h, width = leading_dims(facts, c, shapes, _LAYOUT)
    set_outputs(ctx, elem_type, leading, {PRE_OUTPUT: h, POST_GATE: c, STREAMS_OUT: width})
