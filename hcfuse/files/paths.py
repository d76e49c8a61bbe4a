"""Path rules shared by the file layer: the data file beside a model, one file under two names, a
writable output path, a file or folder flushed to disk."""

from __future__ import annotations

import os

from hcfuse.files.errors import ModelIOError


def data_file_name(path: str | os.PathLike) -> str:
    """The external data file written next to ``path``: ``<name>.data``."""
    return os.path.basename(os.fspath(path)) + ".data"


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same path, or both exist and are one file (links too)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def check_writable(path: str | os.PathLike, what: str = "output") -> None:
    """Refuses a file path whose directory is missing or that names a directory."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ModelIOError(f"{path}: {what} directory {directory} does not exist")
    if os.path.isdir(path):
        raise ModelIOError(f"{path}: is a directory, expected a {what} file path")


def fsync_path(path: str | os.PathLike) -> None:
    """Flushes a file, or a folder's entries, to disk (a commit's renames survive a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
