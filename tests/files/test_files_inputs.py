"""What hcfuse says about inputs it cannot use, and verify's feeds: one clear line per problem,
naming the file and the tensor or node; scalars fed as scalars; onnxruntime's own log kept quiet."""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import hcfuse
from hcfuse.checking import _ort_io, verification
from hcfuse.cli import EXIT_ERROR, EXIT_NOT_VERIFIED, EXIT_OK, main
from hcfuse.models.qwen_decode import save_decode_model

C, H, R = 4, 16, 8


def _cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _model(nodes, inputs, outputs, opset=21, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset)] if opset else [])


def _scaled_silu_model(elem=TensorProto.FLOAT) -> onnx.ModelProto:
    """ScaledSiLU with its scale as a 0-d graph input."""
    x = helper.make_tensor_value_info("x", elem, ["n", 4])
    scale = helper.make_tensor_value_info("scale", elem, [])
    y = helper.make_tensor_value_info("y", elem, ["n", 4])
    node = helper.make_node("ScaledSiLU", ["x", "scale"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [x, scale], [y])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                 helper.make_opsetid("com.microsoft", 1)])


# ---- verify keeps feed shapes ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_a_0d_array_stays_0d_in_onnxruntime(dtype):
    array = np.array(1.5, dtype=dtype)
    value = _ort_io.to_ort_value(array)
    assert value.shape() == []
    back = _ort_io.from_ort_value(value)
    assert back.shape == () and back.dtype == array.dtype and back == array


def test_verify_feeds_a_0d_input_as_a_scalar(hcfuse_lib):
    model = _scaled_silu_model()
    result = hcfuse.verify(model, model, providers=["CPUExecutionProvider"])
    assert result.status == "passed", result.summary()
    assert result.input_shapes == {"x": [verification.DEFAULT_ROWS, 4], "scale": []}


def test_cli_verify_of_a_model_with_a_0d_input(tmp_path, capsys, hcfuse_lib):
    src = str(tmp_path / "silu.onnx")
    onnx.save(_scaled_silu_model(), src)
    code, out, err = _cli(capsys, "optimize", src, "-o", str(tmp_path / "o.onnx"), "--verify")
    assert code == EXIT_OK, err
    assert "PASSED" in out


# ---- invalid input models ----------------------------------------------------------------------------


def _xy():
    return (helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"]))


@pytest.mark.parametrize("case, message", [
    ("no_opset_import", "no opset_import for the ONNX domain"),
    ("undefined_value", "reads 'missing', which no node, graph input or initializer defines"),
    ("wrong_input_count", "node 'r' (Relu)"),
    ("domain_without_opset", "domain 'com.example' has no opset_import"),
])
def test_invalid_models_get_one_clear_line(case, message, tmp_path, capsys):
    x, y = _xy()
    model = {
        "no_opset_import": lambda: _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], opset=None),
        "undefined_value": lambda: _model([helper.make_node("Add", ["x", "missing"], ["y"], name="add")], [x], [y]),
        "wrong_input_count": lambda: _model([helper.make_node("Relu", ["x", "x"], ["y"], name="r")], [x], [y]),
        "domain_without_opset": lambda: _model([helper.make_node("Foo", ["x"], ["y"], domain="com.example")], [x], [y]),
    }[case]()
    src = str(tmp_path / "bad.onnx")
    onnx.save(model, src)
    for command in ("optimize", "unfuse", "infer-shapes"):
        code, _, err = _cli(capsys, command, src, "-o", str(tmp_path / "o.onnx"))
        assert code == EXIT_ERROR and len(err.strip().splitlines()) == 1, err
        assert message in err and "bad.onnx" in err and "Traceback" not in err, err
    assert not os.path.exists(tmp_path / "o.onnx")


def test_an_invalid_model_is_one_line_on_the_real_stderr(tmp_path):
    """Through `python -m hcfuse`: nothing else (onnx-ir's logger included) adds a line."""
    x, y = _xy()
    src = str(tmp_path / "bad.onnx")
    onnx.save(_model([helper.make_node("Add", ["x", "missing"], ["y"], name="add")], [x], [y]), src)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "hcfuse", "optimize", src, "-o", str(tmp_path / "o.onnx")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == EXIT_ERROR and proc.stderr.count("\n") == 1 and "'missing'" in proc.stderr, proc.stderr


def test_an_unsorted_graph_is_accepted_as_onnxruntime_does(tmp_path, capsys):
    x, y = _xy()
    model = _model([helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Neg", ["x"], ["a"])], [x], [y])
    src = str(tmp_path / "unsorted.onnx")
    onnx.save(model, src)
    code, _, err = _cli(capsys, "optimize", src, "-o", str(tmp_path / "o.onnx"))
    assert code == EXIT_OK, err
    assert [n.op_type for n in onnx.load(tmp_path / "o.onnx").graph.node] == ["Neg", "Relu"]


# ---- external data ------------------------------------------------------------------------------------


@pytest.fixture
def external_model(tmp_path):
    src = str(tmp_path / "ext.onnx")
    save_decode_model(src, 2, C=C, H=H, R=R, external_data=True, packed=False)
    return src


def _last_tensor(path: str) -> tuple[str, int]:
    """(name, end offset) of the external tensor stored last in the data file."""
    ends = {}
    for t in onnx.load(path, load_external_data=False).graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        if info:
            ends[t.name] = int(info.get("offset", 0)) + int(info["length"])
    name = max(ends, key=ends.get)
    return name, ends[name]


def test_a_truncated_data_file_names_the_file_and_the_tensor(external_model, tmp_path, capsys):
    name, end = _last_tensor(external_model)
    with open(external_model + ".data", "r+b") as f:
        f.truncate(end - 64)
    code, _, err = _cli(capsys, "optimize", external_model, "-o", str(tmp_path / "o.onnx"))
    assert code == EXIT_ERROR and len(err.strip().splitlines()) == 1, err
    assert "ext.onnx.data" in err and repr(name) in err and "truncated" in err, err


def test_a_missing_data_file_names_the_file_and_a_tensor(external_model, tmp_path, capsys):
    os.rename(external_model + ".data", str(tmp_path / "elsewhere.data"))
    code, _, err = _cli(capsys, "infer-shapes", external_model, "-o", str(tmp_path / "o.onnx"))
    assert code == EXIT_ERROR and len(err.strip().splitlines()) == 1, err
    assert "ext.onnx.data" in err and "does not exist" in err and "initializer '" in err, err


def test_a_location_outside_the_models_folder_is_refused(tmp_path, capsys):
    (tmp_path / "inner").mkdir()
    src = str(tmp_path / "inner" / "m.onnx")
    ir.save(ir.from_proto(_scaled_silu_model()), src)
    model = onnx.load(src)
    w = onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    onnx.external_data_helper.set_external_data(w, "../secret.bin")
    w.ClearField("raw_data")
    model.graph.initializer.append(w)
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64 * 64 * 4)
    onnx.save(model, src)
    code, _, err = _cli(capsys, "optimize", src, "-o", str(tmp_path / "o.onnx"))
    assert code == EXIT_ERROR and "outside the model's folder" in err and "'w'" in err, err


# ---- usage errors and onnxruntime's log -----------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["optimize", "x.onnx"],
    ["frobnicate"],
    ["demo", "--blocks", "0"],
    ["optimize", "x.onnx", "-o", "x.onnx"],
    ["optimize", "x.onnx", "-o", "./x.onnx"],
    ["infer-shapes"],
])
def test_every_usage_error_is_one_line(argv, capsys):
    code, out, err = _cli(capsys, *argv)
    assert code == EXIT_ERROR and out == ""
    assert len(err.strip().splitlines()) == 1 and "error:" in err and "usage:" in err, err


def test_a_failing_verify_is_one_line_without_onnxruntimes_log(tmp_path, capfd, hcfuse_lib):
    """A model onnxruntime fails to run (Reshape of 3x3 values to [2, -1]): not verified, the output
    written; hcfuse's line carries onnxruntime's reason; onnxruntime prints nothing of its own (its log
    writes to the fd)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = onnx.numpy_helper.from_array(np.array([2, -1], np.int64), "shape")
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], [x], [y],
                   initializers=[shape])
    src = str(tmp_path / "reshape.onnx")
    onnx.save(model, src)
    code = main(["optimize", src, "-o", str(tmp_path / "o.onnx"), "--verify"])
    _, err = capfd.readouterr()
    errors = [line for line in err.splitlines() if "warning: no hyper-connection block" not in line]
    assert code == EXIT_NOT_VERIFIED and len(errors) == 1 and os.path.exists(tmp_path / "o.onnx"), err
    assert "could not run the original model" in errors[0] and "reshape" in errors[0].lower(), err
    assert "[E:onnxruntime" not in err and "[W:onnxruntime" not in err, err  # its log format
