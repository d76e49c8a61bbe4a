"""Locating the bundled custom-op library and registering it with ONNX Runtime."""

from __future__ import annotations

import importlib.resources
import os
import sys

_LIB_NAMES = {"linux": "libhcfuse_ops.so", "darwin": "libhcfuse_ops.dylib", "win32": "hcfuse_ops.dll"}


def library_file_name() -> str:
    """The library's file name on this platform (libhcfuse_ops.so on Linux)."""
    return _LIB_NAMES.get(sys.platform, "libhcfuse_ops.so")


def get_library_path() -> str:
    """Path of the hcfuse_ops shared library (CPU kernels, plus CUDA kernels when built with them).

    ``HCFUSE_LIBRARY`` overrides the bundled copy (e.g. a debug build).
    """
    override = os.environ.get("HCFUSE_LIBRARY")
    if override:
        if not os.path.isfile(override):
            raise FileNotFoundError(f"HCFUSE_LIBRARY={override!r} is not a file")
        return override
    name = library_file_name()
    path = importlib.resources.files("hcfuse") / "lib" / name
    if not path.is_file():
        raise FileNotFoundError(
            f"hcfuse kernels were not built: {name} is not in {path.parent}. "
            "Install with `pip install -e .` (it compiles kernels/ with CMake), or set HCFUSE_LIBRARY."
        )
    return str(path)


def register(session_options=None):
    """Registers the custom-op library with an onnxruntime.SessionOptions and returns it.

    With no argument a new SessionOptions is made, as onnxruntime-extensions users expect.
    """
    import onnxruntime as ort

    if session_options is None:
        session_options = ort.SessionOptions()
    session_options.register_custom_ops_library(get_library_path())
    return session_options
