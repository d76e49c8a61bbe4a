"""hcfuse's ops in onnx-shape-inference (hcfuse/shapes/onnx_shape_inference.py), against onnxruntime's symbolic
handlers and ONNX's own inference. Skipped without the package (the `shape-inference` extra)."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

onnx_shape_inference = pytest.importorskip("onnx_shape_inference")

import hcfuse  # noqa: E402
from hcfuse import _op, _op_nbits  # noqa: E402
from hcfuse.models.hc_block import make_fused_node_model  # noqa: E402
from hcfuse.models.nbits import make_nbits_node_model, random_nbits_weights  # noqa: E402
from hcfuse.models.quantized import quantized_decode_model  # noqa: E402
from hcfuse.models.qwen_decode import make_decode_model  # noqa: E402
from hcfuse.shapes import onnx_shape_inference as hcfuse_osi  # noqa: E402

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
DENSE = (_op.DOMAIN, _op.OP_TYPE, _op.SINCE_VERSION)
NBITS = (_op_nbits.DOMAIN, _op_nbits.OP_TYPE, _op_nbits.SINCE_VERSION)


@pytest.fixture(autouse=True, scope="module")
def registered():
    hcfuse_osi.register()


def _untyped_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its graph outputs' types cleared: what inference states is then all there is."""
    for output in model.graph.output:
        output.ClearField("type")
    return model


def _osi(model: onnx.ModelProto, **options) -> dict[str, tuple[int, list | None]]:
    """onnx-shape-inference's result: node output name -> (element type, dims as int or str)."""
    inferred = onnx_shape_inference.infer_symbolic_shapes(ir.from_proto(model), **options)
    found = {}
    for node in inferred.graph:
        for v in node.outputs:
            if v.name:
                dims = None if v.shape is None else [d if isinstance(d, int) else str(d.value) for d in v.shape.dims]
                found[v.name] = (v.dtype.value if v.dtype is not None else 0, dims)
    return found


def _proto_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, list | None]]:
    """value_info and graph outputs of a ModelProto: name -> (element type, dims as int or str)."""
    found = {}
    for v in [*model.graph.value_info, *model.graph.output]:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        found[v.name] = (t.elem_type, dims if t.HasField("shape") else None)
    return found


def _outputs_of(model: onnx.ModelProto, op_type: str) -> list[str]:
    return [o for node in model.graph.node if node.op_type == op_type for o in node.output if o]


# ---- registration ---------------------------------------------------------------------------------


def test_register_adds_each_op_once():
    registry = onnx_shape_inference.OpShapeInferenceRegistry()
    assert registry.get(*DENSE) is None
    hcfuse_osi.register(registry)
    hcfuse_osi.register(registry)
    for domain, op_type, since in (DENSE, NBITS):
        assert registry.get(domain, op_type, since) is hcfuse_osi.infer_outputs
        assert registry.version_boundaries(domain, op_type) == (since,)


def test_ours_win_over_a_handler_registered_before():
    registry = onnx_shape_inference.OpShapeInferenceRegistry()

    def other(ctx, node):
        raise AssertionError("not ours")

    registry.register(*DENSE)(other)
    hcfuse_osi.register(registry)
    assert registry.get(*DENSE) is hcfuse_osi.infer_outputs


def test_without_register_the_package_leaves_the_op_untyped(tmp_path):
    """The package alone knows nothing of the op: the shapes in the other tests are the handler's."""
    path = tmp_path / "m.onnx"
    onnx.save(_untyped_outputs(make_fused_node_model(C=2, H=8, R=4, dtype=np.float32)), path)
    code = ("import sys, onnx_ir as ir, onnx_shape_inference as o, hcfuse; "
            "m = o.infer_symbolic_shapes(ir.load(sys.argv[1])); print([v.shape for v in m.graph.outputs])")
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[None, None]"


# ---- the dense op: the same shapes as onnxruntime's handler ---------------------------------------


@pytest.mark.parametrize("lead", [("batch",), ("batch", "seq"), (2, 3), (0,), ()], ids=str)
@pytest.mark.parametrize("prologue", [False, True], ids=["no_prologue", "prologue"])
@pytest.mark.parametrize("streams_out", [False, True], ids=["2_outputs", "3_outputs"])
def test_same_shapes_as_onnxruntime_handler(lead, prologue, streams_out):
    model = _untyped_outputs(make_fused_node_model(C=4, H=8, R=4, dtype=np.float16, leading_dims=lead,
                                                   prologue=prologue, streams_out=streams_out))
    ours = _osi(model)
    assert ours == {name: shape for name, shape in _proto_shapes(hcfuse.infer_shapes(model)).items() if name in ours}
    assert ours["pre_output"] == (F16, [*lead, 8])
    assert ours["post_gate"] == (F16, [*lead, 4])
    assert ("streams_out" in ours) == streams_out


@pytest.mark.parametrize("dtype, elem", [(np.float32, F32), (np.float16, F16), (ml_dtypes.bfloat16, BF16)],
                         ids=["float", "float16", "bfloat16"])
def test_fused_decode_chain_as_onnxruntime_handler(dtype, elem):
    """Three fused blocks of a real fusion (prologues fed by the previous block), batch and seq symbolic."""
    fused = hcfuse.optimize(make_decode_model(3, C=4, H=16, R=8, dtype=dtype, leading_dims=("batch", "seq")))
    names = _outputs_of(fused, _op.OP_TYPE)
    assert len(names) >= 6
    ours = _osi(fused)
    theirs = _proto_shapes(hcfuse.infer_shapes(fused))
    assert {n: ours[n] for n in names} == {n: theirs[n] for n in names}
    assert all(ours[n][0] == elem and ours[n][1][:2] == ["batch", "seq"] for n in names)


def _symbolic_width_model() -> onnx.ModelProto:
    """One node with streams (batch, w) and every weight a graph input sized by w."""
    shapes = {"streams": ["batch", "w"], "norm_scale": ["w"], "down_weight": ["w", 4], "up_weight": [4, "w"],
              "inject_weight": ["w", 2]}
    node = helper.make_node(_op.OP_TYPE, list(_op.INPUTS[:5]), ["pre", "gate", "s"], domain=_op.DOMAIN, name="hc",
                            num_branches=2)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, F32, s) for n, s in shapes.items()],
                              [helper.make_empty_tensor_value_info(o) for o in node.output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _op.ONNX_OPSET),
                                                   helper.make_opsetid(_op.DOMAIN, 1)], ir_version=_op.IR_VERSION)


def test_symbolic_width_gives_h_as_width_over_c_as_onnxruntime_handler():
    model = _symbolic_width_model()
    ours = _osi(model)
    assert ours == {"pre": (F32, ["batch", "w/2"]), "gate": (F32, ["batch", 2]), "s": (F32, ["batch", "w"])}
    assert ours == {n: s for n, s in _proto_shapes(hcfuse.infer_shapes(model)).items() if n in ours}


def test_unnamed_leading_dims_are_one_symbol_across_inputs_and_outputs():
    model = _untyped_outputs(make_fused_node_model(C=2, H=8, R=4, dtype=np.float32, leading_dims=(None,),
                                                   prologue=True, streams_out=True))
    inferred = onnx_shape_inference.infer_symbolic_shapes(ir.from_proto(model))
    streams = inferred.graph.inputs[0]
    assert streams.shape[0].value is not None
    for output in inferred.graph.outputs:
        assert output.shape[0] == streams.shape[0], output.name


def test_omitted_optional_output_and_empty_optional_inputs():
    model = _untyped_outputs(make_fused_node_model(C=2, H=8, R=4, dtype=np.float32, streams_out=True))
    node = model.graph.node[0]
    node.input.extend(["", ""])
    node.output[2] = ""
    del model.graph.output[2]
    assert _osi(model) == {"pre_output": (F32, ["rows", 8]), "post_gate": (F32, ["rows", 2])}


# ---- contradictions -------------------------------------------------------------------------------


def _contradiction() -> onnx.ModelProto:
    """norm_scale (15,) beside streams (rows, 16)."""
    model = _untyped_outputs(make_fused_node_model(C=2, H=8, R=4, dtype=np.float32))
    norm_scale = next(v for v in model.graph.input if v.name == "norm_scale")
    norm_scale.type.tensor_type.shape.dim[0].dim_value = 15
    return model


def test_a_contradiction_names_the_node_and_the_sizes():
    with pytest.raises(onnx_shape_inference.ShapeInferenceError) as raised:
        _osi(_contradiction())
    message = str(raised.value)
    assert message.startswith(f"{_op.DOMAIN}::{_op.OP_TYPE} (node 'hc_lowrank_mix'): ")
    assert message.endswith("norm_scale[0] = 15 but streams[-1] = 16; both must be CH")
    assert message.count(_op.OP_TYPE) == 1


def test_a_contradiction_under_policy_skip_sets_nothing():
    assert _osi(_contradiction(), policy="skip") == {"pre_output": (0, None), "post_gate": (0, None)}


# ---- the quantized op -----------------------------------------------------------------------------


@pytest.mark.parametrize("quantized", [("down_inject", "up"), ("up",), ("down_inject",)], ids="+".join)
@pytest.mark.parametrize("prologue", [False, True], ids=["no_prologue", "prologue"])
def test_quantized_op_as_onnxruntime_handler_and_onnx_inference(quantized, prologue):
    weights = random_nbits_weights(4, 16, 8, np.float16, np.random.default_rng(0), quantized=quantized)
    model = _untyped_outputs(make_nbits_node_model(weights, C=4, dtype=np.float16, leading_dims=("batch", "seq"),
                                                   prologue=prologue, streams_out=True))
    ours = _osi(model)
    assert ours == {"pre_output": (F16, ["batch", "seq", 16]), "post_gate": (F16, ["batch", "seq", 4]),
                    "streams_out": (F16, ["batch", "seq", 64])}
    onnx_own = _proto_shapes(onnx.shape_inference.infer_shapes(model, strict_mode=True))
    assert ours == {n: onnx_own[n] for n in ours}
    assert ours == {n: s for n, s in _proto_shapes(hcfuse.infer_shapes(model)).items() if n in ours}


def test_quantized_decode_chain_as_onnxruntime_handler():
    fused = hcfuse.optimize(quantized_decode_model(2, C=4, H=32, R=8, leading_dims=("batch", "seq")))
    names = _outputs_of(fused, _op_nbits.OP_TYPE)
    assert len(names) >= 4
    ours = _osi(fused)
    theirs = _proto_shapes(hcfuse.infer_shapes(fused))
    assert {n: ours[n] for n in names} == {n: theirs[n] for n in names}
    assert all(ours[n][1][:2] == ["batch", "seq"] for n in names)


def test_quantized_contradiction_names_the_node():
    weights = random_nbits_weights(4, 16, 8, np.float32, np.random.default_rng(0))
    model = _untyped_outputs(make_nbits_node_model(weights, C=4, dtype=np.float32, block_size=64))
    with pytest.raises(onnx_shape_inference.ShapeInferenceError, match=r"node 'hc_lowrank_mix_nbits'.*blob_size"):
        _osi(model)
