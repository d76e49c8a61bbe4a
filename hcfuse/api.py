"""Public Python API: optimize (fuse), unfuse and verify models in memory, and the same on files.

optimize/unfuse take an onnx.ModelProto or an onnx_ir.Model and return the same kind; the input is
never modified (the work happens on a copy whose weights are shared, not read). Sparse initializers, which
onnx-ir cannot hold, come back as dense initializers of the same values.
optimize_file/unfuse_file/infer_shapes_file take paths and do what the ``hcfuse`` command does, with
its guarantees (hcfuse.files.pipeline): input untouched, model and data committed together.
inference_session makes the onnxruntime session a fused model needs (hcfuse's library registered).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

import onnx
import onnx_ir as ir
from onnx import external_data_helper

from hcfuse.files.pipeline import FileResult, infer_shapes_file, optimize_file, unfuse_file
from hcfuse.files.sparse_initializers import densify_sparse_initializers, has_sparse_initializers
from hcfuse.checking.unfusion import unfuse as _unfuse_in_place
from hcfuse.checking.verification import VerifyResult, verify
from hcfuse._library import (add_contrib_opset_import, has_contrib_opset_import, missing_library_message, register,
                             registered_library)

__all__ = ["FileResult", "MissingLibraryError", "VerifyResult", "inference_session", "infer_shapes_file", "optimize",
           "optimize_file", "optimize_with_report", "unfuse", "unfuse_file", "verify"]

class MissingLibraryError(RuntimeError):
    """onnxruntime found no kernel for the fused node: the message says how to register hcfuse's library."""


def _on_copy(model, transform: Callable[[ir.Model], object]):
    """Applies transform (in place) to a copy of model; returns (copy of the input's kind, result)."""
    if isinstance(model, onnx.ModelProto):
        if has_sparse_initializers(model):  # onnx-ir drops them: dense ones in a copy
            dense = onnx.ModelProto()
            dense.CopyFrom(model)
            densify_sparse_initializers(dense)
            model = dense
        work = ir.from_proto(model)  # new IR objects; tensors wrap the proto's, read only
        result = transform(work)
        return ir.to_proto(work), result
    if isinstance(model, ir.Model):
        from hcfuse.rewrite.sort_order import check_defined

        check_defined(model)  # before clone, which fails on such a value with onnx-ir's traceback
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


def _serialized(proto: onnx.ModelProto, what: str) -> bytes:
    if proto.ByteSize() >= onnx.checker.MAXIMUM_PROTOBUF:
        raise ValueError(f"hcfuse.inference_session: {what} imports no com.microsoft opset and is over protobuf's "
                         "2 GB with the import added in memory; add the import to the file "
                         "(hcfuse._library.add_contrib_opset_import) and pass its path")
    return proto.SerializeToString()


def _session_source(model) -> bytes | str:
    """model as onnxruntime takes it, importing com.microsoft when it does not (hcfuse._library.
    has_contrib_opset_import says why); the caller's model and files are never modified."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if has_contrib_opset_import(onnx.load(path, load_external_data=False)):
            return path  # onnxruntime reads the file and its external data itself
        proto = onnx.load(path)  # the weights too: a model given as bytes finds no external data
        external_data_helper.convert_model_from_external_data(proto)
        add_contrib_opset_import(proto)
        return _serialized(proto, path)
    if isinstance(model, bytes):
        proto = onnx.load_from_string(model)
        return _serialized(proto, "the model") if add_contrib_opset_import(proto) else model
    if isinstance(model, ir.Model):
        proto = ir.to_proto(model)  # external tensors stay references, relative to their folder
        tensors = [value.const_value for value in model.graph.initializers.values()]
        for folder in {t.base_dir for t in tensors if isinstance(t, ir.ExternalTensor)}:
            external_data_helper.load_external_data_for_model(proto, os.fspath(folder))
        external_data_helper.convert_model_from_external_data(proto)
        model = proto
    if not isinstance(model, onnx.ModelProto):
        raise TypeError("hcfuse: expected a path, bytes, an onnx.ModelProto or onnx_ir.Model; got "
                        f"{type(model).__name__}")
    if not has_contrib_opset_import(model):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        add_contrib_opset_import(copy)
        model = copy
    return _serialized(model, "the model")


def inference_session(model, session_options=None, *, providers: Sequence = ("CPUExecutionProvider",)):
    """An onnxruntime.InferenceSession of model (a path, bytes, onnx.ModelProto or onnx_ir.Model; never
    modified) with hcfuse's custom-op library registered on session_options (a new SessionOptions when
    None; registering again is a no-op). A model that does not import com.microsoft is given the import
    on a copy (hcfuse._library.has_contrib_opset_import says why). A session that still finds no kernel
    for the fused node (a provider the library has no kernels for) raises MissingLibraryError, one line
    saying what to do.
    """
    import onnxruntime as ort

    options = register(session_options)
    try:
        return ort.InferenceSession(_session_source(model), options, providers=list(providers))
    except Exception as e:  # onnxruntime raises its own exception types, one per status code
        message = missing_library_message(e, registered_library(options))
        if message is None:
            raise
        raise MissingLibraryError(message) from e
