"""hcfuse: ONNX tooling for com.microsoft::HyperConnectionLowRankMix.

Importing hcfuse registers the op's ONNX schema (with type and shape inference). The graph tools
(fusion, unfusion, verification, symbolic shape inference) load on first use, so a plain import
stays cheap.
"""

from __future__ import annotations

import importlib

from hcfuse._library import get_library_path, register
from hcfuse._op import DOMAIN, OP_TYPE, SINCE_VERSION
from hcfuse.schema import register_schema

__version__ = "0.1.0"

register_schema()

# public name -> module that defines it (imported on first access)
_LAZY = {
    "optimize": "hcfuse.api",
    "optimize_with_report": "hcfuse.api",
    "unfuse": "hcfuse.api",
    "verify": "hcfuse.api",
    "infer_shapes": "hcfuse.ort_symbolic_shape",
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
    *_LAZY,
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hcfuse' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
