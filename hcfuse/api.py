"""Public Python API: optimize (fuse), unfuse and verify models in memory, and the same on files.

optimize/unfuse take an onnx.ModelProto or an onnx_ir.Model and return the same kind; the input is
never modified (the work happens on a copy whose weights are shared, not read).
optimize_file/unfuse_file/infer_shapes_file take paths and do what the ``hcfuse`` command does, with
its guarantees (hcfuse.files.pipeline): input untouched, model and data committed together.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import onnx
import onnx_ir as ir

from hcfuse.files.pipeline import FileResult, infer_shapes_file, optimize_file, unfuse_file
from hcfuse.checking.unfusion import unfuse as _unfuse_in_place
from hcfuse.checking.verification import VerifyResult, verify

__all__ = ["FileResult", "VerifyResult", "infer_shapes_file", "optimize", "optimize_file", "optimize_with_report",
           "unfuse", "unfuse_file", "verify"]


def _on_copy(model, transform: Callable[[ir.Model], object]):
    """Applies transform (in place) to a copy of model; returns (copy of the input's kind, result)."""
    if isinstance(model, onnx.ModelProto):
        work = ir.from_proto(model)  # new IR objects; tensors wrap the proto's, read only
        result = transform(work)
        return ir.to_proto(work), result
    if isinstance(model, ir.Model):
        work = model.clone()  # new graph, nodes and values; tensors shared, never written
        result = transform(work)
        return work, result
    raise TypeError(f"hcfuse: expected an onnx.ModelProto or onnx_ir.Model; got {type(model).__name__}")


def _fuse(model: ir.Model, debug: bool):
    from hcfuse.rewrite import fuse_with_report

    report = fuse_with_report(model, debug=debug)  # registers the schema and the opset import too
    if debug:
        import json

        print(json.dumps(report.to_dict(), indent=1, default=str), file=sys.stderr)
    return report


def optimize_with_report(model, *, debug: bool = False):
    """Fuses every hyper-connection block; returns (model of the input's kind, FusionReport).

    The report lists each fused block (.fused) and each rejected candidate with its reason
    (.rejected); .counts_by_rule() and .to_dict() summarize it. debug prints it to stderr.
    """
    return _on_copy(model, lambda work: _fuse(work, debug))


def optimize(model, *, debug: bool = False):
    """Fuses every hyper-connection block; returns a model of the input's kind (input untouched)."""
    return optimize_with_report(model, debug=debug)[0]


def unfuse(model):
    """Expands every fused node back into the stock contrib-op chain (input untouched)."""
    return _on_copy(model, _unfuse_in_place)[0]
