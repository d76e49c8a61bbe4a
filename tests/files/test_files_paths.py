"""No output file of a run (model, data file, report) may be an input file of that run (model or any
of its data files), however the path is spelled: each command exits 2 with one line naming both,
and leaves every file as it was."""

from __future__ import annotations

import hashlib
import os

import onnx_ir as ir
import pytest

import hcfuse
from hcfuse.files import model_io
from hcfuse.cli import EXIT_ERROR, main
from hcfuse.models.qwen_decode import make_decode_model

C, H, R = 4, 16, 8


def _digests(directory) -> dict[str, str]:
    out = {}
    for entry in sorted(os.listdir(directory)):
        path = os.path.join(directory, entry)
        if os.path.islink(path):
            out[entry] = "link->" + os.readlink(path)
        elif os.path.isdir(path):
            out[entry] = f"dir {sorted(os.listdir(path))}"
        else:
            out[entry] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def _write_input(directory, command: str, model_name: str, data_name: str) -> None:
    """The input model file `model_name` with all its weights in `data_name`."""
    model = ir.from_proto(make_decode_model(2, C=C, H=H, R=R))
    if command == "unfuse":
        model = hcfuse.optimize(model)
    ir.save(model, os.path.join(directory, model_name), external_data=data_name, size_threshold_bytes=0)


# case: (input model name, its data file name, -o, --report or None, the input file named in the error)
CASES = {
    "output_is_input_via_relative_path": ("in.onnx", "w.bin", "./sub/../in.onnx", None, "in.onnx"),
    "output_is_input_via_symlink": ("in.onnx", "w.bin", "link.onnx", None, "in.onnx"),
    "output_is_input_via_hard_link": ("in.onnx", "w.bin", "hard.onnx", None, "in.onnx"),
    "output_is_input_data": ("in.onnx", "w.bin", "w.bin", None, "w.bin"),
    "output_is_input_data_via_symlink": ("in.onnx", "w.bin", "wlink.onnx", None, "w.bin"),
    "output_data_is_input_model": ("m.onnx.data", "w.bin", "m.onnx", None, "m.onnx.data"),
    "output_data_is_input_data": ("in.onnx", "o.onnx.data", "o.onnx", None, "o.onnx.data"),
    "output_data_is_input_data_via_symlinked_dir": ("in.onnx", "o.onnx.data", "alias/o.onnx", None, "o.onnx.data"),
    "report_is_input_model": ("in.onnx", "w.bin", "o.onnx", "in.onnx", "in.onnx"),
    "report_is_input_data": ("in.onnx", "w.bin", "o.onnx", "./w.bin", "w.bin"),
}
COMMANDS = ["optimize", "unfuse", "infer-shapes"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", list(CASES))
def test_an_output_that_is_an_input_is_refused(case, command, tmp_path, monkeypatch, capsys):
    model_name, data_name, output, report, named = CASES[case]
    if report is not None and command != "optimize":
        pytest.skip("only optimize writes a report")
    monkeypatch.chdir(tmp_path)
    _write_input(tmp_path, command, model_name, data_name)
    os.mkdir("sub")
    os.symlink(model_name, "link.onnx")
    os.symlink(data_name, "wlink.onnx")
    os.link(model_name, "hard.onnx")
    os.symlink(".", "alias")
    before = _digests(tmp_path)
    argv = [command, model_name, "-o", output, *(["--report", report] if report else [])]
    try:
        code = main(argv)
    except SystemExit as e:  # the same path spelled differently is already a usage error
        code = e.code
    err = capsys.readouterr().err
    assert code == EXIT_ERROR, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert named in lines[0] and (report or output) in lines[0] and "write" in lines[0] and "new path" in lines[0]
    assert _digests(tmp_path) == before  # nothing written, replaced or left behind


@pytest.mark.parametrize("function", [hcfuse.optimize_file, hcfuse.unfuse_file, hcfuse.infer_shapes_file])
def test_the_python_functions_refuse_it_too(function, tmp_path):
    """The issue's case: the input model is named m.onnx.data (weights in w.bin); -o m.onnx would
    write its data file over the input."""
    _write_input(tmp_path, "unfuse" if function is hcfuse.unfuse_file else "optimize", "m.onnx.data", "w.bin")
    before = _digests(tmp_path)
    with pytest.raises(model_io.ModelIOError, match=r"its external data file .*m\.onnx\.data is the input model"):
        function(tmp_path / "m.onnx.data", tmp_path / "m.onnx")
    assert _digests(tmp_path) == before


def test_the_identical_path_is_one_usage_line(tmp_path, capsys):
    _write_input(tmp_path, "optimize", "in.onnx", "w.bin")
    path = str(tmp_path / "in.onnx")
    with pytest.raises(SystemExit) as e:
        main(["optimize", path, "-o", path])
    assert e.value.code == EXIT_ERROR
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is the input" in err, err


def test_a_symlinked_output_is_replaced_not_its_target(tmp_path, capsys):
    """-o naming a symlink to some other file: the link becomes the output, its target is untouched."""
    _write_input(tmp_path, "optimize", "in.onnx", "w.bin")
    target = tmp_path / "elsewhere.onnx"
    target.write_bytes(b"someone else's file")
    os.symlink(target, tmp_path / "out.onnx")
    assert main(["optimize", str(tmp_path / "in.onnx"), "-o", str(tmp_path / "out.onnx")]) == 0
    assert target.read_bytes() == b"someone else's file"
    assert not os.path.islink(tmp_path / "out.onnx")
    assert model_io.load(tmp_path / "out.onnx").graph is not None
