"""The one onnxruntime session factory of hcfuse, its tests and benchmarks.

Graph optimizations are off by default so ONNX Runtime runs exactly the nodes of the model (a test or a
verification compares those nodes, not ORT's fusions of them).
"""

from __future__ import annotations

import os

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


def inference_session(model, providers=(CPU,), *, library: str | os.PathLike | bool = True, optimize: bool = False,
                      intra_op_threads: int = 0, config: dict[str, str] | None = None,
                      log_severity: int | None = None):
    """An onnxruntime.InferenceSession of model (a path, serialized bytes or an onnx.ModelProto).

    providers: names or (name, options) pairs, as onnxruntime takes them. library: the custom-op
    library to register (a path; True: hcfuse's own, get_library_path(); False or None: none). intra_op_threads 0 is ORT's default;
    config: session config entries (add_session_config_entry).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if library is True:
        from hcfuse._library import get_library_path

        library = get_library_path()
    if library:
        options.register_custom_ops_library(os.fspath(library))
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = intra_op_threads
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if log_severity is not None:
        options.log_severity_level = log_severity
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    elif not isinstance(model, (str, bytes)):
        model = model.SerializeToString()
    return ort.InferenceSession(model, options, providers=list(providers))
