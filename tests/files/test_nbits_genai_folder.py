"""An onnxruntime-genai model folder whose decoder MatMulNBitsQuantizer quantized (an int4 build: symmetric,
block_size 32, accuracy_level 4, every MatMul): hcfuse optimize fuses every block into the quantized op, the
folder verifies on the CPU within verify's bound for quantized blocks, and unfuse gives the int4 chain back."""

from __future__ import annotations

import collections
import os

import numpy as np
import onnx
import pytest

from hcfuse import _op_nbits
from hcfuse._library import library_file_name
from hcfuse.checking._session import inference_session
from hcfuse.cli import EXIT_OK, main
from hcfuse.files import genai_folder, model_io
from hcfuse.models.genai_model_folder import MODEL_FILE
from hcfuse.models.quantized import save_quantized_genai_model_folder

BLOCKS = 3
SHAPE = dict(C=4, H=64, R=16, dtype=np.float16)
INT4 = dict(bits=4, block_size=32, symmetric=True, accuracy_level=4)


@pytest.fixture
def folder(tmp_path) -> str:
    return save_quantized_genai_model_folder(tmp_path / "model", BLOCKS, quantizer=INT4, **SHAPE)


def ops(path) -> collections.Counter:
    """(domain, op type) counts; Constant nodes aside (the builder's constants are nodes, unfuse's initializers)."""
    return collections.Counter((n.domain, n.op_type) for n in model_io.load(path).graph if n.op_type != "Constant")


def test_int4_folder_fuses_and_verifies(folder, tmp_path, hcfuse_lib):
    before = ops(os.path.join(folder, MODEL_FILE))
    assert before[("com.microsoft", "MatMulNBits")] == 3 * BLOCKS  # down+inject, up and the sublayer
    out = str(tmp_path / "fused")
    result = genai_folder.optimize_folder(folder, out, verify=True)
    check = result.pipeline.verify
    assert result.committed and check.passed, check.summary()
    after = ops(os.path.join(out, MODEL_FILE))
    assert after[(_op_nbits.DOMAIN, _op_nbits.OP_TYPE)] == BLOCKS
    assert after[("com.microsoft", "MatMulNBits")] == BLOCKS  # the sublayers' stay
    assert os.path.isfile(os.path.join(out, library_file_name()))
    # the quantized bytes are the quantizer's, in the folder's data file
    fused = onnx.load(os.path.join(out, MODEL_FILE), load_external_data=False)
    assert any(t.name.endswith("input_mix_down_block_inject.MatMul.weight_Q4") for t in fused.graph.initializer)


def test_cli_int4_folder_round_trip(folder, tmp_path, capsys, hcfuse_lib):
    fused, back = str(tmp_path / "fused"), str(tmp_path / "back")
    assert main(["optimize", folder, "-o", fused, "--verify"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"fused {BLOCKS} block(s)" in out and "PASSED" in out, out
    assert main(["unfuse", fused, "-o", back]) == EXIT_OK
    assert ops(os.path.join(back, MODEL_FILE)) == ops(os.path.join(folder, MODEL_FILE))
    inference_session(os.path.join(back, MODEL_FILE), library=False)  # the int4 chain runs without hcfuse
