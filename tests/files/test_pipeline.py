"""hcfuse.optimize_file / unfuse_file / infer_shapes_file and hcfuse.infer_shapes: what the command
line does, from Python, with the same guarantees; weights never read to fuse or to infer shapes;
progress on a terminal as a bar, in logs as lines."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pty
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import hcfuse
from hcfuse import _op
from hcfuse.files import model_io, pipeline
from hcfuse.cli import main
from hcfuse.files.progress import Progress, StageLines, TerminalProgress
from hcfuse.models.qwen_decode import save_decode_model

C, H, R = 4, 16, 8
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sha(*paths) -> list[str]:
    return [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths]


@pytest.fixture
def src(tmp_path) -> str:
    path = str(tmp_path / "in.onnx")
    save_decode_model(path, 3, C=C, H=H, R=R, external_data=True)
    return path


class _Recorder(Progress):
    """Records the stages a run reports, and which stage each open of `watched` happened in."""

    def __init__(self, watched: str):
        self.watched, self.stages, self.opens, self.active = os.path.realpath(watched), ["start"], [], True

    def stage(self, text: str) -> None:
        self.stages.append(text.split()[0])

    def audit(self, event: str, args) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            if os.path.realpath(os.fsdecode(args[0])) == self.watched:
                self.opens.append(self.stages[-1])


@pytest.fixture
def watch():
    """watch(path) -> a _Recorder told of every open of path in this process while the test runs."""
    recorders = []

    def hook(event, args):
        for r in recorders:
            r.audit(event, args)

    sys.addaudithook(hook)  # audit hooks stay for the process: the recorders are switched off below

    def make(path: str) -> _Recorder:
        recorders.append(_Recorder(path))
        return recorders[-1]

    yield make
    for r in recorders:
        r.active = False
    recorders.clear()


def test_optimize_file_does_what_the_command_does(src, tmp_path, hcfuse_lib):
    before = _sha(src, src + ".data")
    out, report = str(tmp_path / "out" / "fused.onnx"), str(tmp_path / "fusion.json")
    os.mkdir(tmp_path / "out")
    result = hcfuse.optimize_file(src, out, verify=True, report=report)
    assert _sha(src, src + ".data") == before
    assert result.files == [out, out + ".data"]
    assert sorted(os.listdir(tmp_path / "out")) == ["fused.onnx", "fused.onnx.data"]
    assert sum(result.fusion.counts_by_rule().values()) == 3
    assert result.ops_after[_op.OP_TYPE] == 3 and _op.BRANCH_NORM not in result.ops_after
    assert result.verify.passed, result.verify.summary()
    data = json.loads(open(report).read())
    assert data == json.loads(json.dumps(result.to_dict(), default=str))
    assert data["verify"]["status"] == "passed" and data["nodes_after"] < data["nodes_before"]


def test_unfuse_file_and_infer_shapes_file(src, tmp_path):
    fused, unfused, inferred = (str(tmp_path / n) for n in ("f.onnx", "u.onnx", "i.onnx"))
    hcfuse.optimize_file(src, fused)
    result = hcfuse.unfuse_file(fused, unfused)
    assert result.expanded == 3 and result.ops_after.get(_op.OP_TYPE, 0) == 0
    assert model_io.load(unfused).graph is not None
    hcfuse.infer_shapes_file(fused, inferred)
    typed = {v.name for v in model_io.load(inferred).graph.outputs if v.shape is not None}
    assert typed == {"hidden_states"}
    proto = onnx.load(inferred, load_external_data=False)
    assert {vi.name for vi in [*proto.graph.value_info, *proto.graph.output]} >= {n.output[0] for n in proto.graph.node}


def test_optimize_file_reads_the_weights_only_while_writing_the_output(src, tmp_path, watch):
    recorder = watch(src + ".data")
    hcfuse.optimize_file(src, str(tmp_path / "o.onnx"), infer_shapes=True, progress=recorder)
    assert recorder.stages[-1] == "saved"
    assert recorder.opens and set(recorder.opens) == {"inferred"}, recorder.opens  # the stage before saving


@pytest.mark.parametrize("how", ["path", "ir", "file"])
def test_infer_shapes_never_reads_the_weights(how, src, tmp_path, watch):
    recorder = watch(src + ".data")
    if how == "path":
        model = hcfuse.infer_shapes(src)
        assert isinstance(model, onnx.ModelProto)
        outputs = {o.name: o for o in model.graph.output}
        assert [d.dim_param or d.dim_value for d in outputs["hidden_states"].type.tensor_type.shape.dim] == [
            "batch", "seq", C * H]
    elif how == "ir":
        loaded = model_io.load(src)
        before = ir.to_proto(loaded).SerializeToString()  # weights stay references: nothing read
        inferred = hcfuse.infer_shapes(loaded)
        assert isinstance(inferred, ir.Model) and inferred is not loaded
        assert ir.to_proto(loaded).SerializeToString() == before  # the caller's model is untouched
        assert all(v.shape is not None for node in inferred.graph for v in node.outputs)
    else:
        hcfuse.infer_shapes_file(src, str(tmp_path / "o.onnx"), progress=recorder)
    if how != "file":
        assert recorder.opens == []
    else:  # copied to the output while saving, never before
        assert set(recorder.opens) == {"loaded"}, recorder.opens


def test_infer_shapes_of_a_path_ignores_the_size_of_the_data_file(tmp_path):
    """A sparse 64 GB data file (nothing on disk): inference reads none of it."""
    path = str(tmp_path / "big.onnx")
    save_decode_model(path, 2, C=C, H=H, R=R, external_data=True)
    with open(path + ".data", "r+b") as f:
        f.truncate(64 << 30)
    code = ("import resource, hcfuse; hcfuse.infer_shapes(%r); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)" % path)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) < 1_000_000  # KB: well below the file's 64 GB


class _TruncateAfterFusing(Progress):
    """Cuts the input's data file short once the model is fused: the save, which reads the weights,
    fails half-way."""

    def __init__(self, data: str):
        self.data = data

    def stage(self, text: str) -> None:
        if text.startswith("fused"):
            with open(self.data, "r+b") as f:
                f.truncate(os.path.getsize(self.data) // 2)


def test_a_failure_while_saving_leaves_the_previous_output(tmp_path):
    src = str(tmp_path / "ext.onnx")
    save_decode_model(src, 3, C=C, H=H, R=R, external_data=True, packed=False)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "o.onnx").write_bytes(b"previous model")
    (out_dir / "o.onnx.data").write_bytes(b"previous data")
    with pytest.raises(model_io.ModelIOError, match=r"writing it failed: initializer '.*ext\.onnx\.data.*truncated"):
        hcfuse.optimize_file(src, str(out_dir / "o.onnx"), progress=_TruncateAfterFusing(src + ".data"))
    assert sorted(os.listdir(out_dir)) == ["o.onnx", "o.onnx.data"]  # nothing half-written, no temporary
    assert (out_dir / "o.onnx").read_bytes() == b"previous model"
    assert (out_dir / "o.onnx.data").read_bytes() == b"previous data"


# ---- progress ------------------------------------------------------------------------------------------


def test_progress_lines_for_logs(src, tmp_path):
    stream = io.StringIO()
    hcfuse.optimize_file(src, str(tmp_path / "o.onnx"), progress=TerminalProgress(stream, min_bytes=0))
    text = stream.getvalue()
    assert "\r" not in text  # no bar in a log
    assert "] loaded" in text and "] fused in" in text and "saving weights:" in text and "] saved" in text


def test_progress_is_quiet_for_small_models(src, tmp_path):
    stream = io.StringIO()
    hcfuse.optimize_file(src, str(tmp_path / "o.onnx"), progress=StageLines(stream))
    assert stream.getvalue() == ""


def test_progress_bar_on_a_terminal(src, tmp_path):
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as stream:
            assert stream.isatty()
            hcfuse.optimize_file(src, str(tmp_path / "o.onnx"), progress=TerminalProgress(stream, min_bytes=0))
        os.set_blocking(master, False)
        text = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            text += chunk
    finally:
        os.close(master)
        os.close(slave)
    text = text.decode(errors="replace")
    assert "\r" in text and "saving weights" in text and "tensor" in text and "100%" in text, text
    assert "] fused in" in text  # the stage lines stay, above the bar
    assert "saving weights: 6/6" not in text  # counts go to the bar, not to lines


def test_optimize_help_shows_an_example(capsys):
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "example:" in out and "hcfuse optimize model.onnx -o model.fused.onnx --verify" in out


def test_pipeline_result_is_json_ready(src, tmp_path):
    result = pipeline.optimize_file(src, str(tmp_path / "o.onnx"))
    data = json.loads(json.dumps(result.to_dict(), default=str))
    assert data["verify"] is None and data["fusion"]["counts_by_rule"] == result.fusion.counts_by_rule()
    assert np.isfinite(result.time_s["total"]) and result.time_s["fuse"] <= result.time_s["total"]
