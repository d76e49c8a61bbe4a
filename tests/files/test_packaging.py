"""What the installed package carries: its version, the builders the demo and tests use, no path
tricks; and the shared helpers (one session factory, one ulp measure)."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx_ir as ir
import pytest

import hcfuse
from hcfuse import _op
from hcfuse.files import model_io
from hcfuse.checking._session import CPU, inference_session
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights
from hcfuse.checking.verification import scaled_ulp, ulp_gap

HCFUSE_HOME = os.path.dirname(os.path.dirname(os.path.abspath(hcfuse.__file__)))


def test_version_comes_from_the_package_metadata():
    try:
        expected = importlib.metadata.version("hcfuse")
    except importlib.metadata.PackageNotFoundError:  # a source tree on the path: pyproject.toml beside it
        tomllib = pytest.importorskip("tomllib")
        with open(os.path.join(HCFUSE_HOME, "pyproject.toml"), "rb") as f:
            expected = tomllib.load(f)["project"]["version"]
    assert hcfuse.__version__ == expected


def test_no_module_of_the_package_edits_sys_path():
    sources = list(pathlib.Path(hcfuse.__file__).parent.rglob("*.py"))  # the package imported (installed or not)
    assert any(p.name == "qwen_decode.py" for p in sources), "the builders ship in the package"
    assert [str(p) for p in sources if "sys.path" in p.read_text()] == []


@pytest.mark.parametrize("folder", [False, True], ids=["model", "genai-folder"])
def test_builder_command_runs_outside_the_checkout(tmp_path, folder):
    """python -m hcfuse.models.build works wherever hcfuse is importable (cwd is not the repository)."""
    out = tmp_path / ("folder" if folder else "m.onnx")
    env = {**os.environ, "PYTHONPATH": HCFUSE_HOME + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "hcfuse.models.build", str(out), "--blocks", "2", "--hidden", "16", "--rank", "8",
           "--dtype", "float32", *(["--genai-folder"] if folder else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    model = model_io.load(out / "model.onnx" if folder else out)
    assert sum(node.op_type == _op.BRANCH_NORM for node in model.graph) == 2
    if folder:
        assert (out / "genai_config.json").is_file() and (out / "model.onnx.data").is_file()


def test_session_factory(rng, hcfuse_lib, tmp_path):
    """One factory: hcfuse's library registered by default, none on request, paths and protos alike."""
    C, H, R = 4, 16, 8
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32, weights_as_inputs=False,
                                  weights=random_weights(C, H, R, np.float32, rng))
    feeds = random_activations((3,), C, H, np.float32, rng)
    expected = inference_session(model).run(None, feeds)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    got = inference_session(path, [CPU], library=hcfuse_lib, intra_op_threads=1,
                            config={"session.intra_op.allow_spinning": "0"}).run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got))
    with pytest.raises(Exception, match=_op.OP_TYPE):
        inference_session(model, library=False)


def test_scaled_ulp_is_per_element_and_ulp_gap_is_its_max():
    expected = np.array([1.0, 2.0, np.nan, np.inf, 1e-4], np.float16)
    actual = np.array([1.0 + 2**-10, 2.0, np.nan, np.inf, 0.0], np.float16)
    gaps = scaled_ulp(expected, actual)
    assert gaps.shape == expected.shape
    assert gaps[0] == 1.0 and gaps[1] == 0.0 and gaps[2] == 0.0 and gaps[3] == 0.0
    assert 0.0 < gaps[4] < 1.0  # measured at the rms of the finite values, not at 1e-4's own spacing
    assert ulp_gap(expected, actual, ir.DataType.FLOAT16) == float(gaps.max())
    assert np.isinf(scaled_ulp(expected, np.array([1, 2, 0, np.inf, 0], np.float16))[2])
    with pytest.raises(ValueError, match="shapes differ"):
        scaled_ulp(expected, actual[:2])
