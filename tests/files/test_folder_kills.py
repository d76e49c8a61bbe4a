"""A folder run is one commit: killed (SIGKILL) or interrupted (SIGINT) at any step, or raced by
another run, OUT_DIR is the complete previous folder or the complete new one, byte for byte.

The runs are real `hcfuse optimize MODEL_DIR -o OUT_DIR` processes (tests/files/step_runner.py) that
signal themselves at a named step (hcfuse.files.steps), the swap itself included; two inputs that
differ in every weight tell the previous folder from the new one.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from hcfuse.files import genai_folder, temporaries
from hcfuse.models.genai_model_folder import save_genai_model_folder

SHAPE = dict(C=4, H=32, R=8, dtype=np.float16)
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RUNNER = os.path.join(HERE, "step_runner.py")
# every step of the folder's commit, and the decoder's own first write and commit inside the new folder
STEPS = ("writing", "committed", "folder-staged", "folder-committed", "folder-finalized")
BEFORE_SWAP = ("writing", "committed", "folder-staged")
# a kill both fresh and over a previous OUT_DIR; Ctrl-C over a previous one (the case where it can lose most)
CASES = [(step, signame, over) for step in STEPS for signame, over in (("KILL", "fresh"), ("KILL", "existing"),
                                                                       ("INT", "existing"))]


def tree(directory) -> dict[str, str] | None:
    """relative path -> sha256 of every file below directory (links named as links); None if absent."""
    if not os.path.lexists(directory):
        return None
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if os.path.islink(path):
                out[rel] = "link -> " + os.readlink(path)
            elif name in files:
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def hcfuse_process(*argv, step=None, signame=None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, RUNNER, step, signame, "--", *argv] if step else [sys.executable, "-m", "hcfuse", *argv]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, hcfuse_lib):
    """Runs every case (two at a time): each writes folder b's fusion into its own OUT_DIR, fresh or
    over folder a's, and stops at its step."""
    root = tmp_path_factory.mktemp("folder_kills")
    a = save_genai_model_folder(root / "a", 2, seed=1, **SHAPE)
    b = save_genai_model_folder(root / "b", 2, seed=2, **SHAPE)
    genai_folder.optimize_folder(a, root / "ref_a" / "out")
    genai_folder.optimize_folder(b, root / "ref_b" / "out")
    old, new = tree(root / "ref_a" / "out"), tree(root / "ref_b" / "out")
    assert old != new and old.keys() == new.keys()

    def run(case):
        step, signame, over = case
        parent = root / f"{step}_{signame}_{over}"
        if over == "existing":
            shutil.copytree(root / "ref_a", parent)
        else:
            parent.mkdir()
        proc = hcfuse_process("optimize", b, "-o", str(parent / "out"), step=step, signame=signame)
        _, err = proc.communicate(timeout=300)
        return case, proc.returncode, err, tree(parent / "out"), sorted(os.listdir(parent))

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = {case: rest for case, *rest in [(r[0], *r[1:]) for r in pool.map(run, CASES)]}
    return {"root": root, "a": a, "b": b, "old": old, "new": new, "results": results}


@pytest.mark.parametrize("step, signame, over", CASES)
def test_a_stopped_folder_run_leaves_the_old_or_the_new_folder(sweep, step, signame, over):
    code, err, out, parent = sweep["results"][step, signame, over]
    signalled = -signal.SIGKILL if signame == "KILL" else -signal.SIGINT
    assert code in (signalled, 130), (code, err)
    before = sweep["old"] if over == "existing" else None
    expected = before if step in BEFORE_SWAP else sweep["new"]
    assert out == expected, (f"OUT_DIR after {signame} at {step} ({over}) is neither whole folder: "
                             f"{sorted(set((out or {}).items()) ^ set((expected or {}).items()))[:6]}")
    leftovers = [n for n in parent if n != "out"]
    assert all(temporaries.parse(n) is not None for n in leftovers) and len(leftovers) <= 1, parent


def test_the_next_run_removes_a_killed_runs_leftovers(sweep, capsys):
    """A later run writing beside OUT_DIR removes the dead run's temporary (the new or old folder) and
    commits its own folder whole."""
    parent = sweep["root"] / "folder-committed_KILL_existing"
    assert any(temporaries.parse(n) for n in os.listdir(parent))
    proc = hcfuse_process("optimize", sweep["b"], "-o", str(parent / "out"))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert os.listdir(parent) == ["out"] and tree(parent / "out") == sweep["new"]


def test_concurrent_runs_into_one_folder_leave_one_whole_folder(sweep, tmp_path):
    """Two runs (inputs a and b) into one OUT_DIR at once: both succeed, and OUT_DIR is one of them."""
    out = str(tmp_path / "out")
    procs = [hcfuse_process("optimize", sweep[name], "-o", out) for name in ("a", "b")]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert tree(out) in (sweep["old"], sweep["new"])
    assert os.listdir(tmp_path) == ["out"]
