"""Model and data are committed as one, and killed runs leave at most one temporary, which a later
run removes (or, when the kill came after the commit, completes).

The killed runs are real `hcfuse optimize` processes (tests/files/step_runner.py) that SIGKILL or
SIGINT themselves at a named step of hcfuse.files.model_io.save (hcfuse.files.steps); what they leave
is loaded and run in onnxruntime and compared with the outputs of the previous run's pair and of the
new pair.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hcfuse.files import model_io, steps, temporaries
from hcfuse.cli import EXIT_OK, main
from hcfuse.models.qwen_decode import save_decode_model

C, H, R = 4, 16, 8
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step_runner.py")
BEFORE_COMMIT = ("writing", "written", "staged")
AFTER_COMMIT = ("committed", "data-placed", "finalized")


def _sha(*paths) -> dict[str, str]:
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}


def _temporaries(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(temporaries.PREFIX))


def _run(model_path: str, library: str) -> np.ndarray:
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    feed = np.random.default_rng(7).standard_normal((2, 3, H)).astype(np.float32)
    return session.run(None, {"inputs_embeds": feed})[0]


def _killed_optimize(src: str, out: str, step: str, signame: str = "KILL") -> None:
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, RUNNER, step, signame, "--", "optimize", src, "-o", out], env=env,
                          capture_output=True, text=True, timeout=300)
    expected = (-signal.SIGKILL,) if signame == "KILL" else (-signal.SIGINT, 130)  # Ctrl-C: by SIGINT or 130
    assert proc.returncode in expected, (step, proc.returncode, proc.stderr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, hcfuse_lib):
    """Inputs a (the previous run's) and b (this run's), with the outputs each pair must give."""
    root = tmp_path_factory.mktemp("commit")
    inputs = root / "inputs"
    inputs.mkdir()
    a, b = str(inputs / "a.onnx"), str(inputs / "b.onnx")
    save_decode_model(a, 2, C=C, H=H, R=R, external_data=True, seed=1)
    save_decode_model(b, 2, C=C, H=H, R=R, external_data=True, seed=2)
    expected = {}
    for name, src in (("a", a), ("b", b)):
        out = root / f"clean_{name}"
        out.mkdir()
        assert main(["optimize", src, "-o", str(out / "out.onnx")]) == EXIT_OK
        expected[name] = _run(str(out / "out.onnx"), hcfuse_lib)
    assert not np.array_equal(expected["a"], expected["b"])  # the two pairs are told apart
    return {"root": root, "a": a, "b": b, "expected": expected, "old": root / "clean_a",
            "inputs": _sha(a, a + ".data", b, b + ".data"), "library": hcfuse_lib}


def _fresh_output_dir(runs, name: str) -> str:
    """A directory holding the previous run's complete pair out.onnx + out.onnx.data."""
    directory = runs["root"] / name
    shutil.copytree(runs["old"], directory)
    return str(directory)


def _which_pair(runs, out: str) -> str:
    got = _run(out, runs["library"])
    for name in ("a", "b"):
        if np.array_equal(got, runs["expected"][name]):
            return name
    raise AssertionError(f"{out} gives neither the old pair's outputs nor the new pair's (max diff "
                         f"{np.abs(got - runs['expected']['b']).max()} from the new)")


@pytest.mark.parametrize("signame", ["KILL", "INT"])
@pytest.mark.parametrize("step", steps.FILE_STEPS)
def test_a_kill_or_interrupt_at_any_step_leaves_a_whole_pair(step, signame, runs, capsys):
    """Ctrl-C right after the commit's rename, too, leaves the new pair whole (the clean-up never
    removes data the output reads)."""
    directory = _fresh_output_dir(runs, f"{signame}_{step}")
    out = os.path.join(directory, "out.onnx")
    _killed_optimize(runs["b"], out, step, signame)
    assert _sha(runs["a"], runs["a"] + ".data", runs["b"], runs["b"] + ".data") == runs["inputs"]
    assert len(_temporaries(directory)) <= 1
    assert sorted(set(os.listdir(directory)) - set(_temporaries(directory))) == ["out.onnx", "out.onnx.data"]
    assert _which_pair(runs, out) == ("a" if step in BEFORE_COMMIT else "b"), step

    # A later run in the directory (here writing another output) cleans up, completing a committed
    # pair: the output then reads its data under its own name, and nothing is left over.
    assert main(["optimize", runs["a"], "-o", os.path.join(directory, "other.onnx")]) == EXIT_OK
    capsys.readouterr()
    assert _temporaries(directory) == []
    assert sorted(os.listdir(directory)) == ["other.onnx", "other.onnx.data", "out.onnx", "out.onnx.data"]
    locations = {e.value for t in onnx.load(out, load_external_data=False).graph.initializer
                 for e in t.external_data if e.key == "location"}
    assert locations == {"out.onnx.data"}
    assert os.stat(out + ".data").st_nlink == 1
    assert _which_pair(runs, out) == ("a" if step in BEFORE_COMMIT else "b"), step
    model_io.load(out)  # onnx-ir reads it too (no second link left on the data file)


def test_repeated_kills_leave_one_temporary(runs):
    """Each run removes the leftovers of the killed runs before it."""
    directory = _fresh_output_dir(runs, "kills")
    for step in ("writing", "staged", "data-placed"):
        _killed_optimize(runs["b"], os.path.join(directory, "out.onnx"), step)
        assert len(_temporaries(directory)) == 1, step


def test_an_uninterrupted_run_replaces_the_pair(runs, capsys):
    directory = _fresh_output_dir(runs, "replace")
    out = os.path.join(directory, "out.onnx")
    assert main(["optimize", runs["b"], "-o", out]) == EXIT_OK
    capsys.readouterr()
    assert sorted(os.listdir(directory)) == ["out.onnx", "out.onnx.data"]
    assert _which_pair(runs, out) == "b"


def test_an_inline_output_removes_the_data_file_the_old_model_read(runs, tmp_path, capsys):
    directory = _fresh_output_dir(runs, "to_inline")
    src = str(tmp_path / "inline.onnx")
    save_decode_model(src, 2, C=C, H=H, R=R, external_data=False, seed=2)
    assert main(["optimize", src, "-o", os.path.join(directory, "out.onnx")]) == EXIT_OK
    capsys.readouterr()
    assert sorted(os.listdir(directory)) == ["out.onnx"]
    assert _which_pair(runs, os.path.join(directory, "out.onnx")) == "b"


# ---- telling a dead run's temporaries from a live run's ------------------------------------------


def _temp_name(host: str, pid: int, start: int, suffix: str = "") -> str:
    return f"{temporaries.PREFIX}{host}-{pid}-{start}-0123abcd{suffix}"


def test_only_dead_runs_temporaries_are_removed(tmp_path, model_file_factory, capsys):
    me = temporaries._host_id()
    other_host = "ffffffff" if me != "ffffffff" else "eeeeeeee"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen(["sleep", "120"])
    try:
        live_start = temporaries._start_time(live.pid)
        assert live_start is not None
        names = {
            "dead_run": _temp_name(me, dead.pid, 12345),
            "dead_run_report": _temp_name(me, dead.pid, 12345, ".json"),
            "reused_pid": _temp_name(me, live.pid, live_start + 1),  # the pid now belongs to another process
            "live_run": _temp_name(me, live.pid, live_start),
            "this_process": _temp_name(me, os.getpid(), temporaries._start_time(os.getpid())),
            "other_host_recent": _temp_name(other_host, 1, 1),
            "other_host_old": _temp_name(other_host, 2, 2),
            "not_a_temporary": ".hcfuse-notes",
            "old_version_recent": ".hcfuse-a1b2_c3d",
            "old_version_old": ".hcfuse-x9y8z7w6",
        }
        for key, name in names.items():
            path = tmp_path / name
            if key.endswith("report"):
                path.write_text("{")
            else:
                path.mkdir()
                (path / "out.onnx.data").write_bytes(b"partial")
        old = time.time() - temporaries.STALE_AGE_S - 60
        for key in ("other_host_old", "old_version_old"):
            for p in (tmp_path / names[key] / "out.onnx.data", tmp_path / names[key]):
                os.utime(p, (old, old))
        assert main(["optimize", model_file_factory(), "-o", str(tmp_path / "out.onnx")]) == EXIT_OK
        capsys.readouterr()
        kept = {k for k, n in names.items() if os.path.exists(tmp_path / n)}
        assert kept == {"live_run", "this_process", "other_host_recent", "not_a_temporary", "old_version_recent"}
    finally:
        live.kill()
        live.wait()


def test_a_dead_runs_folder_that_the_input_reads_is_kept(runs, tmp_path, capsys):
    """A run killed after its commit leaves out.onnx reading data inside its folder; using that
    out.onnx as the next run's input must not remove or move what it reads."""
    directory = _fresh_output_dir(runs, "input_in_temp")
    out = os.path.join(directory, "out.onnx")
    _killed_optimize(runs["b"], out, "committed")
    [temp] = _temporaries(directory)
    before = _sha(out, os.path.join(directory, temp, "out.onnx.data"))
    assert main(["optimize", out, "-o", os.path.join(directory, "again.onnx")]) == EXIT_OK
    capsys.readouterr()
    assert _temporaries(directory) == [temp]
    assert _sha(out, os.path.join(directory, temp, "out.onnx.data")) == before


@pytest.fixture
def model_file_factory(tmp_path_factory):
    def make() -> str:
        path = str(tmp_path_factory.mktemp("src") / "in.onnx")
        save_decode_model(path, 2, C=C, H=H, R=R, external_data=True)
        return path

    return make
