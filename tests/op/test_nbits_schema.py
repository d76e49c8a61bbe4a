"""ONNX schema of HyperConnectionLowRankMixNBits: registration, type and shape inference
(hcfuse/shapes/nbits_schema.py), on single nodes and on real models in strict mode."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.shape_inference import InferenceError

from hcfuse import _op_nbits
from hcfuse._op_nbits import DOMAIN, INPUTS, OP_TYPE, OUTPUTS, SINCE_VERSION, attribute_defaults
from hcfuse.models.nbits import make_nbits_node_model, random_nbits_weights
from hcfuse.shapes import nbits_schema
from hcfuse.shapes.nbits_schema import make_schema, register_schema
from tests.op._schema_support import (
    check_names,
    check_registration_round_trip,
    clean_registry_fixture,
    expect,
    infer_outputs,
)

F32, F16, BF16, U8 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.UINT8
C, H, R, BS = 2, 16, 8, 16
W = C * H
# quantized shapes with bits 4, block_size 16: down_inject K = 32 -> 2 blocks, up K = 8 -> 1 block, blob 8
QUANTIZED = {
    "down_inject_weight": (U8, [R + C, 2, 8]), "down_inject_scales": (None, [R + C, 2]),
    "up_weight": (U8, [W, 1, 8]), "up_scales": (None, [W, 1]),
}
DENSE = {"down_inject_weight": (None, [W, R + C]), "up_weight": (None, [R, W])}


clean_registry = clean_registry_fixture(nbits_schema, _op_nbits)


def _inputs(quantized=("down_inject", "up"), streams=("b", "s", W), prologue=False, elem=F16, **overrides):
    """(node input names, input types): overrides map an input name to (elem or None for T, shape) or None."""
    spec = {"streams": (None, list(streams)), "norm_scale": (None, [W])}
    for proj in ("down_inject", "up"):
        table = QUANTIZED if proj in quantized else DENSE
        spec.update({k: v for k, v in table.items() if k.startswith(proj)})
    if prologue:
        lead = list(streams[:-1])
        spec["prev_block_output"], spec["prev_post_gate"] = (None, [*lead, H]), (None, [*lead, C])
    spec.update(overrides)
    spec = {k: v for k, v in spec.items() if v is not None}
    names = [n if n in spec else "" for n in INPUTS]
    while not names[-1]:
        names.pop()
    types = {n: helper.make_tensor_type_proto(e or elem, s) for n, (e, s) in spec.items()}
    return names, types


def _node(names, n_outputs=2, **attrs) -> onnx.NodeProto:
    attrs = {"num_branches": C, "block_size": BS, **attrs}
    return helper.make_node(OP_TYPE, names, list(OUTPUTS[:n_outputs]), domain=DOMAIN, name="hcq", **attrs)


def _infer(names, types, n_outputs=2, **attrs) -> dict[str, onnx.TypeProto]:
    return infer_outputs(make_schema(), _node(names, n_outputs, **attrs), types)


# ---- schema and registration ------------------------------------------------------------------


def test_schema_matches_op_constants():
    schema = make_schema()
    check_names(schema, _op_nbits)
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    assert [i for i, p in enumerate(schema.inputs) if p.option == single] == list(_op_nbits.REQUIRED_INPUTS)
    defaults = {n: helper.get_attribute_value(a.default_value) for n, a in schema.attributes.items()
                if a.default_value.name}
    assert defaults == pytest.approx(attribute_defaults())
    assert schema.attributes["num_branches"].required
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    t = {"tensor(float)", "tensor(float16)", "tensor(bfloat16)"}
    assert constraints == {"T": t, "TD": t | {"tensor(uint8)"}, "TU": t | {"tensor(uint8)"},
                           "TZD": t | {"tensor(uint8)"}, "TZU": t | {"tensor(uint8)"}}


def test_register_is_idempotent_and_deregister_undoes_it():
    check_registration_round_trip(nbits_schema, _op_nbits)


def test_import_hcfuse_registers_both_ops():
    import hcfuse
    from hcfuse import _op

    hcfuse.register_nbits_schema()
    assert onnx.defs.has(OP_TYPE, SINCE_VERSION, DOMAIN)
    assert onnx.defs.has(_op.OP_TYPE, _op.SINCE_VERSION, _op.DOMAIN)


# ---- single-node inference ----------------------------------------------------------------------


@pytest.mark.parametrize("elem", [F32, F16, BF16])
@pytest.mark.parametrize("quantized", [("down_inject", "up"), ("down_inject",), ("up",)], ids="+".join)
@pytest.mark.parametrize("prologue", [False, True])
def test_infers_shapes_and_type(elem, quantized, prologue):
    names, types = _inputs(quantized, prologue=prologue, elem=elem)
    assert _infer(names, types, 3) == expect(elem, ["b", "s", H], ["b", "s", C], ["b", "s", W])


@pytest.mark.parametrize("zp", [(U8, [R + C, 1]), (None, [R + C, 2])], ids=["packed", "T"])
def test_zero_point_forms(zp):
    names, types = _inputs(streams=(0, W), down_inject_zero_points=zp, up_zero_points=(U8, [W, 1]))
    assert _infer(names, types) == expect(F16, [0, H], [0, C])


@pytest.mark.parametrize("bits,block_size", [(8, 16), (4, 32), (8, 64)])
def test_bits_and_block_size_set_blob_and_blocks(bits, block_size):
    kb = _op_nbits.k_blocks(W, block_size)
    blob = _op_nbits.blob_size(bits, block_size)
    names, types = _inputs(("down_inject",), streams=(3, W),
                           down_inject_weight=(U8, [R + C, kb, blob]), down_inject_scales=(None, [R + C, kb]),
                           down_inject_zero_points=(U8, [R + C, _op_nbits.packed_zero_point_cols(kb, bits)]))
    assert _infer(names, types, bits=bits, block_size=block_size) == expect(F16, [3, H], [3, C])


def test_partial_information_fills_what_it_can():
    """Untyped or shapeless weights, symbolic dims of B: no error, outputs as far as known."""
    names, types = _inputs(streams=("n", "w"), norm_scale=(None, None), down_inject_weight=(U8, ["rc", "kb", 8]),
                           up_weight=(U8, None), up_scales=(None, None))
    assert _infer(names, types, 3) == expect(F16, ["n", None], ["n", C], ["n", "w"])


def _bad(match, quantized=("down_inject", "up"), attrs=None, **overrides):
    return pytest.param(quantized, overrides, attrs or {}, match, id=match[:40])


@pytest.mark.parametrize("quantized,overrides,attrs,match", [
    _bad("down_inject_weight is uint8 .quantized. but down_inject_scales is missing", down_inject_scales=None),
    _bad("up_scales given but up_weight is dense .FLOAT16.", quantized=("down_inject",), up_scales=(None, [W, 1])),
    _bad("down_inject_weight and up_weight are both dense", quantized=()),
    _bad(r"down_inject_weight\[2\] = 16 but blob_size = block_size \* bits / 8 = 16 \* 4 / 8 = 8",
         down_inject_weight=(U8, [R + C, 2, 16])),
    _bad(r"down_inject_weight\[1\] = 3 but K = C\*H = 32 .streams\[-1\]. with block_size 16 makes k_blocks = "
         r"ceil\(K / block_size\) = 2", down_inject_weight=(U8, [R + C, 3, 8]), down_inject_scales=(None, [R + C, 3])),
    _bad(r"down_inject_scales\[1\] = 3 but down_inject_weight\[1\] = 2", down_inject_scales=(None, [R + C, 3])),
    _bad(r"down_inject_scales\[0\] = 9 but down_inject_weight\[0\] = 10", down_inject_scales=(None, [9, 2])),
    _bad(r"up_weight\[0\] = 30 but streams\[-1\] = 32", up_weight=(U8, [30, 1, 8])),
    _bad(r"down_inject_zero_points\[1\] = 2 but packed uint8 zero points of k_blocks = 2",
         down_inject_zero_points=(U8, [R + C, 2])),
    _bad(r"up_zero_points\[1\] \(zero points of T\) = 2 but up_weight\[1\] = 1", up_zero_points=(None, [W, 2])),
    _bad(r"up_weight\[1\] = 1 but K = R = 20 .* k_blocks = ceil\(K / block_size\) = 2",
         down_inject_weight=(U8, [20 + C, 2, 8]), down_inject_scales=(None, [20 + C, 2])),
    _bad(r"up_weight\[0\] = 9 but down_inject_weight\[0\] - num_branches = 8; both must be R",
         quantized=("down_inject",), up_weight=(None, [9, W])),
    _bad(r"R\+C = 2 .down_inject_weight\[0\]. leaves no low rank", down_inject_weight=(U8, [C, 2, 8]),
         down_inject_scales=(None, [C, 2])),
    _bad(r"down_inject_weight has element type INT8; it must be one of", down_inject_weight=(TensorProto.INT8, None)),
    _bad(r"norm_scale has element type UINT8; it must be one of", norm_scale=(U8, [W])),
    _bad("up_scales has element type FLOAT but streams has FLOAT16; they must share T", up_scales=(F32, [W, 1])),
    _bad(r"down_inject_weight must be uint8 \(N, k_blocks, blob_size\) with N = R\+C; got rank 2",
         down_inject_weight=(U8, [R + C, 16])),
    _bad("bits must be one of 4, 8; got 2", attrs={"bits": 2}),
    _bad("block_size must be a power of two >= 16; got 48", attrs={"block_size": 48}),
    _bad("prev_block_output is given without prev_post_gate", prev_block_output=(None, ["b", "s", H])),
    _bad(r"width C\*H = 33 .streams\[-1\]. is not divisible by num_branches = 2", streams=(5, 33),
         norm_scale=None, up_weight=(U8, [33, 1, 8]), up_scales=(None, [33, 1]),
         down_inject_weight=(U8, [R + C, 3, 8]), down_inject_scales=(None, [R + C, 3])),
])
def test_contradictions_raise_naming_the_node(quantized, overrides, attrs, match):
    names, types = _inputs(quantized, **overrides)
    if "norm_scale" not in types and "norm_scale" in overrides:
        names[1], types["norm_scale"] = "norm_scale", helper.make_tensor_type_proto(F16, None)
    with pytest.raises(InferenceError, match=rf"{OP_TYPE} \(.*\(hcq\)\): {match}"):
        _infer(names, types, **attrs)


@pytest.mark.parametrize("change,match", [
    (lambda names, attrs: (names[:5] + ["", "up_scales"], attrs), "input 5 is marked single but has an empty string"),
    (lambda names, attrs: (names, {k: v for k, v in attrs.items() if k != "num_branches"}),
     "Required attribute 'num_branches' is missing"),
    (lambda names, attrs: ([*names, *[""] * (10 - len(names)), "streams"], attrs), "has input size 11 not in range"),
])
def test_onnx_checks_the_node_form_from_the_schema(change, match):
    """Required inputs, the required attribute and the input count are the schema's declarations."""
    names, types = _inputs()
    names, attrs = change(names, {"num_branches": C, "block_size": BS})
    node = helper.make_node(OP_TYPE, names, list(OUTPUTS[:2]), domain=DOMAIN, name="hcq", **attrs)
    with pytest.raises(onnx.checker.ValidationError, match=match):
        onnx.shape_inference.infer_node_outputs(make_schema(), node, types)


# ---- real models, strict mode --------------------------------------------------------------------


def _model(quantized=("down_inject", "up"), zp_form=None, prologue=True, dtype=np.float16, bits=4, block_size=16,
           **attrs) -> onnx.ModelProto:
    weights = random_nbits_weights(C, H, R, dtype, np.random.default_rng(0), quantized, bits, block_size,
                                   symmetric=zp_form is None, zp_form=zp_form)
    return make_nbits_node_model(weights, C=C, dtype=dtype, leading_dims=("batch", "seq"), prologue=prologue,
                                 streams_out=True, bits=bits, block_size=block_size, **attrs)


def _rank_only_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    for vi in model.graph.output:  # rank only: the dims must come from inference
        for d in vi.type.tensor_type.shape.dim:
            d.Clear()
    return model


def _strict(model: onnx.ModelProto) -> dict[str, list]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, check_type=True, data_prop=True)
    return {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in (*inferred.graph.value_info, *inferred.graph.output)}


def test_inference_knows_the_op_only_after_registration():
    model = _rank_only_outputs(_model())
    assert _strict(model)["pre_output"] == [0, 0, 0]  # onnx skips an unknown op
    register_schema()
    assert _strict(model)["pre_output"] == ["batch", "seq", H]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("quantized", [("down_inject", "up"), ("down_inject",), ("up",)], ids="+".join)
@pytest.mark.parametrize("zp_form", [None, "packed", "T"])
@pytest.mark.parametrize("bits,block_size", [(4, 16), (8, 32)])
def test_check_model_full_check(dtype, quantized, zp_form, bits, block_size):
    register_schema()
    model = _rank_only_outputs(_model(quantized, zp_form, dtype=dtype, bits=bits, block_size=block_size))
    onnx.checker.check_model(model, full_check=True)
    shapes = _strict(model)
    assert (shapes["pre_output"], shapes["post_gate"], shapes["streams_out"]) == (
        ["batch", "seq", H], ["batch", "seq", C], ["batch", "seq", W])


def test_strict_inference_rejects_a_model_with_wrong_attributes():
    register_schema()
    model = _model(block_size=16)
    attr = next(a for a in model.graph.node[0].attribute if a.name == "block_size")
    attr.i = 32  # the initializers were quantized with 16
    with pytest.raises(InferenceError, match=rf"{OP_TYPE} \(.*\(hc_lowrank_mix_nbits\)\): "
                                             r"down_inject_weight\[2\] = 8 but blob_size = block_size \* bits / 8 = "
                                             r"32 \* 4 / 8 = 16"):
        _strict(model)
    with pytest.raises(InferenceError, match="blob_size"):
        onnx.checker.check_model(model, full_check=True)
