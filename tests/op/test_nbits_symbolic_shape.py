"""HyperConnectionLowRankMixNBits in ONNX Runtime's symbolic shape inference (hcfuse/shapes/ort_symbolic_shape.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

import hcfuse
from hcfuse import _op_nbits
from hcfuse._op import IR_VERSION, ONNX_OPSET
from hcfuse._op_nbits import DOMAIN, OP_TYPE
from hcfuse.models.nbits import make_nbits_node_model, random_nbits_weights
from hcfuse.shapes import nbits_schema
from hcfuse.shapes.ort_symbolic_shape import HcSymbolicShapeInference, register_with_ort

F32, F16, BF16, U8 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.UINT8
C, H, R = 2, 16, 8
W = C * H


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """ORT's tool dumps sym_shape_infer_temp.onnx into the cwd on failure: keep that in tmp_path."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, list]]:
    """name -> (element type, dims as int/str/None) for every value_info and graph output."""
    out = {}
    for v in [*model.graph.value_info, *model.graph.output]:
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in v.type.tensor_type.shape.dim]
        out[v.name] = (v.type.tensor_type.elem_type, dims)
    return out


def _untyped_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    names = [o.name for o in model.graph.output]
    del model.graph.output[:]
    model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    return model


def _node_model(quantized=("down_inject", "up"), zp_form=None, dtype=np.float16, prologue=False, lead=("batch", "seq"),
                bits=4, block_size=16, **attrs) -> onnx.ModelProto:
    weights = random_nbits_weights(C, H, R, dtype, np.random.default_rng(0), quantized, bits, block_size,
                                   symmetric=zp_form is None, zp_form=zp_form)
    return _untyped_outputs(make_nbits_node_model(weights, C=C, dtype=dtype, leading_dims=lead, prologue=prologue,
                                                  streams_out=True, bits=bits, block_size=block_size, **attrs))


@pytest.mark.parametrize("dtype,elem", [(np.float32, F32), (np.float16, F16)], ids=["float32", "float16"])
@pytest.mark.parametrize("quantized", [("down_inject", "up"), ("down_inject",), ("up",)], ids="+".join)
@pytest.mark.parametrize("zp_form", [None, "packed", "T"])
@pytest.mark.parametrize("prologue", [False, True])
def test_one_node_fully_inferred(dtype, elem, quantized, zp_form, prologue):
    shapes = _shapes(hcfuse.infer_shapes(_node_model(quantized, zp_form, dtype, prologue)))
    assert shapes["pre_output"] == (elem, ["batch", "seq", H])
    assert shapes["post_gate"] == (elem, ["batch", "seq", C])
    assert shapes["streams_out"] == (elem, ["batch", "seq", W])


def _symbolic_width_model(elem=BF16) -> onnx.ModelProto:
    """Every input a graph input with the width a symbol: only the handler can say H = w/2."""
    value = helper.make_tensor_value_info
    inputs = [value("streams", elem, ["batch", "w"]), value("norm_scale", elem, ["w"]),
              value("down_inject_weight", U8, ["rc", "kb", 8]), value("down_inject_scales", elem, ["rc", "kb"]),
              value("up_weight", U8, ["w", 1, 8]), value("up_scales", elem, ["w", 1])]
    given = {i.name for i in inputs}
    node = helper.make_node(OP_TYPE, [n if n in given else "" for n in _op_nbits.INPUTS[:_op_nbits.UP_SCALES + 1]],
                            ["pre", "gate", "s"], domain=DOMAIN, name="hcq",
                            num_branches=C, block_size=16)
    graph = helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info(n) for n in node.output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=IR_VERSION)


def test_symbolic_width_gives_a_sympy_h():
    shapes = _shapes(hcfuse.infer_shapes(_symbolic_width_model()))
    assert shapes["pre"] == (BF16, ["batch", "w/2"])
    assert shapes["gate"] == (BF16, ["batch", C])
    assert shapes["s"] == (BF16, ["batch", "w"])


def test_zero_rows_and_omitted_streams_out():
    model = _node_model(lead=(0,))
    del model.graph.node[0].output[2]
    del model.graph.output[2]
    shapes = _shapes(hcfuse.infer_shapes(model))
    assert shapes["pre_output"] == (F16, [0, H]) and "streams_out" not in shapes


def _break(case: str) -> onnx.ModelProto:
    model = _node_model(zp_form="packed")
    node = model.graph.node[0]
    inits = {t.name: t for t in model.graph.initializer}
    if case == "block_size":
        next(a for a in node.attribute if a.name == "block_size").i = 32
    elif case == "scales":
        node.input[_op_nbits.UP_SCALES] = ""
    elif case == "k_blocks":
        inits["down_inject_scales"].dims[1] = 3
    elif case == "zero_points":
        inits["up_zero_points"].dims[1] = 2
    return model


@pytest.mark.parametrize("case,match", [
    ("block_size", r"down_inject_weight\[2\] = 8 but blob_size = block_size \* bits / 8 = 32 \* 4 / 8 = 16"),
    ("scales", "up_weight is uint8 .quantized. but up_scales is missing"),
    ("k_blocks", r"down_inject_scales\[1\] = 3 but down_inject_weight\[1\] = 2"),
    ("zero_points", r"up_zero_points\[1\] = 2 but packed uint8 zero points of k_blocks = 1"),
])
def test_errors_name_the_node(case, match, in_tmp_path):
    with pytest.raises(ValueError, match=rf"{OP_TYPE} .*hc_lowrank_mix_nbits.*: {match}"):
        hcfuse.infer_shapes(_break(case))
    assert not list(in_tmp_path.iterdir())  # no sym_shape_infer_temp.onnx


@pytest.fixture
def without_nbits_schema():
    """ONNX's single-node pass knows nothing of the op: the handler alone infers and checks."""
    nbits_schema.deregister_schema()
    yield
    nbits_schema.register_schema()


@pytest.mark.parametrize("case", ["block_size", "scales", "k_blocks"])
def test_the_handler_alone_checks_the_rules(case, without_nbits_schema):
    with pytest.raises(ValueError, match=rf"{OP_TYPE} node 'hc_lowrank_mix_nbits': "):
        HcSymbolicShapeInference.infer_shapes(_break(case), auto_merge=True)


def test_the_handler_alone_infers_symbolic_h(without_nbits_schema):
    shapes = _shapes(HcSymbolicShapeInference.infer_shapes(_symbolic_width_model(), auto_merge=True))
    assert shapes["pre"] == (BF16, ["batch", "w/2"]) and shapes["s"] == (BF16, ["batch", "w"])


def test_register_with_ort_serves_the_stock_entry_point():
    """Which handler is installed where: test_symbolic_shape.py, for both ops."""
    with register_with_ort():
        shapes = _shapes(SymbolicShapeInference.infer_shapes(_symbolic_width_model(), auto_merge=True))
    assert shapes["pre"] == (BF16, ["batch", "w/2"])


def _quantized_chain(n_blocks: int) -> onnx.ModelProto:
    """n quantized blocks, each's pre_output through a MatMul sublayer into the next one's prologue."""
    rng = np.random.default_rng(1)
    nodes, inits = [], [helper.make_tensor("w_sub", F16, [H, H], np.zeros(H * H, np.float16).tobytes(), raw=True)]
    streams, prev = "streams", None
    for k in range(n_blocks):
        weights = random_nbits_weights(C, H, R, np.float16, rng, ("down_inject", "up") if k % 2 else ("up",),
                                       block_size=16, symmetric=bool(k % 2), zp_form=None if k % 2 else "T")
        names = {n: f"{n}_{k}" for n in weights}
        inits += [onnx.numpy_helper.from_array(a, names[n]) for n, a in weights.items()]
        inputs = [names.get(n, "") for n in _op_nbits.INPUTS[: _op_nbits.PREV_BLOCK_OUTPUT]]
        inputs[_op_nbits.STREAMS] = streams
        nodes.append(helper.make_node(OP_TYPE, [*inputs, *(prev or ())], [f"pre{k}", f"gate{k}", f"S{k}"],
                                      domain=DOMAIN, name=f"hcq{k}", num_branches=C, block_size=16))
        nodes.append(helper.make_node("MatMul", [f"pre{k}", "w_sub"], [f"sub{k}"]))
        streams, prev = f"S{k}", [f"sub{k}", f"gate{k}"]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("streams", F16, ["batch", "seq", W])],
                              [helper.make_empty_tensor_value_info(streams)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=IR_VERSION)


def test_quantized_chain_is_fully_inferred():
    shapes = _shapes(hcfuse.infer_shapes(_quantized_chain(6)))
    produced = [o for k in range(6) for o in (f"pre{k}", f"gate{k}", f"S{k}", f"sub{k}")]
    for name in produced:
        assert shapes[name][0] == F16 and shapes[name][1][:2] == ["batch", "seq"], name
    assert shapes["S5"] == (F16, ["batch", "seq", W]) and shapes["gate5"] == (F16, ["batch", "seq", C])
