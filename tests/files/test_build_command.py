"""`python -m hcfuse.models.build`: its defaults (the full-size model) write weights as external data
instead of failing in protobuf, a model too large to hold inline is refused with one line, small
models stay one file, and --help shows every default."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import hcfuse
from hcfuse import _op
from hcfuse.files import model_io
from hcfuse.models import build

HCFUSE_HOME = os.path.dirname(os.path.dirname(os.path.abspath(hcfuse.__file__)))
SMALL = ["--blocks", "3", "--hidden", "64", "--rank", "16", "--dtype", "float16"]  # CI's command


def test_defaults_write_external_data():
    """The defaults' weights (96 full-size bf16 blocks) do not fit one protobuf: auto picks external data."""
    args = build.parse_args(["m.onnx"])
    assert args.external_data == "auto"
    assert build.external_data(args.external_data, args.blocks, build.decode_options(args))


def test_inline_weights_too_large_for_protobuf_are_refused_with_a_line(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert build.main([str(out), "--external-data", "no"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "--external-data no: the weights are 2.53 GB, more than one protobuf holds" in err
    assert list(tmp_path.iterdir()) == [], "nothing is written"


@pytest.mark.parametrize("flags, data_file", [
    ([], False),                              # auto: small weights stay in the .onnx file
    (["--external-data"], True),              # the flag alone
    (["--external-data", "yes"], True),
    (["--external-data", "no"], False),
], ids=["auto", "flag", "yes", "no"])
def test_small_model_external_data_choice(tmp_path, capsys, flags, data_file):
    out = tmp_path / "small.onnx"
    assert build.main([str(out), *SMALL, *flags]) == 0, capsys.readouterr().err
    assert (tmp_path / model_io.data_file_name(out)).is_file() == data_file
    assert bool(model_io.external_data_paths(model_io.load(out))) == data_file
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out}: 3 blocks, C=4 H=64 R=16 float16")
    assert ("weights in small.onnx.data" in printed) == data_file


def test_genai_folder_keeps_its_data_file(tmp_path, capsys):
    out = tmp_path / "genai_model"
    assert build.main([str(out), "--genai-folder", *SMALL]) == 0, capsys.readouterr().err
    model = model_io.load(out / "model.onnx")
    assert sum(node.op_type == _op.BRANCH_NORM for node in model.graph) == 3
    assert model_io.external_data_paths(model) == {str(out / "model.onnx.data")}


def test_help_shows_every_default():
    env = {**os.environ, "PYTHONPATH": HCFUSE_HOME + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "hcfuse.models.build", "--help"], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    text = " ".join(proc.stdout.split())  # argparse wraps lines at the terminal's width
    q = _op.QWEN_CONFIG
    for default in (f"(default: {q['num_blocks']})", f"(default: {q['num_branches']})", f"(default: {q['hidden']})",
                    f"(default: {q['rank']})", "(default: bfloat16)", "(default: batch,seq)", "(default: matmul)",
                    "(default: 0)", "(default: auto)"):
        assert default in text, f"{default} missing from --help:\n{proc.stdout}"
