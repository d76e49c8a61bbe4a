"""The named steps of a commit, and the one place a run announces reaching them.

``reached(step)`` is called at each step below and does nothing. The kill and interrupt tests
replace it inside a child process (tests/files/step_runner.py) to SIGKILL or SIGINT that run at
exactly one step, the commit itself included; the product never reads a test setting.
"""

from __future__ import annotations

# hcfuse.files.model_io.save, in order: the first external tensor written, all written, the staged
# model reading the run's folder written, the commit (one rename), the data under its final name,
# the model reading it in place.
FILE_STEPS = ("writing", "written", "staged", "committed", "data-placed", "finalized")
# hcfuse.files.pipeline: verification of the written model starts (before the commit).
VERIFY_STEP = "verifying"
# hcfuse.files.folder_commit, in order: every file of the new folder written beside OUT_DIR, the
# swap (one rename), the previous folder removed.
FOLDER_STEPS = ("folder-staged", "folder-committed", "folder-finalized")


def reached(step: str) -> None:
    """Called when a run reaches ``step`` (one of the names above); does nothing."""
