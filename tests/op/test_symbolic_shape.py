"""HyperConnectionLowRankMix in ONNX Runtime's symbolic shape inference (hcfuse/ort_symbolic_shape.py)."""

from __future__ import annotations

import os

import onnx
import pytest
from onnx import TensorProto, helper
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

import hcfuse
from hcfuse import _op_nbits
from hcfuse._op import BRANCH_NORM, DOMAIN, OP_TYPE, POST_MIX, PRE_MIX, PREV_POST_GATE, SCALED_SILU, WEIGHT_INPUTS
from hcfuse.shapes.ort_symbolic_shape import (
    HcSymbolicShapeInference,
    IncompleteShapeInferenceError,
    infer_hc_lowrank_mix,
    infer_hc_lowrank_mix_nbits,
    register_with_ort,
)
from hcfuse.shapes.schema import deregister_schema, register_schema

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
DTYPES = pytest.mark.parametrize("elem", [F32, F16, BF16], ids=["float", "float16", "bfloat16"])
# onnxruntime 1.32 ships a handler (and a schema) for the op; 1.31 does not
ORT_SHIPS_HANDLER = hasattr(SymbolicShapeInference, f"_infer_{OP_TYPE}")
OPAQUE = "example.opaque"  # a domain nobody knows: its ops get no inference at all


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """ORT's tool dumps sym_shape_infer_temp.onnx into the cwd on failure: keep that in tmp_path."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---- small local builder ----------------------------------------------------------------------


def _weights(elem, c, h, r, *, as_inputs=False, width=None):
    """The four weights plus the sublayer weight (h, h): initializers, or graph inputs (width may be a symbol)."""
    w = width if width is not None else c * h
    shapes = {"norm_scale": [w], "down_weight": [w, r], "up_weight": [r, w], "inject_weight": [w, c], "w_sub": [h, h]}
    if as_inputs:
        return [helper.make_tensor_value_info(n, elem, s) for n, s in shapes.items()], []
    return [], [helper.make_tensor(n, elem, s, [0.5] * (s[0] * (s[1] if len(s) > 1 else 1))) for n, s in shapes.items()]


def _fused(k, streams, c, prev=None, outputs=3, **attrs):
    """Fused node of block k: pre{k}, gate{k}, S{k} (fewer or "" entries for omitted outputs)."""
    outs = [f"pre{k}", f"gate{k}", f"S{k}"][:outputs] if isinstance(outputs, int) else outputs
    return helper.make_node(OP_TYPE, [streams, *WEIGHT_INPUTS, *(prev or ())], outs, domain=DOMAIN,
                            name=f"hc{k}", num_branches=c, **attrs)  # fmt: skip


def _model(nodes, inputs, outputs, inits=(), opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs], inits)
    imports = [helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1), *(helper.make_opsetid(d, 1) for d in opsets)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _one_node(lead=("batch",), *, c=2, h=8, r=4, elem=F32, prologue=False, outputs=3, width=None, **attrs):
    """streams (*lead, C*H) -> fused node; weights are initializers unless the width is symbolic."""
    w = width if width is not None else c * h
    weight_inputs, inits = _weights(elem, c, h, r, as_inputs=width is not None, width=width)
    inputs = [helper.make_tensor_value_info("streams", elem, [*lead, w]), *weight_inputs[:4]]
    prev = None
    if prologue:
        prev = ["prev_out", "prev_gate"]
        inputs += [helper.make_tensor_value_info("prev_out", elem, [*lead, h]),
                   helper.make_tensor_value_info("prev_gate", elem, [*lead, c])]  # fmt: skip
    node = _fused(0, "streams", c, prev, outputs, **attrs)
    return _model([node], inputs, [o for o in node.output if o], inits[:4])


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, list]]:
    """name -> (element type, dims as int/str/None) for every value_info and graph output."""
    out = {}
    for v in [*model.graph.value_info, *model.graph.output]:
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in v.type.tensor_type.shape.dim]
        out[v.name] = (v.type.tensor_type.elem_type, dims if v.type.tensor_type.HasField("shape") else None)
    return out


def _assert_fully_inferred(model: onnx.ModelProto) -> None:
    produced = {o for n in model.graph.node for o in n.output if o}
    shapes = _shapes(model)
    missing = sorted(produced - set(shapes))
    assert not missing, f"no value_info for {missing[:5]}"
    partial = {n: s for n, s in shapes.items() if not s[0] or s[1] is None or None in s[1]}
    assert not partial, f"{len(partial)} values not fully inferred, e.g. {list(partial.items())[:3]}"


# ---- a fused node beside a stock PreMix ------------------------------------------------------------


@pytest.mark.parametrize("outputs", [2, 3], ids=["two_outputs", "three_outputs"])
def test_fused_node_beside_a_stock_premix(outputs, in_tmp_path):
    model = _one_node(("batch",), c=2, h=8, r=8, outputs=outputs)
    model.graph.node.append(helper.make_node(PRE_MIX, ["streams", "streams"], ["premix"], domain=DOMAIN, num_branches=2))
    model.graph.output.append(helper.make_empty_tensor_value_info("premix"))
    if not ORT_SHIPS_HANDLER:  # onnxruntime 1.31: the stock tool alone fails on the op, as reported
        deregister_schema()
        try:
            with pytest.raises(Exception, match="Incomplete symbolic shape inference"):
                SymbolicShapeInference.infer_shapes(model, auto_merge=True)
            assert (in_tmp_path / "sym_shape_infer_temp.onnx").exists()  # the stock tool's dump
            (in_tmp_path / "sym_shape_infer_temp.onnx").unlink()
        finally:
            register_schema()
    shapes = _shapes(hcfuse.infer_shapes(model, auto_merge=True))
    assert shapes["premix"] == (F32, ["batch", 8])
    assert shapes["pre0"] == (F32, ["batch", 8])
    assert shapes["gate0"] == (F32, ["batch", 2])
    if outputs == 3:
        assert shapes["S0"] == (F32, ["batch", 16])
    assert os.listdir(in_tmp_path) == []


def test_callers_model_is_not_modified():
    model = _one_node()
    before = model.SerializeToString()
    hcfuse.infer_shapes(model)
    assert model.SerializeToString() == before


def test_accepts_a_path(in_tmp_path):
    onnx.save(_one_node(), "m.onnx")
    assert _shapes(hcfuse.infer_shapes("m.onnx"))["pre0"] == (F32, ["batch", 8])


# ---- leading dims, width, prologue, types -------------------------------------------------------


@DTYPES
@pytest.mark.parametrize("prologue", [False, True], ids=["no_prologue", "prologue"])
@pytest.mark.parametrize("lead", [("batch",), ("batch", "seq"), (3,), (0, 5), ()], ids=["b", "b_s", "3", "0x5", "none"])
def test_leading_dims_prologue_and_types(lead, prologue, elem):
    shapes = _shapes(hcfuse.infer_shapes(_one_node(lead, c=4, h=16, r=8, elem=elem, prologue=prologue)))
    assert shapes["pre0"] == (elem, [*lead, 16])
    assert shapes["gate0"] == (elem, [*lead, 4])
    assert shapes["S0"] == (elem, [*lead, 64])


def test_expression_leading_dim_from_a_value_ints_constant():
    """Reshape by a Constant(value_ints) makes the leading dim the expression batch*seq."""
    model = _one_node(("rows",))
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", F32, ["batch", "seq", 16]))
    model.graph.node.insert(0, helper.make_node("Constant", [], ["shape"], value_ints=[-1, 16]))
    model.graph.node.insert(1, helper.make_node("Reshape", ["x", "shape"], ["streams"]))
    shapes = _shapes(hcfuse.infer_shapes(model))
    assert shapes["streams"] == (F32, ["batch*seq", 16])
    assert shapes["pre0"] == (F32, ["batch*seq", 8])
    assert shapes["S0"] == (F32, ["batch*seq", 16])


def test_value_float_constant_no_longer_crashes_the_tool():
    model = _one_node(("batch",))
    model.graph.input[0].name = "x"
    model.graph.node.insert(0, helper.make_node("Constant", [], ["half"], value_float=0.5))
    model.graph.node.insert(1, helper.make_node("Mul", ["x", "half"], ["streams"]))
    before = model.SerializeToString()
    with pytest.raises(Exception):  # noqa: B017  ORT 1.31's _infer_Constant reads only `value`
        SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    inferred = hcfuse.infer_shapes(model)
    assert _shapes(inferred)["pre0"] == (F32, ["batch", 8])
    constant = inferred.graph.node[0]
    assert [a.name for a in constant.attribute] == ["value"]
    assert onnx.numpy_helper.to_array(constant.attribute[0].t) == pytest.approx(0.5)
    assert model.SerializeToString() == before


@pytest.mark.parametrize(
    "attr, value, expected",
    [
        ("value_floats", [1.0, 2.0], [1.0, 2.0]),
        ("value_int", 7, 7),
        ("value_strings", [b"a", b"b"], ["a", "b"]),
        ("sparse_value", helper.make_sparse_tensor(helper.make_tensor("v", F32, [2], [5.0, 7.0]),
                                                   helper.make_tensor("i", TensorProto.INT64, [2], [1, 3]), [4]),
         [0.0, 5.0, 0.0, 7.0]),
    ],
)  # fmt: skip
def test_other_scalar_constant_forms_become_value_tensors(attr, value, expected):
    model = _one_node()
    model.graph.node.append(helper.make_node("Constant", [], ["k"], **{attr: value}))
    model.graph.output.append(helper.make_empty_tensor_value_info("k"))
    constant = hcfuse.infer_shapes(model).graph.node[-1]
    assert onnx.numpy_helper.to_array(constant.attribute[0].t).tolist() == expected


def test_symbolic_width_gives_a_sympy_h():
    shapes = _shapes(hcfuse.infer_shapes(_one_node(("batch",), c=2, width="w")))
    assert shapes["pre0"] == (F32, ["batch", "w/2"])
    assert shapes["gate0"] == (F32, ["batch", 2])
    assert shapes["S0"] == (F32, ["batch", "w"])


@pytest.mark.skipif(ORT_SHIPS_HANDLER, reason="this onnxruntime ships its own handler for the op")
def test_symbolic_width_loses_batch_in_the_stock_tool_even_with_the_schema():
    """ONNX cannot spell w/2, so the stock tool invents fresh symbols for pre_output: why the handler exists."""
    shapes = _shapes(SymbolicShapeInference.infer_shapes(_one_node(("batch",), c=2, width="w"), auto_merge=True))
    assert shapes["gate0"] == (F32, ["batch", 2])
    assert all(d.startswith(f"{OP_TYPE}_0_o0") for d in shapes["pre0"][1])


@pytest.mark.parametrize(
    "outputs, present",
    [(["pre", "gate"], ["pre", "gate"]), (["pre", "gate", ""], ["pre", "gate"]), (["pre", "gate", "s"], ["pre", "gate", "s"])],
)
def test_empty_optional_inputs_and_omitted_outputs(outputs, present):
    model = _one_node(outputs=outputs)
    model.graph.node[0].input.extend(["", ""])
    shapes = _shapes(hcfuse.infer_shapes(model))
    assert [n for n in ("pre", "gate", "s") if n in shapes] == present
    assert shapes["pre"] == (F32, ["batch", 8])


# ---- errors -------------------------------------------------------------------------------------


def _break(model: onnx.ModelProto, case: str) -> onnx.ModelProto:
    node = model.graph.node[0]
    if case == "num_branches":
        node.attribute[0].i = 0
    elif case in ("num_branches_float", "num_branches_string"):
        value = 2.0 if case == "num_branches_float" else "2"
        node.attribute[0].CopyFrom(helper.make_attribute("num_branches", value))
    elif case == "four_outputs":
        node.output.append("extra")
    elif case == "width":  # C = 3 everywhere C shows, so the width is the only contradiction
        node.attribute[0].i = 3
        model.graph.initializer[3].CopyFrom(helper.make_tensor("inject_weight", F32, [16, 3], [0.0] * 48))
        model.graph.input[-1].type.tensor_type.shape.dim[-1].dim_value = 3
    elif case == "down_weight":
        model.graph.initializer[1].CopyFrom(helper.make_tensor("down_weight", F32, [10, 4], [0.0] * 40))
    elif case == "up_weight":
        model.graph.initializer[2].CopyFrom(helper.make_tensor("up_weight", F32, [5, 16], [0.0] * 80))
    elif case == "inject_weight":
        model.graph.initializer[3].CopyFrom(helper.make_tensor("inject_weight", F32, [16, 3], [0.0] * 48))
    elif case == "half_prologue":
        node.input[PREV_POST_GATE] = ""
    elif case == "missing_streams":
        node.input[0] = ""
    elif case == "prev_leading":
        model.graph.input[-2].type.tensor_type.shape.dim[0].dim_value = 5
    elif case == "elem_type":
        model.graph.input[-1].type.tensor_type.elem_type = F16
    return model


# case -> (message from our ONNX schema, which ORT's single-node pass runs first; message from the handler)
_ERRORS = {
    "num_branches": (r"num_branches must be > 0; got 0", r"num_branches must be > 0; got 0"),
    "num_branches_float": (r"num_branches must be an INT attribute; got a FLOAT attribute",) * 2,
    "num_branches_string": (r"num_branches must be an INT attribute; got a STRING attribute",) * 2,
    "four_outputs": (r"has 4 outputs; the op has at most 3 \(pre_output, post_gate, streams_out\)",) * 2,
    "width": (r"width C\*H = 16 \(streams\[-1\]\) is not divisible by num_branches = 3", r"streams width C\*H = 16 is not divisible by num_branches = 3"),
    "down_weight": (r"down_weight\[0\] = 10 but streams\[-1\] = 16", r"down_weight must be \(C\*H, R\) = \(16, 4\); got \(10, 4\)"),
    "up_weight": (r"up_weight\[0\] = 5 but down_weight\[1\] = 4; both must be R", r"up_weight must be \(R, C\*H\) = \(4, 16\); got \(5, 16\)"),
    "inject_weight": (r"inject_weight\[1\] = 3 but num_branches = 2", r"inject_weight must be \(C\*H, C\) = \(16, 2\); got \(16, 3\)"),
    "half_prologue": (r"prev_block_output is given without prev_post_gate",
                      r"prev_block_output and prev_post_gate come as a pair; got prev_block_output='prev_out', prev_post_gate=''"),
    "prev_leading": (r"prev_block_output leading dim 0 is 5 but streams has 3 there",
                     r"prev_block_output must be \(\.\.\., H\) with streams' leading dims = \(3, 8\); got \(5, 8\)"),
    "missing_streams": (r"required input\(s\) streams missing", r"required input\(s\) streams missing"),
    "elem_type": (r"prev_post_gate has element type FLOAT16 but streams has FLOAT",
                  r"all inputs must share one element type T; got streams=FLOAT, .*prev_post_gate=FLOAT16"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(_ERRORS))
def test_errors_name_the_node_and_sizes(case, in_tmp_path):
    model = _break(_one_node((3,), prologue=True), case)
    schema_match, handler_match = _ERRORS[case]
    with pytest.raises(ValueError, match=rf"{OP_TYPE} \(node .*\(hc0\)\): {schema_match}"):
        hcfuse.infer_shapes(model)
    deregister_schema()  # now only the handler sees the node
    try:
        with pytest.raises(ValueError, match=rf"{OP_TYPE} node 'hc0': {handler_match}"):
            HcSymbolicShapeInference.infer_shapes(model, auto_merge=True)
    finally:
        register_schema()
    assert os.listdir(in_tmp_path) == []


def test_incomplete_inference_raises_without_a_dump(in_tmp_path):
    model = _one_node()
    model.graph.node.append(helper.make_node("Opaque", ["pre0"], ["mystery"], domain=OPAQUE))
    model.graph.output.append(helper.make_empty_tensor_value_info("mystery"))
    model.opset_import.append(helper.make_opsetid(OPAQUE, 1))
    with pytest.raises(IncompleteShapeInferenceError, match=r"1 value\(s\) without a full type and shape: mystery"):
        hcfuse.infer_shapes(model)
    assert os.listdir(in_tmp_path) == []
    elem, dims = _shapes(hcfuse.infer_shapes(model, guess_output_rank=True))["mystery"]
    assert elem == F32 and len(dims) == 2 and None not in dims


def test_opset_below_7_is_an_error():
    model = _one_node()
    model.opset_import[0].version = 6
    with pytest.raises(ValueError, match=r"opset >= 7; the model imports 6"):
        hcfuse.infer_shapes(model)


# ---- ORT's own entry points -------------------------------------------------------------------


@pytest.mark.parametrize("op_type, handler", [(OP_TYPE, infer_hc_lowrank_mix),
                                              (_op_nbits.OP_TYPE, infer_hc_lowrank_mix_nbits)], ids=["dense", "nbits"])
def test_handler_is_ours_in_the_subclass_and_only_inside_register_with_ort(op_type, handler):
    def ours(ssi):
        return getattr(ssi.dispatcher_.get(op_type), "func", None) is handler

    assert ours(HcSymbolicShapeInference(2**31 - 1, True, False, 0))
    assert not ours(SymbolicShapeInference(2**31 - 1, True, False, 0))
    with register_with_ort():
        assert ours(SymbolicShapeInference(2**31 - 1, True, False, 0))
    assert not ours(SymbolicShapeInference(2**31 - 1, True, False, 0))


def test_register_with_ort_serves_the_stock_entry_point_and_restores_on_error():
    model = _one_node(("batch",), c=2, width="w")
    with register_with_ort():
        shapes = _shapes(SymbolicShapeInference.infer_shapes(model, auto_merge=True))
    assert shapes["pre0"] == (F32, ["batch", "w/2"])
    with pytest.raises(RuntimeError, match="boom"), register_with_ort():
        raise RuntimeError("boom")
    restored = SymbolicShapeInference(2**31 - 1, True, False, 0).dispatcher_.get(OP_TYPE)
    assert getattr(restored, "func", None) is not infer_hc_lowrank_mix


def test_register_with_ort_serves_transformers_helper():
    from onnxruntime.transformers.shape_infer_helper import SymbolicShapeInferenceHelper

    model = _one_node(("batch",), c=2, width="w")
    with register_with_ort():
        helper_ = SymbolicShapeInferenceHelper(model)
        assert helper_.infer({"batch": 4, "w": 16})
    assert helper_.get_edge_shape("pre0") == [4, 8]


def test_subgraphs_use_our_handler():
    inner = _fused(1, "sub_streams", 2, outputs=["sub_pre", "sub_gate"])
    then_graph = helper.make_graph([helper.make_node("Identity", ["streams"], ["sub_streams"]), inner], "then", [],
                                   [helper.make_empty_tensor_value_info("sub_pre")])  # fmt: skip
    else_graph = helper.make_graph([helper.make_node("Identity", ["pre0"], ["else_pre"])], "else", [],
                                   [helper.make_empty_tensor_value_info("else_pre")])  # fmt: skip
    model = _one_node(("batch",), c=2, width="w")
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    model.graph.node.append(helper.make_node("If", ["flag"], ["chosen"], then_branch=then_graph, else_branch=else_graph))
    model.graph.output.append(helper.make_empty_tensor_value_info("chosen"))
    shapes = _shapes(hcfuse.infer_shapes(model))
    assert shapes["chosen"] == (F32, ["batch", "w/2"])


# ---- chains -----------------------------------------------------------------------------------

C4, H16, R8 = 4, 16, 8
LEAD = ["batch", "seq"]


def _fused_chain(n_blocks: int, elem=F32) -> onnx.ModelProto:
    """n fused blocks; block k>0 takes S{k-1}, the sublayer output MatMul(pre{k-1}, w_sub) and gate{k-1}."""
    _, inits = _weights(elem, C4, H16, R8)
    nodes = [_fused(0, "streams", C4, epsilon=1e-6)]
    for k in range(1, n_blocks):
        nodes.append(helper.make_node("MatMul", [f"pre{k - 1}", "w_sub"], [f"out{k - 1}"]))
        nodes.append(_fused(k, f"S{k - 1}", C4, [f"out{k - 1}", f"gate{k - 1}"], gate_div=4.0, gate_mul=2.0))
    inputs = [helper.make_tensor_value_info("streams", elem, [*LEAD, C4 * H16])]
    last = n_blocks - 1
    return _model(nodes, inputs, [f"pre{last}", f"gate{last}", f"S{last}"], inits)


def _unfused_chain(n_blocks: int, elem=F32) -> onnx.ModelProto:
    """The stock chain (docs/NUMERICS.md) with the same value names for S, pre and gate as _fused_chain."""
    _, inits = _weights(elem, C4, H16, R8)
    inits += [helper.make_tensor("gate_div", elem, [], [4.0]), helper.make_tensor("gate_mul", elem, [], [2.0])]

    def op(op_type, inputs, output, **attrs):
        domain = DOMAIN if op_type in (POST_MIX, BRANCH_NORM, SCALED_SILU, PRE_MIX) else ""
        return helper.make_node(op_type, inputs, [output], domain=domain, **attrs)

    nodes = [op("Identity", ["streams"], "S0")]
    for k in range(n_blocks):
        if k:
            nodes += [op("MatMul", [f"pre{k - 1}", "w_sub"], f"out{k - 1}"),
                      op(POST_MIX, [f"S{k - 1}", f"out{k - 1}", f"gate{k - 1}"], f"S{k}", num_branches=C4)]  # fmt: skip
        nodes += [
            op(BRANCH_NORM, [f"S{k}", "norm_scale"], f"hn{k}", num_branches=C4, epsilon=1e-6),
            op("MatMul", [f"hn{k}", "down_weight"], f"down{k}"),
            op(SCALED_SILU, [f"down{k}"], f"d{k}", alpha=0.25),
            op("MatMul", [f"d{k}", "up_weight"], f"up{k}"),
            op("Sigmoid", [f"up{k}"], f"g{k}"),
            op(PRE_MIX, [f"hn{k}", f"g{k}"], f"pre{k}", num_branches=C4, reduction_scale=0.25),
            op("MatMul", [f"hn{k}", "inject_weight"], f"inject{k}"),
            op("Div", [f"inject{k}", "gate_div"], f"scaled{k}"),
            op("Sigmoid", [f"scaled{k}"], f"sg{k}"),
            op("Mul", [f"sg{k}", "gate_mul"], f"gate{k}"),
        ]
    inputs = [helper.make_tensor_value_info("streams", elem, [*LEAD, C4 * H16])]
    last = n_blocks - 1
    return _model(nodes, inputs, [f"pre{last}", f"gate{last}", f"S{last}"], inits)


def test_96_block_fused_chain_is_fully_inferred():
    inferred = hcfuse.infer_shapes(_fused_chain(96, BF16))
    _assert_fully_inferred(inferred)
    shapes = _shapes(inferred)
    for k in range(96):
        assert shapes[f"pre{k}"] == (BF16, [*LEAD, H16]), k
        assert shapes[f"gate{k}"] == (BF16, [*LEAD, C4]), k
        assert shapes[f"S{k}"] == (BF16, [*LEAD, C4 * H16]), k


@DTYPES
def test_unfused_chain_matches_the_fused_one(elem):
    n = 3
    fused = _shapes(hcfuse.infer_shapes(_fused_chain(n, elem)))
    stock = hcfuse.infer_shapes(_unfused_chain(n, elem))
    _assert_fully_inferred(stock)
    stock = _shapes(stock)
    names = [f"{v}{k}" for k in range(n) for v in ("pre", "gate", "S")]
    assert {v: stock[v] for v in names} == {v: fused[v] for v in names}
    assert fused["pre2"] == (elem, [*LEAD, H16])
