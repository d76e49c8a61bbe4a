"""hcfuse's Python API (optimize, optimize_with_report, verify) and the ``hcfuse`` command line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import hcfuse
from hcfuse import _op
from hcfuse.files import model_io
from hcfuse.checking import verification
from hcfuse.cli import EXIT_ERROR, EXIT_NOT_VERIFIED, EXIT_OK, EXIT_VERIFY_FAILED, main
from hcfuse.models.qwen_decode import make_decode_model, save_decode_model

C, H, R = 4, 16, 8
# the folder holding the hcfuse these tests import (a source tree or site-packages)
HCFUSE_HOME = os.path.dirname(os.path.dirname(os.path.abspath(hcfuse.__file__)))


def small(num_blocks=3, **options) -> onnx.ModelProto:
    return make_decode_model(num_blocks, C=C, H=H, R=R, **options)


def count(model, op_type: str) -> int:
    graph = (ir.from_proto(model) if isinstance(model, onnx.ModelProto) else model).graph
    return sum(node.op_type == op_type for node in graph)


def digest(*paths) -> dict[str, str]:
    return {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "in.onnx"
    onnx.save(small(), path)
    return str(path)


# --- API


def test_optimize_proto_returns_proto_and_leaves_input():
    model = small()
    before = model.SerializeToString()
    fused = hcfuse.optimize(model)
    assert isinstance(fused, onnx.ModelProto)
    assert model.SerializeToString() == before
    assert count(fused, _op.OP_TYPE) == 3 and count(fused, _op.BRANCH_NORM) == 0
    assert {o.domain: o.version for o in fused.opset_import}[_op.DOMAIN] == _op.SINCE_VERSION
    onnx.checker.check_model(fused)  # the last injection PostMix (an ORT contrib op) stays


def test_optimize_ir_returns_ir_and_leaves_input():
    model = ir.from_proto(small())
    before = ir.to_proto(model).SerializeToString()
    fused = hcfuse.optimize(model)
    assert isinstance(fused, ir.Model) and fused is not model
    assert ir.to_proto(model).SerializeToString() == before
    assert count(fused, _op.OP_TYPE) == 3
    assert fused.opset_imports[_op.DOMAIN] == _op.SINCE_VERSION


def test_optimize_rejects_other_types():
    with pytest.raises(TypeError, match="expected an onnx.ModelProto or onnx_ir.Model; got str"):
        hcfuse.optimize("model.onnx")


def test_report_lists_fused_and_rejected():
    # block 1's normalized streams also leave the graph: that block stays unfused, with the reason
    model = ir.from_proto(small(3))
    norm = next(n for n in model.graph if n.name == "/model/layers.0/mlp_hyper_connection/hc_norm")
    model.graph.outputs.append(norm.outputs[0])
    fused, report = hcfuse.optimize_with_report(model)
    assert sum(report.counts_by_rule().values()) == len(report.fused) == 2
    assert count(fused, _op.OP_TYPE) == 2 and count(fused, _op.BRANCH_NORM) == 1
    data = json.loads(json.dumps(report.to_dict()))
    assert data["counts_by_rule"] == report.counts_by_rule()
    [rejected] = data["rejected"]
    assert rejected["anchor"] == norm.name and "graph output" in rejected["reason"]
    assert {block["anchor"] for block in data["fused"]} == {
        "/model/layers.0/attn_hyper_connection/hc_norm", "/model/layers.1/attn_hyper_connection/hc_norm"}


def plain_model() -> onnx.ModelProto:
    """A model without any hyper-connection block."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n"])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return onnx.helper.make_model(graph, ir_version=10, opset_imports=[onnx.helper.make_opsetid("", 21)])


def test_zero_fusions_report():
    fused, report = hcfuse.optimize_with_report(plain_model())
    assert sum(report.counts_by_rule().values()) == 0 and not report.fused
    assert [n.op_type for n in fused.graph.node] == ["Relu"]
    assert _op.DOMAIN not in {o.domain for o in fused.opset_import}


# --- verify


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_verify_passes_for_the_fusion(hcfuse_lib, dtype):
    original = small(4, dtype=dtype)
    result = hcfuse.verify(original, hcfuse.optimize(original), providers=["CPUExecutionProvider"])
    assert result.status == "passed", result.summary()
    assert [g.name for g in result.outputs] == ["hidden_states"]
    assert result.input_shapes == {"inputs_embeds": [3, 3, H]}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_verify_passes_for_a_96_block_chain(hcfuse_lib, dtype):
    original = small(96, dtype=dtype)
    fused, report = hcfuse.optimize_with_report(original)
    assert sum(report.counts_by_rule().values()) == 96
    result = hcfuse.verify(original, fused, providers=["CPUExecutionProvider"], dims={"batch": 2, "seq": 5})
    assert result.status == "passed", result.summary()
    assert result.input_shapes == {"inputs_embeds": [2, 5, H]}


def test_verify_fails_on_a_changed_weight(hcfuse_lib):
    original = small(2)
    fused = ir.from_proto(hcfuse.optimize(original))
    name = next(n for n in fused.graph.initializers if "o_proj" in n or "down_proj" in n)
    value = fused.graph.initializers[name]
    value.const_value = ir.tensor(value.const_value.numpy() * 1.01, name=name)
    result = hcfuse.verify(original, fused, providers=["CPUExecutionProvider"])
    assert result.status == "failed" and not result.passed
    assert "FAIL" in result.summary()


def test_verify_bfloat16_on_cpu_is_not_verified(hcfuse_lib):
    original = small(2, dtype=ml_dtypes.bfloat16)
    result = hcfuse.verify(original, hcfuse.optimize(original), providers=["CPUExecutionProvider"])
    assert result.status == verification.NOT_VERIFIED
    assert "bfloat16" in result.reason and "CUDA" in result.reason


def test_ulp_gap_measures_at_the_output_scale():
    a = np.array([1.0, 2.0, 0.0], np.float16)
    b = np.array([1.0, 2.0 + 2**-9, 0.0], np.float16)  # one float16 ulp at 2
    assert verification.ulp_gap(a, b, ir.DataType.FLOAT16) == 1.0
    near_zero = np.array([1.0, 1.0, 2**-20], np.float16)
    moved = np.array([1.0, 1.0, 2**-19], np.float16)  # tiny absolute change near zero: below 1 ulp of RMS
    assert verification.ulp_gap(near_zero, moved, ir.DataType.FLOAT16) < 1.0
    assert verification.ulp_gap(a, np.array([1.0, np.nan, 0.0], np.float16), ir.DataType.FLOAT16) == np.inf


# --- CLI


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_optimize_summary(model_file, tmp_path, capsys):
    out_path = str(tmp_path / "out.onnx")
    before = digest(model_file)
    code, out, err = run_cli(capsys, "optimize", model_file, "-o", out_path)
    assert code == EXIT_OK, err
    assert "fused 3 block(s)" in out
    assert f"{_op.BRANCH_NORM}: 3 -> 0" in out and f"{_op.OP_TYPE}: 0 -> 3" in out
    assert "time: fuse" in out
    assert digest(model_file) == before
    assert count(onnx.load(out_path), _op.OP_TYPE) == 3
    assert sorted(os.listdir(tmp_path)) == ["in.onnx", "out.onnx"]  # no temporary left, no data file


def test_cli_report_json(model_file, tmp_path, capsys):
    report_path = tmp_path / "report.json"
    code, _, err = run_cli(capsys, "optimize", model_file, "-o", str(tmp_path / "o.onnx"), "--report", str(report_path))
    assert code == EXIT_OK, err
    data = json.loads(report_path.read_text())
    assert data["ops_after"][_op.OP_TYPE] == 3 and _op.BRANCH_NORM not in data["ops_after"]
    assert data["nodes_before"] > data["nodes_after"]
    assert data["verify"] is None and "fusion" in data


def test_cli_verify(model_file, tmp_path, capsys, hcfuse_lib):
    report_path = tmp_path / "report.json"
    code, out, err = run_cli(capsys, "optimize", model_file, "-o", str(tmp_path / "o.onnx"), "--verify",
                             "--report", str(report_path))
    assert code == EXIT_OK, err
    assert "PASSED" in out and "hidden_states" in out
    assert json.loads(report_path.read_text())["verify"]["status"] == "passed"


def test_cli_verify_failure_exit_code(model_file, tmp_path, capsys, hcfuse_lib, monkeypatch):
    # A bound no result can meet (gaps are >= 0): the check's failure path, exit 1.
    monkeypatch.setattr(verification, "DEFAULT_MAX_ULP", dict.fromkeys(verification.DEFAULT_MAX_ULP, -1.0))
    code, out, err = run_cli(capsys, "optimize", model_file, "-o", str(tmp_path / "o.onnx"), "--verify")
    assert code == EXIT_VERIFY_FAILED
    assert "FAIL" in out and "verification failed" in err


def test_cli_infer_shapes_flag(model_file, tmp_path, capsys):
    out_path = str(tmp_path / "o.onnx")
    code, _, err = run_cli(capsys, "optimize", model_file, "-o", out_path, "--infer-shapes")
    assert code == EXIT_OK, err
    model = onnx.load(out_path)
    shapes = {vi.name: vi for vi in model.graph.value_info}
    fused = next(n for n in model.graph.node if n.op_type == _op.OP_TYPE)
    pre = shapes[fused.output[0]].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in pre] == ["batch", "seq", H]


def test_cli_unfuse_and_infer_shapes_commands(tmp_path, capsys):
    fused_path, unfused_path, inferred_path = (str(tmp_path / n) for n in ("f.onnx", "u.onnx", "i.onnx"))
    onnx.save(hcfuse.optimize(small()), fused_path)
    code, out, err = run_cli(capsys, "unfuse", fused_path, "-o", unfused_path)
    assert code == EXIT_OK, err
    assert "expanded 3" in out
    assert count(onnx.load(unfused_path), _op.OP_TYPE) == 0
    code, out, err = run_cli(capsys, "infer-shapes", fused_path, "-o", inferred_path)
    assert code == EXIT_OK, err
    assert len(onnx.load(inferred_path).graph.value_info) > 0


def test_cli_zero_fusions_warns(tmp_path, capsys):
    path = tmp_path / "plain.onnx"
    onnx.save(plain_model(), path)
    code, out, err = run_cli(capsys, "optimize", str(path), "-o", str(tmp_path / "o.onnx"))
    assert code == EXIT_OK
    assert "fused 0 block(s)" in out
    assert "warning: no hyper-connection block was fused" in err


@pytest.mark.parametrize("case, message", [
    ("missing", "no such file"),
    ("not_onnx", "not an ONNX model"),
    ("no_out_dir", "output directory"),
])
def test_cli_io_errors(case, message, model_file, tmp_path, capsys):
    src, dst = model_file, str(tmp_path / "o.onnx")
    if case == "missing":
        src = str(tmp_path / "absent.onnx")
    elif case == "not_onnx":
        src = str(tmp_path / "notes.onnx")
        with open(src, "w") as f:
            f.write("this is not a model\n")
    else:
        dst = str(tmp_path / "no" / "such" / "dir" / "o.onnx")
    code, out, err = run_cli(capsys, "optimize", src, "-o", dst)
    assert code == EXIT_ERROR
    assert message in err and len(err.strip().splitlines()) == 1, err  # one line, no traceback
    assert "Traceback" not in err and not os.path.exists(dst)


def test_cli_debug_shows_traceback(tmp_path, capsys):
    code, _, err = run_cli(capsys, "optimize", str(tmp_path / "absent.onnx"), "-o", str(tmp_path / "o.onnx"), "--debug")
    assert code == EXIT_ERROR and "Traceback" in err and "no such file" in err


def test_cli_output_is_input(model_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["optimize", model_file, "-o", model_file])
    assert e.value.code == EXIT_ERROR
    assert "is the input" in capsys.readouterr().err
    # the same file by another name (a hard link) is refused too, after loading
    link = str(tmp_path / "link.onnx")
    os.link(model_file, link)
    code, _, err = run_cli(capsys, "optimize", model_file, "-o", link)
    assert code == EXIT_ERROR and "output is the input" in err


def test_cli_bad_arguments(capsys):
    for argv in (["optimize", "x.onnx"], ["frobnicate"], ["demo", "--blocks", "0"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == EXIT_ERROR
    assert "usage:" in capsys.readouterr().err


def test_cli_external_data(tmp_path, capsys):
    src = str(tmp_path / "ext.onnx")
    save_decode_model(src, 3, C=C, H=H, R=R, external_data=True)
    before = digest(src, src + ".data")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dst = str(out_dir / "fused.onnx")
    code, _, err = run_cli(capsys, "optimize", src, "-o", dst, "--infer-shapes")
    assert code == EXIT_OK, err
    assert digest(src, src + ".data") == before
    assert sorted(os.listdir(out_dir)) == ["fused.onnx", "fused.onnx.data"]
    proto = onnx.load(dst, load_external_data=False)
    typed = {vi.name for vi in [*proto.graph.value_info, *proto.graph.output] if vi.type.tensor_type.HasField("shape")}
    assert typed >= {n.output[0] for n in proto.graph.node}
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"fused.onnx.data"}
    reloaded = model_io.load(dst)
    assert count(reloaded, _op.OP_TYPE) == 3
    # weights read back from the new data file equal the original's
    fused_weights = {n: v.const_value.numpy() for n, v in reloaded.graph.initializers.items()}
    original = model_io.load(src).graph.initializers
    shared = [n for n in fused_weights if n in original and "proj" in n]
    assert shared
    for n in shared:
        np.testing.assert_array_equal(fused_weights[n], original[n].const_value.numpy())
    # the halves of each packed [C*H, R+C] weight, written by parallel writers, are its exact columns
    halves = [n for n in fused_weights if n.endswith((".down", ".inject"))]
    assert len(halves) == 2 * 3
    for n in halves:
        packed_name, half = n.rsplit(".", 1)
        packed = original[packed_name].const_value.numpy()
        expected = packed[:, :R] if half == "down" else packed[:, R:]
        np.testing.assert_array_equal(fused_weights[n], expected)


def test_cli_failure_mid_save_leaves_no_output(tmp_path, capsys):
    """A truncated data file is refused at load, before any work (a failure during the save itself:
    tests/files/test_pipeline.py)."""
    src = str(tmp_path / "ext.onnx")
    save_decode_model(src, 3, C=C, H=H, R=R, external_data=True, packed=False)
    size = os.path.getsize(src + ".data")
    with open(src + ".data", "r+b") as f:
        f.truncate(size - 64)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, _, err = run_cli(capsys, "optimize", src, "-o", str(out_dir / "fused.onnx"))
    assert code == EXIT_ERROR
    assert "hcfuse optimize: error:" in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(out_dir) == []


def test_cli_keeps_existing_output_on_failure(tmp_path, capsys):
    src = str(tmp_path / "ext.onnx")
    save_decode_model(src, 2, C=C, H=H, R=R, external_data=True, packed=False)
    with open(src + ".data", "r+b") as f:
        f.truncate(os.path.getsize(src + ".data") - 64)
    dst = tmp_path / "old.onnx"
    dst.write_bytes(b"previous contents")
    code, _, _ = run_cli(capsys, "optimize", src, "-o", str(dst))
    assert code == EXIT_ERROR
    assert dst.read_bytes() == b"previous contents"


def test_cli_lib_path(capsys):
    try:
        expected = hcfuse.get_library_path()
    except FileNotFoundError:
        expected = None
    code, out, err = run_cli(capsys, "lib-path")
    if expected is None:
        assert code == EXIT_ERROR and "kernels were not built" in err
    else:
        assert code == EXIT_OK and out.strip() == expected


def test_python_m_hcfuse_subprocess(model_file, tmp_path):
    env = {**os.environ, "PYTHONPATH": HCFUSE_HOME + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out_path = str(tmp_path / "o.onnx")
    proc = subprocess.run([sys.executable, "-m", "hcfuse", "optimize", model_file, "-o", out_path],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert "fused 3 block(s)" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "hcfuse", "optimize", str(tmp_path / "absent.onnx"), "-o", out_path],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == EXIT_ERROR
    assert proc.stderr.strip().count("\n") == 0 and "no such file" in proc.stderr


def test_cli_demo(tmp_path, capsys, hcfuse_lib):
    code, out, err = run_cli(capsys, "demo", "--blocks", "3", "--out-dir", str(tmp_path))
    assert code == EXIT_OK, err
    assert "fused 3 block(s)" in out and "PASSED" in out
    assert sorted(os.listdir(tmp_path)) == ["demo.fused.onnx", "demo.onnx"]


def test_cli_refuses_overwriting_the_inputs_data(tmp_path, capsys):
    """a.onnx keeps its weights in b.onnx.data: writing b.onnx (data b.onnx.data) would clobber them."""
    src = str(tmp_path / "a.onnx")
    model = ir.from_proto(small(2))
    ir.save(model, src, external_data="b.onnx.data", size_threshold_bytes=0)
    before = digest(src, str(tmp_path / "b.onnx.data"))
    code, _, err = run_cli(capsys, "optimize", src, "-o", str(tmp_path / "b.onnx"))
    assert code == EXIT_ERROR and "is read by the input model" in err
    assert digest(src, str(tmp_path / "b.onnx.data")) == before
    assert not os.path.exists(tmp_path / "b.onnx")


def test_cli_verify_bfloat16_on_cpu_is_not_verified(tmp_path, capsys, hcfuse_lib):
    """A --verify that cannot run exits with its own status and says what was written and why."""
    src, dst = str(tmp_path / "bf16.onnx"), str(tmp_path / "o.onnx")
    onnx.save(small(2, dtype=ml_dtypes.bfloat16), src)
    code, out, err = run_cli(capsys, "optimize", src, "-o", dst, "--verify")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert code == EXIT_OK and "PASSED" in out, out + err
    else:
        assert code == EXIT_NOT_VERIFIED and code not in (EXIT_OK, EXIT_VERIFY_FAILED, EXIT_ERROR)
        assert "not verified" in out
        [line] = err.strip().splitlines()
        assert f"NOT VERIFIED: wrote {dst}" in line and "bfloat16" in line
        assert count(onnx.load(dst), _op.OP_TYPE) == 2


def test_cli_summary_names_rejected_blocks(tmp_path, capsys):
    model = ir.from_proto(small(3))
    norm = next(n for n in model.graph if n.name == "/model/layers.0/mlp_hyper_connection/hc_norm")
    model.graph.outputs.append(norm.outputs[0])
    src = str(tmp_path / "in.onnx")
    ir.save(model, src)
    code, out, err = run_cli(capsys, "optimize", src, "-o", str(tmp_path / "o.onnx"))
    assert code == EXIT_OK, err
    assert "fused 2 block(s)" in out and "left unfused: 1 candidate(s)" in out
    assert f"{norm.name}: intermediate" in out and "graph output" in out


def test_verify_fused_node_with_weights_as_inputs(hcfuse_lib):
    """Random weights fed as inputs are scaled like real ones (1/sqrt(rows)): the library's op against
    its unfused chain."""
    from hcfuse.models.hc_block import make_fused_node_model

    fused = make_fused_node_model(C=C, H=H, R=R, dtype=np.float16, prologue=True, streams_out=True,
                                  gate_div=4.0, gate_mul=2.0, silu_alpha=0.25, reduction_scale=0.25)
    result = hcfuse.verify(hcfuse.unfuse(fused), fused, providers=["CPUExecutionProvider"], rows=7)
    assert result.status == "passed", result.summary()
    assert [g.name for g in result.outputs] == list(_op.OUTPUTS)
    assert result.input_shapes["down_weight"] == [C * H, R] and result.input_shapes["streams"] == [7, C * H]


def test_verify_fails_on_a_missing_output(hcfuse_lib):
    original = small(2)
    fused = ir.from_proto(hcfuse.optimize(original))
    fused.graph.outputs[0].name = "renamed"
    result = hcfuse.verify(original, fused, providers=["CPUExecutionProvider"])
    assert result.status == "failed"
    assert "output 'hidden_states'" in result.reason and "missing" in result.reason
    assert result.reason in result.summary()


def test_cli_refuses_writing_over_the_inputs_data_file(tmp_path, capsys):
    """-o naming the input's external data file would replace the weights the input reads."""
    src = str(tmp_path / "a.onnx")
    ir.save(ir.from_proto(small(2)), src, external_data="w.data", size_threshold_bytes=0)
    data = str(tmp_path / "w.data")
    before = digest(src, data)
    code, _, err = run_cli(capsys, "optimize", src, "-o", data)
    assert code == EXIT_ERROR and "input model's external data file" in err
    assert digest(src, data) == before


@pytest.mark.parametrize("target, message", [
    ("input", "would overwrite the input model"),
    ("output", "would overwrite the output model"),
    ("directory", "is a directory"),
    ("missing_dir", "report directory"),
])
def test_cli_report_path_checked_before_any_work(target, message, model_file, tmp_path, capsys):
    out_path = str(tmp_path / "o.onnx")
    report = {"input": model_file, "output": out_path, "directory": str(tmp_path),
              "missing_dir": str(tmp_path / "no" / "r.json")}[target]
    before = digest(model_file)
    code, out, err = run_cli(capsys, "optimize", model_file, "-o", out_path, "--report", report)
    assert code == EXIT_ERROR and message in err and len(err.strip().splitlines()) == 1, err
    assert digest(model_file) == before
    assert not os.path.exists(out_path) and out == ""  # refused before fusing or writing anything


def test_verify_bound_per_type_keeps_the_defaults_of_other_types(hcfuse_lib):
    original = small(2)  # float32
    fused = hcfuse.optimize(original)
    cpu = ["CPUExecutionProvider"]
    assert hcfuse.verify(original, fused, providers=cpu, max_ulp={ir.DataType.FLOAT16: 0.0}).status == "passed"
    assert hcfuse.verify(original, fused, providers=cpu, max_ulp={ir.DataType.FLOAT: -1.0}).status == "failed"
