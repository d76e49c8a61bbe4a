"""Sparse initializers as dense ones: onnxruntime reads a graph's sparse_initializer, onnx-ir drops it (what
read it would then read a value defined nowhere), so hcfuse turns each into a dense initializer of the same
name and values before onnx-ir sees the model."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from hcfuse.files.errors import ModelIOError
from hcfuse.files.proto_walk import proto_graphs


def sparse_to_dense(sparse: onnx.SparseTensorProto) -> onnx.TensorProto:
    """The dense tensor a SparseTensorProto stands for, named as its values are (ONNX names it so)."""
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in (sparse.values, sparse.indices)):
        raise ModelIOError(f"the sparse initializer {sparse.values.name!r} keeps its values or indices in "
                           "external data, which hcfuse cannot read; store it inline or as a dense initializer")
    values, indices = numpy_helper.to_array(sparse.values), numpy_helper.to_array(sparse.indices)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, tuple(sparse.dims))
    dense = np.zeros(int(np.prod(sparse.dims)), dtype=values.dtype)
    dense[flat] = values
    return numpy_helper.from_array(dense.reshape(tuple(sparse.dims)), sparse.values.name)


def has_sparse_initializers(model: onnx.ModelProto) -> bool:
    return any(len(g.sparse_initializer) for g in proto_graphs(model.graph))


def densify_sparse_initializers(model: onnx.ModelProto) -> int:
    """Moves every graph's (subgraphs' too) sparse initializers to its dense initializers, in place;
    returns how many it moved."""
    moved = 0
    for graph in proto_graphs(model.graph):
        dense = [sparse_to_dense(sp) for sp in graph.sparse_initializer]
        graph.initializer.extend(dense)
        del graph.sparse_initializer[:]
        moved += len(dense)
    return moved
