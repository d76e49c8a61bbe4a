"""ONNX schema of ai.hcfuse::HyperConnectionLowRankMixNBits with type and shape inference.

Like the dense op's schema (hcfuse/shapes/schema.py, whose inference helpers this module uses), `_infer`
fills in what the known facts imply and raises `InferenceError` only when known facts contradict each other
or the op's rules: it also runs inside onnxruntime's symbolic shape inference, on partial information.
"""

from __future__ import annotations

import onnx
from typing import NamedTuple

from onnx import TensorProto
from onnx.defs import OpSchema
from onnx.shape_inference import InferenceError

from hcfuse import _op_nbits
from hcfuse._op_nbits import (
    ATTRIBUTES,
    DOMAIN,
    DOWN_INJECT,
    ELEMENT_TYPES,
    FLOAT_ATTRIBUTES,
    INPUTS,
    NBITS_ATTRIBUTES,
    NORM_SCALE,
    NUM_REQUIRED_OUTPUTS,
    OP_TYPE,
    OUTPUTS,
    POST_GATE,
    PRE_OUTPUT,
    PREV_BLOCK_OUTPUT,
    PREV_POST_GATE,
    PROJECTIONS,
    QUANTIZED_TYPE,
    REQUIRED_INPUTS,
    SINCE_VERSION,
    STREAMS,
    STREAMS_OUT,
    UP,
)
from hcfuse.shapes.schema import (
    Dim,
    OpLayout,
    _check_rank,
    _Facts,
    _known,
    _shape_of,
    agree_dims,
    check_present,
    deregister_op_schema,
    leading_dims,
    node_form_problem,
    register_op_schema,
    set_outputs,
    streams_width,
)

_DOC = """
HyperConnectionLowRankMix with quantized projections: the same computation, each of its two projections
given dense (T) or as com.microsoft::MatMulNBits takes its weight, bytes unchanged. At least one is quantized.

down_inject_weight: dense T (C*H, R+C), down's R columns then inject's C; or MatMulNBits' B uint8
(R+C, k_blocks, blob_size) with K = C*H, N = R+C, its scales T (R+C, k_blocks) and optional zero points
(uint8 (R+C, ceil(k_blocks*bits/8)) packed, or T (R+C, k_blocks); absent = 2^(bits-1)).
up_weight: dense T (R, C*H), or B uint8 (C*H, k_blocks, blob_size) with K = R, N = C*H, scales and zero points
likewise. k_blocks = ceil(K / block_size), blob_size = block_size * bits / 8; bits and block_size are one value
for every quantized projection of the node. Scales are given iff their weight is uint8.

A quantized weight is w[k, n] = (q - zero_point) * scale, computed in fp32 and entering the products as fp32
(never rounded to T); everything else is the dense op's numerics contract. accuracy_level is not used by the
computation (kept for unfusion back to MatMulNBits).
"""

_T_STRS = [f"tensor({TensorProto.DataType.Name(t).lower()})" for t in ELEMENT_TYPES]
_UINT8_STR = "tensor(uint8)"
# One type variable per weight and per zero-point input: each may be dense/packed or quantized/T on its own
# (ONNX binds every parameter of one type variable to one type).
_WEIGHT_TYPE = {DOWN_INJECT.weight: "TD", UP.weight: "TU"}
_ZERO_POINT_TYPE = {DOWN_INJECT.zero_points: "TZD", UP.zero_points: "TZU"}
_LAYOUT = OpLayout(INPUTS, REQUIRED_INPUTS, STREAMS, (PREV_BLOCK_OUTPUT, PREV_POST_GATE), "C*H")
_OPTIONAL_INPUTS = {i for i in range(len(INPUTS)) if i not in REQUIRED_INPUTS}


def make_schema() -> OpSchema:
    """The OpSchema of the quantized op, inference function attached."""
    single, optional = OpSchema.FormalParameterOption.Single, OpSchema.FormalParameterOption.Optional

    def input_param(name: str, index: int) -> OpSchema.FormalParameter:
        type_str = _WEIGHT_TYPE.get(index) or _ZERO_POINT_TYPE.get(index) or "T"
        return OpSchema.FormalParameter(name, type_str, param_option=optional if index in _OPTIONAL_INPUTS else single)

    attrs = [OpSchema.Attribute("num_branches", OpSchema.AttrType.INT, "number of streams C", required=True)]
    attrs += [OpSchema.Attribute(name, onnx.helper.make_attribute(name, ATTRIBUTES[name]), name)
              for name in (*FLOAT_ATTRIBUTES, *NBITS_ATTRIBUTES)]
    type_constraints = [("T", _T_STRS, "activations, scales and zero points of T: float, float16 or bfloat16")]
    type_constraints += [(t, [*_T_STRS, _UINT8_STR], f"{INPUTS[i]}: dense T or MatMulNBits' uint8 B")
                         for i, t in _WEIGHT_TYPE.items()]
    type_constraints += [(t, [_UINT8_STR, *_T_STRS], f"{INPUTS[i]}: packed uint8 or T")
                         for i, t in _ZERO_POINT_TYPE.items()]
    schema = OpSchema(
        OP_TYPE,
        DOMAIN,
        SINCE_VERSION,
        _DOC,
        inputs=[input_param(n, i) for i, n in enumerate(INPUTS)],
        outputs=[OpSchema.FormalParameter(n, "T", param_option=single if i < NUM_REQUIRED_OUTPUTS else optional)
                 for i, n in enumerate(OUTPUTS)],
        type_constraints=type_constraints,
        attributes=attrs,
        node_determinism=OpSchema.NodeDeterminism.Deterministic,
    )
    schema.set_type_and_shape_inference_function(_infer)
    return schema


def register_schema() -> bool:
    """Register the schema with ONNX unless ONNX already knows the op; True when this call added it."""
    return register_op_schema(make_schema())


def deregister_schema() -> None:
    """Remove the schema (tests); a no-op when it is not registered."""
    deregister_op_schema(OP_TYPE, SINCE_VERSION, DOMAIN)


# ---- inference ------------------------------------------------------------------------------


def _int_attribute(get_attribute, name: str, where: str) -> int:
    attr = get_attribute(name)
    if attr is None:
        return ATTRIBUTES[name]
    if attr.type != onnx.AttributeProto.INT:
        raise InferenceError(f"{where}: {name} must be an INT attribute; got a "
                             f"{onnx.AttributeProto.AttributeType.Name(attr.type)} attribute")
    return attr.i


def _element_type(types: dict[int, int], where: str) -> int:
    """T (0 when nothing tells it) from the inputs' known element types; raises on a type outside the op's or
    two inputs that must share T and do not."""
    found, source = 0, ""
    for i, t in types.items():
        name = TensorProto.DataType.Name(t)
        may_be_uint8 = i in _WEIGHT_TYPE or i in _ZERO_POINT_TYPE
        if t == QUANTIZED_TYPE and may_be_uint8:
            continue
        if t not in ELEMENT_TYPES:
            allowed = [*_T_STRS, _UINT8_STR] if may_be_uint8 else _T_STRS
            raise InferenceError(f"{where}: {INPUTS[i]} has element type {name}; it must be one of {allowed}")
        if found and t != found:
            raise InferenceError(f"{where}: {INPUTS[i]} has element type {name} but {source} has "
                                 f"{TensorProto.DataType.Name(found)}; they must share T")
        if not found:
            found, source = t, INPUTS[i]
    return found


def _projection_form(proj, present: list[int], types: dict[int, int], where: str) -> bool | None:
    """True (quantized), False (dense) or None (unknown yet); raises when the inputs contradict the op's rules."""
    weight = INPUTS[proj.weight]
    t = types.get(proj.weight)
    quantized = None if t is None else t == QUANTIZED_TYPE
    has_scales = proj.scales in present
    if quantized is False:
        extra = [INPUTS[i] for i in (proj.scales, proj.zero_points) if i in present]
        if extra:
            raise InferenceError(f"{where}: {', '.join(extra)} given but {weight} is dense "
                                 f"({TensorProto.DataType.Name(t)}); scales and zero points go only with a uint8 "
                                 f"{weight}")
    if quantized and not has_scales:
        raise InferenceError(f"{where}: {weight} is uint8 (quantized) but {INPUTS[proj.scales]} is missing; "
                             f"a quantized weight needs its scales")
    if quantized is None and (has_scales or proj.zero_points in present):
        quantized = True
    return quantized


class _NBitsFacts(_Facts):
    """The dense op's facts plus the quantization's: k_blocks of a projection follow from its K."""

    def __init__(self, where: str, bits: int, block_size: int):
        super().__init__(where)
        self.bits, self.block_size = bits, block_size

    def k_blocks_from(self, proj, K_key: str) -> None:
        """k_blocks of proj as its K implies, checked against what B and the scales say."""
        K = self.get(K_key)
        seen = self.sizes.get(f"k_blocks of {proj.name}")
        if K is not None and seen is not None and seen[0] != _op_nbits.k_blocks(K, self.block_size):
            raise InferenceError(
                f"{self.where}: {seen[1]} = {seen[0]} but K = {proj.K} = {K} ({self.sizes[K_key][1]}) with "
                f"block_size {self.block_size} makes k_blocks = ceil(K / block_size) = "
                f"{_op_nbits.k_blocks(K, self.block_size)}")


def _quantized_dims(proj, shapes, types, facts: _NBitsFacts, N_key: str, where: str) -> None:
    """Records what a quantized projection's B, scales and zero points say about N and k_blocks."""
    kb_key = f"k_blocks of {proj.name}"
    B, scales, zp = (shapes.get(i) for i in (proj.weight, proj.scales, proj.zero_points))
    names = [INPUTS[i] for i in (proj.weight, proj.scales, proj.zero_points)]
    _check_rank(names[0], B, 3, f"uint8 (N, k_blocks, blob_size) with N = {proj.N}", where)
    _check_rank(names[1], scales, 2, f"(N, k_blocks) with N = {proj.N}", where)
    _check_rank(names[2], zp, 2, "(N, ceil(k_blocks*bits/8)) packed or (N, k_blocks) of T", where)
    blob = _op_nbits.blob_size(facts.bits, facts.block_size)
    if B is not None and _known(B[2]) and B[2] != blob:
        raise InferenceError(f"{where}: {names[0]}[2] = {B[2]} but blob_size = block_size * bits / 8 = "
                             f"{facts.block_size} * {facts.bits} / 8 = {blob}")
    for k, (key, d) in enumerate(zip((N_key, kb_key), B or ())):
        facts.agree(key, d, f"{names[0]}[{k}]")
    for k, (key, d) in enumerate(zip((N_key, kb_key), scales or ())):
        facts.agree(key, d, f"{names[1]}[{k}]")
    if zp is not None:
        facts.agree(N_key, zp[0], f"{names[2]}[0]")
        zp_type = types.get(proj.zero_points)
        kb = facts.get(kb_key)
        if zp_type is not None and zp_type != QUANTIZED_TYPE:
            facts.agree(kb_key, zp[1], f"{names[2]}[1] (zero points of T)")
        elif zp_type == QUANTIZED_TYPE and kb is not None and _known(zp[1]):
            cols = _op_nbits.packed_zero_point_cols(kb, facts.bits)
            if zp[1] != cols:
                raise InferenceError(
                    f"{where}: {names[2]}[1] = {zp[1]} but packed uint8 zero points of k_blocks = {kb} "
                    f"({facts.sizes[kb_key][1]}) with bits {facts.bits} have ceil(k_blocks*bits/8) = {cols} columns")


class Inferred(NamedTuple):
    """What inference found: T (0: unknown), C, the outputs' leading dims (None: unknown rank), H and C*H
    (a dim: int, symbol or None)."""

    elem_type: int
    num_branches: int
    leading: list[Dim] | None
    H: Dim
    width: Dim


def infer_dims(where: str, get_attribute, num_inputs: int, num_outputs: int, types: dict[int, int],
               shapes: dict[int, list[Dim] | None]) -> Inferred:
    """The op's rules on what is known of one node, shared by the schema and onnxruntime's symbolic handler:
    get_attribute(name) gives an AttributeProto or None; types and shapes are keyed by the positions of the
    present inputs (a type 0 or a shape None when unknown). Raises InferenceError naming `where` on a
    contradiction."""
    attr = get_attribute("num_branches")
    problem = node_form_problem(attr, 0, num_outputs)
    if not problem and num_inputs > len(INPUTS):
        problem = f"has {num_inputs} inputs; the op has at most {len(INPUTS)} ({', '.join(INPUTS)})"
    if problem:
        raise InferenceError(f"{where}: {problem}")
    bits, block_size = (_int_attribute(get_attribute, name, where) for name in ("bits", "block_size"))
    problem = _op_nbits.bits_problem(bits) or _op_nbits.block_size_problem(block_size)
    if problem:
        raise InferenceError(f"{where}: {problem}")
    c = attr.i

    present = sorted(shapes)
    check_present(where, present, _LAYOUT)
    types = {i: t for i, t in types.items() if t}
    elem_type = _element_type(types, where)
    forms = {proj: _projection_form(proj, present, types, where) for proj in PROJECTIONS}
    if all(form is False for form in forms.values()):
        raise InferenceError(f"{where}: down_inject_weight and up_weight are both dense; at least one must be "
                             f"quantized (uint8), a block with both dense is "
                             f"com.microsoft::HyperConnectionLowRankMix's")

    facts = _NBitsFacts(where, bits, block_size)
    facts.agree("C", c, "num_branches")
    streams_width(facts, shapes, _LAYOUT)
    agree_dims(facts, INPUTS[NORM_SCALE], shapes.get(NORM_SCALE), ("C*H",), "(C*H,)")

    if forms[DOWN_INJECT]:
        _quantized_dims(DOWN_INJECT, shapes, types, facts, "R+C", where)
    elif forms[DOWN_INJECT] is False:
        agree_dims(facts, INPUTS[DOWN_INJECT.weight], shapes.get(DOWN_INJECT.weight), ("C*H", "R+C"),
                   "(C*H, R+C) when dense")
    rc = facts.get("R+C")
    if rc is not None:
        if rc <= c:
            raise InferenceError(f"{where}: R+C = {rc} ({facts.sizes['R+C'][1]}) leaves no low rank: it must be "
                                 f"> num_branches = {c}")
        facts.agree("R", rc - c, f"{facts.sizes['R+C'][1]} - num_branches")
    if forms[UP]:
        _quantized_dims(UP, shapes, types, facts, "C*H", where)
    elif forms[UP] is False:
        agree_dims(facts, INPUTS[UP.weight], shapes.get(UP.weight), ("R", "C*H"), "(R, C*H) when dense")
    facts.k_blocks_from(DOWN_INJECT, "C*H")
    facts.k_blocks_from(UP, "R")

    leading, h, width = leading_dims(facts, c, shapes, _LAYOUT)
    return Inferred(elem_type, c, leading, h, width)


def _infer(ctx) -> None:
    """Type and shape inference: fill what the known facts imply, raise only on contradictions."""
    present = [i for i in range(ctx.get_num_inputs()) if ctx.has_input(i)]
    types = {i: tp.tensor_type.elem_type for i in present if (tp := ctx.get_input_type(i)) is not None}
    found = infer_dims(f"{OP_TYPE} ({ctx.get_display_name()})", ctx.get_attribute, ctx.get_num_inputs(),
                       ctx.get_num_outputs(), types, {i: _shape_of(ctx.get_input_type(i)) for i in present})
    set_outputs(ctx, found.elem_type, found.leading,
                {PRE_OUTPUT: found.H, POST_GATE: found.num_branches, STREAMS_OUT: found.width})
