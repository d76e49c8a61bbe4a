"""hcfuse: ONNX tooling for com.microsoft::HyperConnectionLowRankMix and its quantized form
ai.hcfuse::HyperConnectionLowRankMixNBits.

Importing hcfuse registers both ops' ONNX schemas (with type and shape inference). The graph tools
(fusion, unfusion, verification, symbolic shape inference) load on first use, so a plain import
stays cheap.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os

from hcfuse._library import get_library_path, register
from hcfuse._op import DOMAIN, OP_TYPE, SINCE_VERSION
from hcfuse.shapes.nbits_schema import register_schema as register_nbits_schema
from hcfuse.shapes.schema import register_schema


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, through the package metadata); from a
    source tree that is not installed, pyproject.toml's beside the package."""
    try:
        return importlib.metadata.version("hcfuse")
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
    try:
        import tomllib  # Python 3.11+

        with open(pyproject, "rb") as f:
            project = tomllib.load(f).get("project", {})
    except (ImportError, OSError, ValueError):
        project = {}
    return project.get("version", "0+unknown") if project.get("name") == "hcfuse" else "0+unknown"


__version__ = _version()

register_schema()
register_nbits_schema()

# public name -> module that defines it (imported on first access)
_LAZY = {
    "optimize": "hcfuse.api",
    "optimize_with_report": "hcfuse.api",
    "unfuse": "hcfuse.api",
    "verify": "hcfuse.api",
    "inference_session": "hcfuse.api",
    "MissingLibraryError": "hcfuse.api",
    "optimize_file": "hcfuse.files.pipeline",
    "unfuse_file": "hcfuse.files.pipeline",
    "infer_shapes_file": "hcfuse.files.pipeline",
    "FileResult": "hcfuse.files.pipeline",
    "infer_shapes": "hcfuse.shapes.ort_symbolic_shape",
    "HcLowRankMixFusionPass": "hcfuse.rewrite",
    "hc_lowrank_mix_rules": "hcfuse.rewrite",
}

__all__ = [
    "DOMAIN",
    "OP_TYPE",
    "SINCE_VERSION",
    "__version__",
    "get_library_path",
    "register",
    "register_schema",
    "register_nbits_schema",
    *_LAZY,
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hcfuse' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
