"""What onnxruntime would refuse in a model, checked without reading a weight: values nothing defines,
nodes that break their schema or lack an opset import, external data outside the model's folder or
shorter than its tensors."""

from __future__ import annotations

import os

import onnx
import onnx_ir as ir

from hcfuse.files.errors import ModelIOError, one_line


def undefined_input(graph: onnx.GraphProto, outer: frozenset = frozenset()):
    """(node, name) of the first node input that nothing in scope defines, or None."""
    defined = set(outer) | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    defined |= {o for node in graph.node for o in node.output}  # any order: onnxruntime sorts
    for node in graph.node:
        missing = next((name for name in node.input if name and name not in defined), None)
        if missing is not None:
            return node, missing
        for attr in node.attribute:
            for sub in [*([attr.g] if attr.HasField("g") else []), *attr.graphs]:
                found = undefined_input(sub, frozenset(defined))
                if found is not None:
                    return found
    return None


def check_structure(model: ir.Model, proto: onnx.ModelProto, path: str) -> None:
    """What onnxruntime refuses when it loads the graph: a value that nothing defines, a node of a
    domain with no opset import, a node that breaks its ONNX schema (input count, attribute
    types). Lenient where onnxruntime is: an unsorted graph is sorted (our own loaded copy), a
    value without a type is inferred later."""
    for graph in model.graphs():
        seen: set[ir.Node] = set()
        unsorted = False
        for node in graph:
            for value in node.inputs:
                producer = value.producer() if value is not None else None
                unsorted |= producer is not None and producer.graph is graph and producer not in seen
            seen.add(node)
        if unsorted:
            graph.sort()
    context = onnx.checker.C.CheckerContext()
    context.ir_version = proto.ir_version
    context.opset_imports = {o.domain: o.version for o in proto.opset_import}
    local_functions = {(f.domain, f.name) for f in proto.functions}
    for node in proto.graph.node:
        where = f"{path}: invalid ONNX model: node {node.name!r} ({node.domain + '::' if node.domain else ''}{node.op_type})"
        if node.domain not in context.opset_imports and not (node.domain == "ai.onnx" and "" in context.opset_imports):
            raise ModelIOError(f"{where}: its domain {node.domain!r} has no opset_import (onnxruntime refuses it)")
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue  # subgraphs read outer-scope values that a single-node check cannot see
        if (node.domain, node.op_type) in local_functions or not onnx.defs.has(node.op_type, node.domain):
            continue  # a model-local function, or an op onnx does not know (onnxruntime's own, e.g.
            # SimplifiedLayerNormalization in the default domain): onnxruntime checks those itself
        try:
            onnx.checker.check_node(node, context)
        except onnx.checker.ValidationError as e:
            raise ModelIOError(f"{where}: {one_line(e)}") from e


def external_data_problem(model: ir.Model, base: str) -> str | None:
    """What is wrong with the external tensors (location outside ``base``, file missing or too
    short for the tensor), naming the tensor and the file; None when nothing is."""
    base = os.path.realpath(base)
    sizes: dict[str, int] = {}
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if not isinstance(tensor, ir.ExternalTensor):
                continue
            where = f"initializer {value.name!r}: external data file {os.fspath(tensor.location)!r}"
            file = os.path.realpath(tensor.path)
            checked = not tensor.base_dir  # read_by_real_paths: its place was checked when loaded
            if not checked and (os.path.isabs(os.fspath(tensor.location)) or os.path.commonpath([base, file]) != base):
                return f"{where} lies outside the model's folder {base} (refused: path traversal)"
            if file not in sizes:
                if not os.path.isfile(file):
                    return f"{where}: {tensor.path} does not exist"
                sizes[file] = os.path.getsize(file)
            offset, needed = tensor.offset or 0, tensor.nbytes
            if tensor.length is not None and tensor.length < needed:
                return f"{where}: length {tensor.length} bytes, but {tensor.dtype.name}{list(tensor.shape)} needs {needed}"
            if offset + needed > sizes[file]:
                return (f"{where}: needs bytes {offset}..{offset + needed} of {tensor.path}, which has "
                        f"{sizes[file]} bytes (truncated?)")
    return None
