"""Loading and saving models with onnx-ir: lazy, checked external data in; one commit point out.

Loading never reads weights that live in external data (onnx-ir maps them on demand), so a model
past protobuf's 2 GB limit can be fused in little memory; it checks what onnxruntime would refuse
(the ONNX checker, every external tensor's file and byte range) without reading a weight.

Saving never lets a reader see a half-written output or a model next to another run's data. The
run writes everything into its own hidden folder beside the output (hcfuse.files.temporaries names it),
then:
1. commit: one os.replace puts a model in place whose external data is the new data inside that
   folder (`.hcfuse-.../OUT.onnx.data`): before it the old pair is whole, after it the new one;
2. the new data takes the name OUT.onnx.data (a hard link replacing the previous run's file);
3. a second os.replace puts the model reading OUT.onnx.data in place; the folder is removed.
A run killed after step 1 leaves a whole new pair, which the next run writing in that directory
completes (steps 2-3); a run killed before it leaves only its folder, which the next run removes.
A run interrupted (an exception, Ctrl-C) removes its folder only when the output does not read it,
decided from the output file itself, so no signal between the rename and the clean-up loses data.
Callers that check the written model before it replaces the output (verify) use ``staged``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import shutil
from collections.abc import Callable, Iterable, Iterator

import onnx
import onnx_ir as ir

from hcfuse.files import steps, temporaries

try:
    import fcntl
except ImportError:  # not POSIX: runs in one directory are not serialized
    fcntl = None

# Inline models must stay below protobuf's 2 GB message limit; leave room for the graph itself.
INLINE_LIMIT_BYTES = 1_800_000_000
# Tensors smaller than this stay inside the .onnx file when external data is written.
EXTERNAL_THRESHOLD_BYTES = 1024
# External data is written by a few threads (copying untouched weights overlaps slicing new ones),
# holding at most this many bytes of materialized tensors at once: peak memory stays small.
SAVE_WORKERS = 4
SAVE_IN_FLIGHT_BYTES = 64 * 1024 * 1024
_NOT_READ = "hcfuse-not-read.data"


class ModelIOError(Exception):
    """An input or output file problem, worded for one line on stderr."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def load(path: str | os.PathLike) -> ir.Model:
    """Loads and checks a model with onnx-ir; external tensors stay on disk until read."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelIOError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ModelIOError(f"{path}: not a file")
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, RuntimeError or ValueError by version
        raise ModelIOError(f"{path}: not an ONNX model ({type(e).__name__}: {_one_line(e)})") from e
    # Protobuf parses many non-ONNX byte strings into an empty message: demand a real model.
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelIOError(f"{path}: not an ONNX model (no ir_version or graph in the file)")
    if not any(o.domain in ("", "ai.onnx") for o in proto.opset_import):
        raise ModelIOError(f"{path}: invalid ONNX model: no opset_import for the ONNX domain "
                           "(onnxruntime refuses it; the exporter should set one)")
    undefined = _undefined_input(proto.graph)
    if undefined is not None:  # checked before onnx-ir, which would log a warning and go on
        node, name = undefined
        raise ModelIOError(f"{path}: invalid ONNX model: node {node.name!r} ({node.op_type}) reads {name!r}, "
                           "which no node, graph input or initializer defines (onnxruntime refuses it)")
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:
        raise ModelIOError(f"{path}: invalid ONNX model ({type(e).__name__}: {_one_line(e)})") from e
    ir.external_data.set_base_dir(model.graph, os.path.dirname(os.path.abspath(path)))
    problem = _external_data_problem(model, os.path.dirname(os.path.abspath(path)))
    if problem is not None:
        raise ModelIOError(f"{path}: {problem}")
    _check_structure(model, proto, path)
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


def _undefined_input(graph: onnx.GraphProto, outer: frozenset = frozenset()):
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
                found = _undefined_input(sub, frozenset(defined))
                if found is not None:
                    return found
    return None


def _check_structure(model: ir.Model, proto: onnx.ModelProto, path: str) -> None:
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
            raise ModelIOError(f"{where}: {_one_line(e)}") from e


def _external_data_problem(model: ir.Model, base: str) -> str | None:
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


def _external_tensors(model: ir.Model) -> list[ir.ExternalTensor]:
    return [v.const_value for graph in model.graphs() for v in graph.initializers.values()
            if isinstance(v.const_value, ir.ExternalTensor)]


def external_data_paths(model: ir.Model) -> set[str]:
    """Absolute paths of the external data files the model's initializers read from."""
    return {os.path.abspath(tensor.path) for tensor in _external_tensors(model)}


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


def data_file_name(path: str | os.PathLike) -> str:
    """The external data file written next to ``path``: ``<name>.data``."""
    return os.path.basename(os.fspath(path)) + ".data"


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same path, or both exist and are one file (links too)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def check_writable(path: str | os.PathLike, what: str = "output") -> None:
    """Refuses a file path whose directory is missing or that names a directory."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ModelIOError(f"{path}: {what} directory {directory} does not exist")
    if os.path.isdir(path):
        raise ModelIOError(f"{path}: is a directory, expected a {what} file path")


# ---- saving -------------------------------------------------------------------------------------


@contextlib.contextmanager
def directory_lock(directory: str) -> Iterator[None]:
    """Serializes commits and clean-ups of runs writing in one directory (flock on the directory)."""
    fd = os.open(directory, os.O_RDONLY) if fcntl is not None else None
    try:
        if fd is not None:
            with contextlib.suppress(OSError):  # a filesystem without flock: no exclusion
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tensor_protos(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in [*([attr.g] if attr.HasField("g") else []), *attr.graphs]:
                yield from _tensor_protos(sub)


def locations(path: str) -> set[str]:
    """The external data locations a model file reads (empty when it is not a readable model)."""
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception:
        return set()
    return {e.value for t in _tensor_protos(proto.graph) for e in t.external_data if e.key == "location"}


def _write_relocated(source: str, target: str, location: str) -> None:
    """Copies the model file ``source`` to ``target`` with every external location set to ``location``."""
    proto = onnx.load(source, load_external_data=False)
    for tensor in _tensor_protos(proto.graph):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    with open(target, "wb") as f:
        f.write(proto.SerializeToString())
        f.flush()
        os.fsync(f.fileno())


def save(
    model: ir.Model,
    path: str | os.PathLike,
    *,
    external_data: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Writes ``model`` to ``path`` with one commit point (module doc); returns the files written.

    external_data: None picks it when the model had external data or is too big to inline; the
    data goes to ``<path>.data`` beside the model. progress(done, total) is called per
    external tensor written.
    """
    with staged(model, path, external_data=external_data, progress=progress) as written:
        return written.commit()


@dataclasses.dataclass
class StagedModel:
    """A model written into its run's folder beside the output, not yet the output.

    model_path can be loaded and run (its data beside it, in the same folder); commit() makes it
    the output (module doc) and returns the files written."""

    path: str  # the output
    model_path: str
    external: bool

    def commit(self) -> list[str]:
        tmp, name = os.path.split(self.model_path)
        directory = os.path.dirname(self.path)
        data_name = data_file_name(self.path)
        if not self.external:
            _fsync(self.model_path)
            with directory_lock(directory):
                data_path = os.path.join(directory, data_name)
                previous_data = (os.path.exists(data_path) and os.path.exists(self.path)
                                 and data_name in locations(self.path))
                os.replace(self.model_path, self.path)  # the commit point
                steps.reached("committed")
                if previous_data:  # the model it replaced read it; nothing reads it now
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(data_path)
            return [self.path]
        staged_path = os.path.join(tmp, name + ".staged")
        _fsync(os.path.join(tmp, data_name))
        _write_relocated(self.model_path, staged_path, f"{os.path.basename(tmp)}/{data_name}")
        steps.reached("staged")
        with directory_lock(directory):
            os.replace(staged_path, self.path)  # the commit point: the new model, reading the new data in tmp
            steps.reached("committed")
            _finish(tmp, name)
        return [self.path, os.path.join(directory, data_name)]


@contextlib.contextmanager
def staged(
    model: ir.Model,
    path: str | os.PathLike,
    *,
    external_data: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[StagedModel]:
    """Writes ``model`` into a new run folder beside ``path`` and yields it as a StagedModel; on
    leaving, the folder is removed unless the output reads it (a commit that a kill cut short)."""
    path = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(path)
    if external_data is None:
        external_data = needs_external_data(model)
    tmp = os.path.join(directory, temporaries.new_name())
    os.mkdir(tmp)
    try:
        tmp_model = os.path.join(tmp, name)
        data_name = data_file_name(path)
        try:
            if external_data:
                ir.save(model, tmp_model, external_data=data_name, size_threshold_bytes=EXTERNAL_THRESHOLD_BYTES,
                        callback=_save_callback(progress), **_parallel_save_options())
            else:
                ir.save(model, tmp_model)
        except (ValueError, OSError) as e:  # reading a weight failed: say which, where we can tell
            bases = {os.fspath(t.base_dir) or os.path.dirname(t.path) for t in _external_tensors(model)} or {directory}
            problem = next(filter(None, (_external_data_problem(model, b) for b in sorted(bases))), None)
            raise ModelIOError(f"{path}: writing it failed: {problem or _one_line(e)} (did the input's data "
                               "change while hcfuse ran?)") from e
        steps.reached("written")
        yield StagedModel(path, tmp_model, os.path.exists(os.path.join(tmp, data_name)))
    finally:
        if not _reads_from(path, tmp):  # after the commit the output reads tmp: a later run completes it
            shutil.rmtree(tmp, ignore_errors=True)


def _reads_from(path: str, folder: str) -> bool:
    """Whether the model file ``path`` reads external data inside ``folder`` (a sibling of it)."""
    prefix = os.path.basename(folder) + "/"
    return os.path.isdir(folder) and any(loc.startswith(prefix) for loc in locations(path))


def _save_callback(progress):
    """onnx-ir's per-tensor save callback: progress, and the step "writing" after one tensor."""
    written_count = [0]  # writers call back out of order: count calls, not indices

    def callback(_tensor, info):
        written_count[0] += 1
        if progress is not None:
            progress(written_count[0], info.total)
        if written_count[0] == 1:
            steps.reached("writing")

    return callback


def _finish(tmp: str, name: str) -> None:
    """Steps 2-3 of the commit (module doc) for the output ``name`` beside ``tmp``; repeatable."""
    directory = os.path.dirname(tmp)
    data_name = data_file_name(name)
    new_data, second = os.path.join(tmp, data_name), os.path.join(tmp, data_name + ".link")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(second)
    try:
        os.link(new_data, second)
    except OSError:  # a filesystem without hard links: a copy, slower but as safe
        shutil.copyfile(new_data, second)
    os.replace(second, os.path.join(directory, data_name))  # replaces the previous run's data
    steps.reached("data-placed")
    os.replace(os.path.join(tmp, name), os.path.join(directory, name))
    steps.reached("finalized")
    shutil.rmtree(tmp)


def _committed_output(tmp: str) -> str | None:
    """The output name of a run whose folder ``tmp`` the output's current model reads, else None."""
    entries = set(os.listdir(tmp))
    for name in entries:
        if data_file_name(name) in entries and not name.endswith((".staged", ".link")):
            if _reads_from(os.path.join(os.path.dirname(tmp), name), tmp):
                return name
    return None


def remove_stale_temporaries(directory: str | os.PathLike, keep: Iterable[str] = ()) -> list[str]:
    """Removes the temporaries of dead runs in ``directory`` (hcfuse.files.temporaries decides which);
    a run killed after its commit is completed instead. Anything among or holding the files in
    ``keep`` (this run's inputs) is left alone. Returns the paths removed or completed."""
    directory = os.path.abspath(os.fspath(directory))
    keep = [os.path.realpath(k) for k in keep]
    done = []
    with directory_lock(directory):
        for temp in temporaries.stale_in(directory):
            real = os.path.realpath(temp.path)
            if any(k == real or k.startswith(real + os.sep) for k in keep):
                continue
            if os.path.isdir(temp.path) and not os.path.islink(temp.path):
                name = _committed_output(temp.path)
                if name is not None:
                    if os.path.realpath(os.path.join(directory, name)) in keep:
                        continue
                    _finish(temp.path, name)
                else:
                    shutil.rmtree(temp.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp.path)
            done.append(temp.path)
    return done


def _parallel_save_options() -> dict:
    """Parallel writers where this onnx-ir has them (1.1+); older versions write serially."""
    if "max_workers" not in inspect.signature(ir.save).parameters:
        return {}
    return {"max_workers": SAVE_WORKERS, "max_in_flight_bytes": SAVE_IN_FLIGHT_BYTES}
