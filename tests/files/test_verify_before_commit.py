"""verify checks the written model before it replaces the previous output: a failed verification or a
Ctrl-C during it leaves the previous output as it was; its time counts in the run's total; dims can
be set by name. An input replaced while the run reads it fails the run, nothing written."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import hcfuse
from hcfuse.checking import verification
from hcfuse.files import genai_folder, model_io, steps, temporaries
from hcfuse.files.progress import Progress
from hcfuse.models.genai_model_folder import save_genai_model_folder
from hcfuse.models.qwen_decode import save_decode_model

C, H, R = 4, 16, 8
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def digests(directory) -> dict[str, str]:
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, directory)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


@pytest.fixture
def previous(tmp_path, hcfuse_lib):
    """Input b, and a directory holding the output of an earlier run on input a."""
    a, b = str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx")
    save_decode_model(a, 2, C=C, H=H, R=R, external_data=True, seed=1)
    save_decode_model(b, 2, C=C, H=H, R=R, external_data=True, seed=2)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    hcfuse.optimize_file(a, out_dir / "o.onnx")
    return b, out_dir


def test_a_failed_verification_commits_nothing(previous, monkeypatch):
    b, out_dir = previous
    before = digests(out_dir)
    # a bound no result can meet (gaps are >= 0): the real comparison, failing
    monkeypatch.setattr(verification, "DEFAULT_MAX_ULP", dict.fromkeys(verification.DEFAULT_MAX_ULP, -1.0))
    result = hcfuse.optimize_file(b, out_dir / "o.onnx", verify=True)
    assert result.verify.status == "failed" and not result.committed and result.files == []
    assert digests(out_dir) == before and result.to_dict()["committed"] is False


def test_a_failed_verification_leaves_the_previous_folder(tmp_path, monkeypatch, hcfuse_lib):
    a = save_genai_model_folder(tmp_path / "a", 2, C=4, H=32, R=8, dtype=np.float16, seed=1)
    b = save_genai_model_folder(tmp_path / "b", 2, C=4, H=32, R=8, dtype=np.float16, seed=2)
    out = tmp_path / "out"
    genai_folder.optimize_folder(a, out)
    before = digests(out)
    monkeypatch.setattr(verification, "DEFAULT_MAX_ULP", dict.fromkeys(verification.DEFAULT_MAX_ULP, -1.0))
    result = genai_folder.optimize_folder(b, out, verify=True)
    assert not result.committed and result.pipeline.verify.status == "failed"
    assert digests(out) == before and sorted(os.listdir(tmp_path)) == ["a", "b", "out"]


def test_verify_time_is_part_of_the_total_and_dims_are_passed(previous):
    b, out_dir = previous
    result = hcfuse.optimize_file(b, out_dir / "o.onnx", verify=True, verify_dims={"batch": 2, "seq": 5})
    assert result.committed and result.verify.passed, result.verify.summary()
    assert result.verify.input_shapes["inputs_embeds"] == [2, 5, H]
    assert result.time_s["total"] >= result.time_s["fuse"] + result.time_s["verify"] > 0


@pytest.mark.parametrize("folder", [False, True])
def test_ctrl_c_during_verify_leaves_the_previous_output(folder, tmp_path, hcfuse_lib):
    if folder:
        a = save_genai_model_folder(tmp_path / "a", 2, C=4, H=32, R=8, dtype=np.float16, seed=1)
        src = save_genai_model_folder(tmp_path / "b", 2, C=4, H=32, R=8, dtype=np.float16, seed=2)
        out = tmp_path / "out"
        genai_folder.optimize_folder(a, out)
        watched, target = out, out
    else:
        a, src = str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx")
        save_decode_model(a, 2, C=C, H=H, R=R, external_data=True, seed=1)
        save_decode_model(src, 2, C=C, H=H, R=R, external_data=True, seed=2)
        (tmp_path / "out").mkdir()
        hcfuse.optimize_file(a, tmp_path / "out" / "o.onnx")
        watched, target = tmp_path / "out", tmp_path / "out" / "o.onnx"
    before = digests(watched)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "step_runner.py"), steps.VERIFY_STEP, "INT", "--",
                           "optimize", str(src), "-o", str(target), "--verify"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (-signal.SIGINT, 130), proc.stderr
    assert digests(watched) == before
    assert not [n for n in os.listdir(os.path.dirname(target)) if temporaries.parse(n)]


class _ReplaceInputAfterFusing(Progress):
    """Another program replaces the input's data file (same size, other weights) while the run is between
    fusing and writing."""

    def __init__(self, data: str, other: str):
        self.data, self.other = data, other

    def stage(self, text: str) -> None:
        if text.startswith("fused"):
            os.replace(self.other, self.data)


def test_an_input_replaced_during_the_run_fails_it(previous, tmp_path):
    b, out_dir = previous
    other = str(tmp_path / "c.onnx")
    save_decode_model(other, 2, C=C, H=H, R=R, external_data=True, seed=3)
    before = digests(out_dir)
    with pytest.raises(model_io.ModelIOError, match=r"b\.onnx\.data: the input changed while hcfuse read it"):
        hcfuse.optimize_file(b, out_dir / "o.onnx", progress=_ReplaceInputAfterFusing(b + ".data", other + ".data"))
    assert digests(out_dir) == before


def test_an_input_written_in_place_during_the_run_fails_it(previous):
    b, out_dir = previous
    before = digests(out_dir)

    class _Rewrite(Progress):
        def stage(self, text: str) -> None:
            if text.startswith("fused"):
                with open(b + ".data", "r+b") as f:
                    f.write(b"\1" * 64)

    with pytest.raises(model_io.ModelIOError, match="the input changed while hcfuse read it"):
        hcfuse.optimize_file(b, out_dir / "o.onnx", progress=_Rewrite())
    assert digests(out_dir) == before
