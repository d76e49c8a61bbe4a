"""``hcfuse --help`` and ``--version``: plain text, the exit statuses, the versions and the library."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import onnxruntime
import pytest

import hcfuse
from hcfuse.cli import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NOT_VERIFIED, EXIT_OK, EXIT_VERIFY_FAILED, main

HCFUSE_HOME = os.path.dirname(os.path.dirname(os.path.abspath(hcfuse.__file__)))
COMMANDS = ["optimize", "unfuse", "infer-shapes", "demo", "lib-path"]
# reStructuredText a terminal would show as is: ``literals``, `refs`, :roles:, directives
RST = re.compile(r"``|`[^`\s]|:[a-z]+:`|^\s*\.\. ", re.MULTILINE)


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == EXIT_OK
    return capsys.readouterr().out


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_plain_text(capsys, command):
    text = help_text(capsys, *([command] if command else []))
    assert text.startswith("usage: hcfuse")
    assert not RST.search(text), RST.search(text)


@pytest.mark.parametrize("command", [None, "optimize"])
def test_help_lists_the_exit_statuses(capsys, command):
    text = help_text(capsys, *([command] if command else []))
    statuses = dict(re.findall(r"^  (\d+) +(.+)$", text.split("exit status:")[1], re.MULTILINE))
    assert set(statuses) == {str(c) for c in (EXIT_OK, EXIT_VERIFY_FAILED, EXIT_ERROR, EXIT_NOT_VERIFIED,
                                              EXIT_INTERRUPTED)}
    assert "could not run" in statuses[str(EXIT_NOT_VERIFIED)] and "interrupted" in statuses[str(EXIT_INTERRUPTED)]
    assert len({EXIT_OK, EXIT_VERIFY_FAILED, EXIT_ERROR, EXIT_NOT_VERIFIED, EXIT_INTERRUPTED}) == 5


def test_version_names_hcfuse_onnxruntime_and_the_library():
    env = {**os.environ, "PYTHONPATH": HCFUSE_HOME + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "hcfuse", "--version"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == EXIT_OK and proc.stderr == ""
    try:
        library = hcfuse.get_library_path()
    except FileNotFoundError:
        library = "kernels not built"
    assert proc.stdout.splitlines() == [f"hcfuse {hcfuse.__version__}", f"onnxruntime {onnxruntime.__version__}",
                                        f"library {library}"]
