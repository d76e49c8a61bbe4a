"""docs/OLIVE.md's Olive configs, run as written on a stock decode model: the GraphSurgeries pass with hcfuse's
surgeon fuses every block (after Olive's int4 quantization too), and the output runs in onnxruntime with
hcfuse registered, matching the model before the fusion. Skipped without olive-ai (``hcfuse[olive]``)."""

from __future__ import annotations

import collections
import copy
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import onnx
import pytest

import hcfuse
from hcfuse.checking.verification import PASSED, verify
from hcfuse.models.qwen_decode import make_decode_model

HAVE_OLIVE = importlib.util.find_spec("olive") is not None
needs_olive = pytest.mark.skipif(not HAVE_OLIVE, reason="olive-ai is not installed (pip install 'hcfuse[olive]')")

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "OLIVE.md"
BLOCKS = 2  # make_decode_model's blocks: one fused node each
SHAPE = dict(C=4, H=64, R=8)


def _doc_configs() -> list[dict]:
    """The doc's JSON blocks in order: the fusion config, then quantize-then-fuse."""
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", DOC.read_text(), re.S)]


def _op_counts(path) -> collections.Counter:
    return collections.Counter(f"{node.domain}::{node.op_type}" for node in onnx.load(str(path)).graph.node)


def _stock_model(folder: pathlib.Path) -> pathlib.Path:
    path = folder / "model.onnx"
    onnx.save(make_decode_model(BLOCKS, **SHAPE), str(path))
    return path


def _passed(original, fused) -> None:
    result = verify(str(original), str(fused))
    assert result.status == PASSED, result


@needs_olive
def test_the_launcher_runs_the_fusion_config(tmp_path):
    config = _doc_configs()[0]
    original = _stock_model(tmp_path)
    (tmp_path / "olive_hcfuse.json").write_text(json.dumps(config))
    package_root = pathlib.Path(hcfuse.__file__).resolve().parents[1]
    env = {**os.environ, "OLIVE_DISABLE_TELEMETRY": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(package_root), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "hcfuse.integrations.olive", "run", "--config", "olive_hcfuse.json"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    fused = tmp_path / config["output_dir"] / "model.onnx"
    counts = _op_counts(fused)
    assert counts["com.microsoft::HyperConnectionLowRankMix"] == BLOCKS, counts
    assert counts["com.microsoft::BranchwiseRMSNorm"] == 0, counts
    _passed(original, fused)


@needs_olive
@pytest.mark.parametrize("symmetric", [True, False])  # without and with (packed uint8) zero points
def test_int4_quantization_then_fusion_gives_the_quantized_op(tmp_path, monkeypatch, symmetric):
    import olive.workflows

    import hcfuse.integrations.olive  # noqa: F401 - registers the surgeon

    monkeypatch.setenv("OLIVE_DISABLE_TELEMETRY", "1")
    monkeypatch.chdir(tmp_path)
    _stock_model(tmp_path)
    config = _doc_configs()[1]
    config["passes"]["int4"]["is_symmetric"] = symmetric
    quantized = tmp_path / "olive-out-quantized" / "model.onnx"
    fused = tmp_path / config["output_dir"] / "model.onnx"
    # olive.workflows.run takes the dict it is given apart: each run gets its own copy
    olive.workflows.run({**copy.deepcopy(config), "passes": {"int4": config["passes"]["int4"]},
                         "output_dir": quantized.parent.name})
    olive.workflows.run(copy.deepcopy(config))

    assert _op_counts(quantized)["com.microsoft::MatMulNBits"] == 3 * BLOCKS  # 2 projections + the sublayer
    counts = _op_counts(fused)
    assert counts["ai.hcfuse::HyperConnectionLowRankMixNBits"] == BLOCKS, counts
    assert counts["com.microsoft::MatMulNBits"] == BLOCKS, counts  # the sublayers' stay
    _passed(quantized, fused)


@needs_olive
def test_a_model_without_blocks_passes_through_unchanged(tmp_path):
    from hcfuse.integrations.olive import HcLowRankMixFusion

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "plain",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)])
    out = HcLowRankMixFusion()(model)  # the call GraphSurgeries makes
    assert [(node.op_type, list(node.input), list(node.output)) for node in out.graph.node] == [("Relu", ["x"], ["y"])]
    assert {opset.domain for opset in out.opset_import} == {""}


@pytest.mark.skipif(HAVE_OLIVE, reason="olive-ai is installed")
def test_without_olive_the_import_says_what_to_install():
    with pytest.raises(ImportError, match=r'pip install "hcfuse\[olive\]"'):
        importlib.import_module("hcfuse.integrations.olive")
