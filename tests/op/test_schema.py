"""ONNX schema of HyperConnectionLowRankMix: registration and type/shape inference (hcfuse/schema.py)."""

from __future__ import annotations

import re

import onnx
import pytest
from onnx import TensorProto, helper
from onnx.shape_inference import InferenceError

from hcfuse._op import (
    ATTRIBUTES,
    DOMAIN,
    INPUTS,
    NUM_REQUIRED_INPUTS,
    OP_TYPE,
    OUTPUTS,
    PREV_BLOCK_OUTPUT,
    PREV_POST_GATE,
    SINCE_VERSION,
    STREAMS,
    attribute_defaults,
)
from hcfuse import _op
from hcfuse.shapes import schema as dense_schema
from hcfuse.shapes.schema import make_schema, register_schema
from tests.op._schema_support import (
    check_names,
    check_registration_round_trip,
    clean_registry_fixture,
    expect,
    infer_outputs,
)

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
C, H, R = 2, 8, 4
W = C * H
WEIGHTS = {"norm_scale": [W], "down_weight": [W, R], "up_weight": [R, W], "inject_weight": [W, C]}


clean_registry = clean_registry_fixture(dense_schema, _op)


def _node(n_outputs: int = 2, prologue: bool = False, **attrs) -> onnx.NodeProto:
    attrs.setdefault("num_branches", C)
    inputs = list(INPUTS[: 7 if prologue else 5])
    return helper.make_node(OP_TYPE, inputs, list(OUTPUTS[:n_outputs]), domain=DOMAIN, name="hc", **attrs)


def _types(streams, prologue=None, elem=F32, **overrides) -> dict[str, onnx.TypeProto]:
    """Input types: streams shape, optional (prev_block_output, prev_post_gate) shapes, weight overrides."""
    shapes = {"streams": streams, **WEIGHTS}
    if prologue is not None:
        shapes["prev_block_output"], shapes["prev_post_gate"] = prologue
    shapes.update(overrides)
    return {name: helper.make_tensor_type_proto(elem, shape) for name, shape in shapes.items()}


def _run_case(node: onnx.NodeProto, input_types: dict[str, onnx.TypeProto]) -> dict[str, onnx.TypeProto]:
    return infer_outputs(make_schema(), node, input_types)


# ---- schema and registration ------------------------------------------------------------------


def test_schema_matches_op_constants():
    schema = make_schema()
    check_names(schema, _op)
    assert (schema.min_input, schema.max_input, schema.min_output, schema.max_output) == (5, 7, 2, 3)
    assert schema.attributes["num_branches"].required
    defaults = {n: a.default_value.f for n, a in schema.attributes.items() if n != "num_branches"}
    assert defaults == pytest.approx(attribute_defaults())
    (constraint,) = schema.type_constraints
    assert sorted(constraint.allowed_type_strs) == ["tensor(bfloat16)", "tensor(float)", "tensor(float16)"]
    assert "Numerics contract" in schema.doc and "fp32" in schema.doc


def _described(schema) -> dict[str, str]:
    """Description of every input, output and attribute, by name."""
    described = {p.name: p.description for p in (*schema.inputs, *schema.outputs)}
    return {**described, **{name: a.description for name, a in schema.attributes.items()}}


def test_every_input_output_and_attribute_is_described():
    described = _described(make_schema())
    assert set(described) == {*INPUTS, *OUTPUTS, *ATTRIBUTES}
    assert not [name for name, text in described.items() if not text.strip()], "described with nothing"
    assert "Must not be zero" in described["gate_div"]


def _shapes(text: str) -> list[str]:
    """The shapes a description gives, spaces dropped: "(..., C * H)" -> "(...,C*H)"."""
    return re.findall(r"\((?:\.\.\.|[CHR*]+)(?:,(?:\.\.\.|[CHR*]+))*\)", text.replace(" ", ""))


def test_inputs_and_outputs_have_the_shapes_onnxruntime_states():
    """onnxruntime's own schema of the op (1.32 ships it) gives every input and output the same shape."""
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

    theirs = next((s for s in get_all_operator_schema() if (s.name, s.domain) == (OP_TYPE, DOMAIN)), None)
    if theirs is None:
        pytest.skip("this onnxruntime ships no schema of the op")
    ours = make_schema()
    their_text = {p.name: p.description for p in (*theirs.inputs, *theirs.outputs)}
    for p in (*ours.inputs, *ours.outputs):
        assert _shapes(p.description) == _shapes(their_text[p.name]), (
            f"{p.name}: ours {p.description!r}, onnxruntime's {their_text[p.name]!r}")
    assert any(_shapes(p.description) for p in ours.inputs), "no shape found: the pattern reads nothing"


def test_register_is_idempotent_and_deregister_undoes_it():
    check_registration_round_trip(dense_schema, _op)


def test_register_keeps_a_schema_onnx_already_knows():
    foreign = onnx.defs.OpSchema(
        OP_TYPE, DOMAIN, SINCE_VERSION, "known before hcfuse",
        inputs=[onnx.defs.OpSchema.FormalParameter("x", "tensor(float)")],
        outputs=[onnx.defs.OpSchema.FormalParameter("y", "tensor(float)")],
    )  # fmt: skip
    onnx.defs.register_schema(foreign)
    assert register_schema() is False
    assert onnx.defs.get_schema(OP_TYPE, SINCE_VERSION, DOMAIN).doc == "known before hcfuse"


# ---- inference tables -----------------------------------------------------------------------


@pytest.mark.parametrize("elem", [F32, F16, BF16], ids=["float", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "streams, prologue, n_out, expected",
    [
        ([3, W], None, 2, ([3, H], [3, C])),
        ([3, W], None, 3, ([3, H], [3, C], [3, W])),
        ([2, 5, W], ([2, 5, H], [2, 5, C]), 3, ([2, 5, H], [2, 5, C], [2, 5, W])),
        ([W], None, 3, ([H], [C], [W])),
        ([0, W], None, 3, ([0, H], [0, C], [0, W])),
        ([0, 7, W], ([0, 7, H], [0, 7, C]), 2, ([0, 7, H], [0, 7, C])),
        (["batch", W], None, 2, (["batch", H], ["batch", C])),
        (["batch", "seq", W], (["batch", "seq", H], ["batch", "seq", C]), 3,
         (["batch", "seq", H], ["batch", "seq", C], ["batch", "seq", W])),
        # symbols in streams filled by values known from the prologue inputs (no broadcasting)
        (["batch", W], ([4, H], ["b2", C]), 2, ([4, H], [4, C])),
        # unknown dims stay unknown
        ([None, W], None, 3, ([None, H], [None, C], [None, W])),
        # unknown rank: element type only, unless the prologue gives the leading dims
        (None, None, 3, (None, None, None)),
        (None, (["b", H], ["b", C]), 3, (["b", H], ["b", C], ["b", W])),
    ],
)  # fmt: skip
def test_infers_shapes_and_type(elem, streams, prologue, n_out, expected):
    got = _run_case(_node(n_out, prologue is not None), _types(streams, prologue, elem))
    assert got == expect(elem, *expected)


def test_symbolic_width_takes_h_from_the_weights():
    got = _run_case(_node(3), _types(["batch", "w"]))
    assert got == expect(F32, ["batch", H], ["batch", C], ["batch", W])


def test_symbolic_width_and_weights_leave_h_unknown():
    unknown = {name: [f"{name}_{k}" for k in range(len(s))] for name, s in WEIGHTS.items()}
    got = _run_case(_node(3), _types(["batch", "w"], **unknown))
    assert got == expect(F32, ["batch", None], ["batch", C], ["batch", "w"])


def test_width_known_only_from_prev_block_output():
    unknown = dict.fromkeys(WEIGHTS)
    got = _run_case(_node(3, prologue=True), _types(["b", "w"], (["b", H], ["b", "c"]), **unknown))
    assert got == expect(F32, ["b", H], ["b", C], ["b", W])


def test_shapeless_weights_and_omitted_optional_output():
    node = helper.make_node(OP_TYPE, [*INPUTS[:5], "", ""], [*OUTPUTS[:2], ""], domain=DOMAIN, num_branches=C)
    got = _run_case(node, _types([3, W], **dict.fromkeys(WEIGHTS)))
    assert got == expect(F32, [3, H], [3, C])


# ---- contradictions -------------------------------------------------------------------------

_NEGATIVES = [
    ("num_branches_zero", dict(attrs={"num_branches": 0}), r"num_branches must be > 0; got 0"),
    ("num_branches_negative", dict(attrs={"num_branches": -2}), r"num_branches must be > 0; got -2"),
    ("width_not_divisible", dict(streams=[3, 15], weights=dict.fromkeys(WEIGHTS)),
     r"C\*H = 15 \(streams\[-1\]\) is not divisible by num_branches = 2"),
    ("norm_scale_width", dict(weights={"norm_scale": [12]}), r"norm_scale\[0\] = 12 but streams\[-1\] = 16"),
    ("norm_scale_rank", dict(weights={"norm_scale": [C, H]}), r"norm_scale must be \(C\*H,\); got rank 2 shape \(2, 8\)"),
    ("down_width", dict(weights={"down_weight": [10, R]}), r"down_weight\[0\] = 10 but streams\[-1\] = 16"),
    ("down_rank", dict(weights={"down_weight": [W, R, 1]}), r"down_weight must be \(C\*H, R\); got rank 3 shape \(16, 4, 1\)"),
    ("up_rank_mismatch", dict(weights={"up_weight": [R + 1, W]}), r"up_weight\[0\] = 5 but down_weight\[1\] = 4; both must be R"),
    ("up_width", dict(weights={"up_weight": [R, 2 * W]}), r"up_weight\[1\] = 32 but streams\[-1\] = 16"),
    ("inject_branches", dict(weights={"inject_weight": [W, 3]}), r"inject_weight\[1\] = 3 but num_branches = 2; both must be C"),
    ("weights_disagree_without_streams_width", dict(streams=["b", "w"], weights={"norm_scale": [12]}),
     r"down_weight\[0\] = 16 but norm_scale\[0\] = 12"),
    ("prev_block_output_width", dict(prologue=([3, H + 1], [3, C])), r"prev_block_output\[-1\] = 9 but .* = 8; both must be H"),
    ("prev_post_gate_width", dict(prologue=([3, H], [3, 3])), r"prev_post_gate\[-1\] = 3 but num_branches = 2"),
    ("prologue_leading_value", dict(prologue=([4, H], [3, C])),
     r"prev_block_output leading dim 0 is 4 but streams has 3 there"),
    ("prologue_leading_rank", dict(prologue=([1, 3, H], [3, C])),
     r"prev_block_output has 2 leading dims \(1, 3\) but streams has 1 \(3,\)"),
    ("streams_scalar", dict(streams=[]), r"streams must be \(\.\.\., C\*H\) with rank >= 1; got a scalar"),
    ("elem_types_differ", dict(elem_override={"down_weight": F16}),
     r"down_weight has element type FLOAT16 but streams has FLOAT"),
    ("elem_type_not_allowed", dict(elem=TensorProto.DOUBLE), r"streams has element type DOUBLE; T must be one of"),
]  # fmt: skip


@pytest.mark.parametrize("case, match", [(c, m) for _, c, m in _NEGATIVES], ids=[n for n, _, _ in _NEGATIVES])
def test_contradictions_raise(case, match):
    node = _node(3, prologue="prologue" in case, **case.get("attrs", {}))
    types = _types(case.get("streams", [3, W]), case.get("prologue"), case.get("elem", F32), **case.get("weights", {}))
    for name, elem in case.get("elem_override", {}).items():
        types[name].tensor_type.elem_type = elem
    with pytest.raises(InferenceError, match=match):
        _run_case(node, types)


@pytest.mark.parametrize("given, missing", [(5, 6), (6, 5)])
def test_half_a_prologue_pair_raises(given, missing):
    inputs = [*INPUTS[:5], "", ""]
    inputs[given] = INPUTS[given]
    node = helper.make_node(OP_TYPE, inputs, list(OUTPUTS[:2]), domain=DOMAIN, num_branches=C)
    types = _types([3, W], ([3, H], [3, C]))
    del types[INPUTS[missing]]
    match = rf"{INPUTS[given]} is given without {INPUTS[missing]}; the prologue inputs come as a pair"
    with pytest.raises(InferenceError, match=match):
        _run_case(node, types)


@pytest.mark.parametrize("missing", range(NUM_REQUIRED_INPUTS))
def test_missing_required_input_raises(missing):
    # infer_node_outputs validates the node first; a model's inference calls _infer as it is
    register_schema()
    model = _model(prologue=False)
    model.graph.node[1].input[missing] = ""
    with pytest.raises(InferenceError, match=rf"required input\(s\) {INPUTS[missing]} missing"):
        onnx.shape_inference.infer_shapes(model)


def test_error_names_the_node():
    with pytest.raises(InferenceError, match=rf"{OP_TYPE} \(node {OP_TYPE}\[{DOMAIN}\] \(hc\)\): num_branches"):
        _run_case(_node(2, num_branches=0), _types([3, W]))


# ---- whole models -----------------------------------------------------------------------------


def _model(elem=F32, prologue=True, streams=("batch", "seq", W)) -> onnx.ModelProto:
    """Relu -> fused node (three outputs) -> Identity, weights as initializers."""
    lead = list(streams[:-1])
    inputs = [helper.make_tensor_value_info("x", elem, list(streams))]
    if prologue:
        inputs += [helper.make_tensor_value_info(INPUTS[PREV_BLOCK_OUTPUT], elem, [*lead, H]),
                   helper.make_tensor_value_info(INPUTS[PREV_POST_GATE], elem, [*lead, C])]  # fmt: skip
    inits = [helper.make_tensor(n, elem, s, [0.0] * (s[0] * (s[1] if len(s) > 1 else 1))) for n, s in WEIGHTS.items()]
    nodes = [
        helper.make_node("Relu", ["x"], [INPUTS[STREAMS]]),
        helper.make_node(OP_TYPE, list(INPUTS[: 7 if prologue else 5]), list(OUTPUTS), domain=DOMAIN,
                         num_branches=C, epsilon=1e-6, gate_div=4.0),
        helper.make_node("Identity", [OUTPUTS[0]], ["y"]),
    ]  # fmt: skip
    outputs = [helper.make_tensor_value_info(n, elem, [None] * len(streams)) for n in ("y", *OUTPUTS[1:])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, SINCE_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _output_shapes(model: onnx.ModelProto) -> dict[str, list]:
    values = [*model.graph.value_info, *model.graph.output]
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


def test_inference_knows_the_op_only_after_registration():
    model = _model()
    before = _output_shapes(onnx.shape_inference.infer_shapes(model, strict_mode=True))
    assert "pre_output" not in before and before["post_gate"] == [0, 0, 0]  # onnx skips an unknown op
    register_schema()
    after = _output_shapes(onnx.shape_inference.infer_shapes(model, strict_mode=True))
    assert after["pre_output"] == after["y"] == ["batch", "seq", H]
    assert after["post_gate"] == ["batch", "seq", C]
    assert after["streams_out"] == ["batch", "seq", W]


def test_element_type_from_weights_when_streams_is_untyped():
    register_schema()
    model = _model(F16, prologue=False)
    model.graph.node[0].CopyFrom(helper.make_node("Opaque", ["x"], [INPUTS[STREAMS]], domain="example.opaque"))
    model.opset_import.append(helper.make_opsetid("example.opaque", 1))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    assert types["pre_output"] == helper.make_tensor_type_proto(F16, None).tensor_type
    assert types["post_gate"].elem_type == F16


def test_missing_num_branches_raises():
    register_schema()
    model = _model()
    fused = model.graph.node[1]
    kept = [a for a in fused.attribute if a.name != "num_branches"]
    del fused.attribute[:]
    fused.attribute.extend(kept)
    with pytest.raises(InferenceError, match=r"required attribute num_branches is missing"):
        onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("elem", [F32, F16, BF16], ids=["float", "float16", "bfloat16"])
@pytest.mark.parametrize("prologue", [True, False], ids=["prologue", "no_prologue"])
def test_check_model_full_check(elem, prologue):
    register_schema()
    onnx.checker.check_model(_model(elem, prologue), full_check=True, check_custom_domain=True)


def test_check_model_rejects_a_contradiction():
    register_schema()
    model = _model()
    model.graph.initializer[1].CopyFrom(helper.make_tensor("down_weight", F32, [W + 2, R], [0.0] * (W + 2) * R))
    with pytest.raises(InferenceError, match=r"down_weight\[0\] = 18 but streams\[-1\] = 16"):
        onnx.checker.check_model(model, full_check=True)
