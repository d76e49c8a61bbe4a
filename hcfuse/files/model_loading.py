"""Loading a model with onnx-ir, checked, weights left on disk; what a loaded model reads and weighs.

Loading never reads weights that live in external data (onnx-ir maps them on demand), so a model
past protobuf's 2 GB limit can be fused in little memory; it checks what onnxruntime would refuse
(hcfuse.files.model_checks) without reading a weight.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import onnx
import onnx_ir as ir

from hcfuse.files.errors import ModelIOError, one_line
from hcfuse.files.model_checks import check_structure, external_data_problem, undefined_input
from hcfuse.files.proto_walk import proto_graphs
from hcfuse.files.sparse_initializers import densify_sparse_initializers

# Inline models must stay below protobuf's 2 GB message limit; leave room for the graph itself.
INLINE_LIMIT_BYTES = 1_800_000_000
# Tensors smaller than this stay inside the .onnx file when external data is written.
EXTERNAL_THRESHOLD_BYTES = 1024
_NOT_READ = "hcfuse-not-read.data"


def load(path: str | os.PathLike) -> ir.Model:
    """Loads and checks a model with onnx-ir; external tensors stay on disk until read, sparse initializers
    become dense ones."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelIOError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ModelIOError(f"{path}: not a file")
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, RuntimeError or ValueError by version
        raise ModelIOError(f"{path}: not an ONNX model ({type(e).__name__}: {one_line(e)})") from e
    # Protobuf parses many non-ONNX byte strings into an empty message: demand a real model.
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelIOError(f"{path}: not an ONNX model (no ir_version or graph in the file)")
    if not any(o.domain in ("", "ai.onnx") for o in proto.opset_import):
        raise ModelIOError(f"{path}: invalid ONNX model: no opset_import for the ONNX domain "
                           "(onnxruntime refuses it; the exporter should set one)")
    try:
        densify_sparse_initializers(proto)  # onnx-ir would drop them
    except ModelIOError as e:
        raise ModelIOError(f"{path}: {e}") from e
    undefined = undefined_input(proto.graph)
    if undefined is not None:  # checked before onnx-ir, which would log a warning and go on
        node, name = undefined
        raise ModelIOError(f"{path}: invalid ONNX model: node {node.name!r} ({node.op_type}) reads {name!r}, "
                           "which no node, graph input or initializer defines (onnxruntime refuses it)")
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:
        raise ModelIOError(f"{path}: invalid ONNX model ({type(e).__name__}: {one_line(e)})") from e
    ir.external_data.set_base_dir(model.graph, os.path.dirname(os.path.abspath(path)))
    problem = external_data_problem(model, os.path.dirname(os.path.abspath(path)))
    if problem is not None:
        raise ModelIOError(f"{path}: {problem}")
    check_structure(model, proto, path)
    return model


def read_by_real_paths(model: ir.Model) -> None:
    """Points every external tensor of a model load() checked at its data file's resolved path.

    load() refused any location outside the model's folder (links resolved), as onnxruntime does;
    onnx-ir's own check also refuses a data file with several hard links, which onnxruntime loads:
    a tensor given by its full path with no base folder is read as it is."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            t = value.const_value
            if isinstance(t, ir.ExternalTensor):
                value.const_value = ir.ExternalTensor(
                    os.path.realpath(t.path), t.offset, t.length, t.dtype, shape=t.shape, name=t.name,
                    doc_string=t.doc_string, metadata_props=dict(t.metadata_props))


def skeleton_proto(model: ir.Model) -> onnx.ModelProto:
    """The model as a proto whose large initializers are external references that are never read.

    Checking and shape inference need initializer shapes and small (shape-like) values only, so
    neither lazy tensors (the fusion's weight slices) nor external tensors are materialized, small
    or large: only small inline values stay.
    """
    swapped = []
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is not None and (tensor.nbytes > EXTERNAL_THRESHOLD_BYTES
                                       or isinstance(tensor, (ir.ExternalTensor, ir.LazyTensor))):
                swapped.append((value, tensor))
                value.const_value = ir.ExternalTensor(
                    _NOT_READ, 0, tensor.nbytes, tensor.dtype, shape=tensor.shape, name=value.name)
    try:
        return ir.to_proto(model)
    finally:
        for value, tensor in swapped:
            value.const_value = tensor


def external_tensors(model: ir.Model) -> list[ir.ExternalTensor]:
    return [v.const_value for graph in model.graphs() for v in graph.initializers.values()
            if isinstance(v.const_value, ir.ExternalTensor)]


def external_data_paths(model: ir.Model) -> set[str]:
    """Absolute paths of the external data files the model's initializers read from."""
    return {os.path.abspath(tensor.path) for tensor in external_tensors(model)}


def initializer_bytes(model: ir.Model) -> int:
    """Total size of the initializers (external ones are sized from metadata, not read)."""
    return sum(
        value.const_value.nbytes
        for graph in model.graphs()
        for value in graph.initializers.values()
        if value.const_value is not None
    )


def needs_external_data(model: ir.Model) -> bool:
    """External data for models that had it or would pass protobuf's limit inline."""
    return bool(external_data_paths(model)) or initializer_bytes(model) > INLINE_LIMIT_BYTES


def tensor_protos(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    for g in proto_graphs(graph):
        yield from g.initializer
        for node in g.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors


def locations(path: str) -> set[str]:
    """The external data locations a model file reads (empty when it is not a readable model)."""
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception:
        return set()
    return {e.value for t in tensor_protos(proto.graph) for e in t.external_data if e.key == "location"}
