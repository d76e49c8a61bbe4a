"""Noticing an input that changes while a run reads it.

Weights are read lazily, by path, while the output is written; a program that replaces or rewrites
an input meanwhile would give an output made of two versions. A run records each input file's
identity and state (device, inode, size, modification time) before it reads the file, and checks
them once everything is written, before the commit: any difference fails the run, nothing written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from hcfuse.files.model_io import ModelIOError


def _signature(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class InputSignatures:
    """The recorded state of the files a run reads."""

    def __init__(self):
        self._recorded: dict[str, tuple | None] = {}

    def record(self, paths: Iterable[str | os.PathLike]) -> None:
        """Records the files' state (before reading them); a file already recorded keeps its first state."""
        for path in paths:
            self._recorded.setdefault(os.path.realpath(path), _signature(os.path.realpath(path)))

    def check(self) -> None:
        """Raises ModelIOError naming the first recorded file that was replaced, written or removed."""
        for path, before in self._recorded.items():
            if _signature(path) != before:
                raise ModelIOError(f"{path}: the input changed while hcfuse read it (replaced, written or removed "
                                   "by another program); nothing was written, run again once it is complete")
