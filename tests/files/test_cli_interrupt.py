"""Ctrl-C in ``hcfuse``: a real SIGINT to a real process gives one line that says what was written, and
exit status 130; the traceback only with --debug.

The child process sends SIGINT to itself when the run enters one named function (fusing, verifying,
printing the summary after the commit), so each case hits its step exactly; the signal, its
KeyboardInterrupt and everything after it are the real ones.
"""

from __future__ import annotations

import os
import subprocess
import sys

import onnx
import pytest

import hcfuse
from hcfuse.cli import EXIT_INTERRUPTED
from hcfuse.models.qwen_decode import make_decode_model

HCFUSE_HOME = os.path.dirname(os.path.dirname(os.path.abspath(hcfuse.__file__)))

# argv: MODULE:FUNCTION then hcfuse's arguments; SIGINT on entering FUNCTION
CHILD = """
import importlib, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background parent may have left SIGINT ignored
from hcfuse.cli import main
module_name, name = sys.argv[1].split(":")
module = importlib.import_module(module_name)
original = getattr(module, name)
def interrupt(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return original(*args, **kwargs)
setattr(module, name, interrupt)
sys.exit(main(sys.argv[2:]))
"""


def interrupted_run(at: str, *argv: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": HCFUSE_HOME + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", CHILD, at, *argv], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


@pytest.fixture
def model_file(tmp_path) -> str:
    path = str(tmp_path / "in.onnx")
    onnx.save(make_decode_model(2, C=4, H=16, R=8), path)
    return path


def one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize("at", ["hcfuse.rewrite:fuse_with_report", "hcfuse.checking.verification:verify"])
def test_interrupt_before_the_commit_writes_nothing(hcfuse_lib, model_file, tmp_path, at):
    out, report = str(tmp_path / "out.onnx"), str(tmp_path / "report.json")
    proc = interrupted_run(at, "optimize", model_file, "-o", out, "--verify", "--report", report, cwd=tmp_path)
    line = one_line(proc)
    assert line == f"hcfuse optimize: interrupted; {out} was not written; {report} was not written"
    assert not os.path.exists(out) and not os.path.exists(report)


def test_interrupt_keeps_the_previous_output_and_says_so(hcfuse_lib, model_file, tmp_path):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous output")
    proc = interrupted_run("hcfuse.checking.verification:verify", "optimize", model_file, "-o", str(out),
                           "--verify", cwd=tmp_path)
    assert one_line(proc) == f"hcfuse optimize: interrupted; {out} was not written (the previous one is unchanged)"
    assert out.read_bytes() == b"previous output"


def test_interrupt_after_the_commit_says_the_output_was_written(hcfuse_lib, model_file, tmp_path):
    out = str(tmp_path / "out.onnx")
    proc = interrupted_run("hcfuse.cli:_print_optimized", "optimize", model_file, "-o", out, "--verify",
                           cwd=tmp_path)
    assert one_line(proc) == f"hcfuse optimize: interrupted; {out} was written before the interrupt"
    onnx.checker.check_model(out)


def test_interrupt_with_debug_shows_the_traceback(model_file, tmp_path):
    proc = interrupted_run("hcfuse.rewrite:fuse_with_report", "--debug", "optimize", model_file,
                           "-o", str(tmp_path / "out.onnx"), cwd=tmp_path)
    assert proc.returncode == EXIT_INTERRUPTED
    assert "Traceback" in proc.stderr and "KeyboardInterrupt" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("hcfuse optimize: interrupted; ")
