"""The one exception of the file layer: an input or output file problem, worded for one line."""

from __future__ import annotations


class ModelIOError(Exception):
    """An input or output file problem, worded for one line on stderr."""


def one_line(text) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(text).split())
