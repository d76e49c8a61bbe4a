"""Loading and saving models with onnx-ir: lazy external data in, atomic writes out.

Loading never reads weights that live in external data (onnx-ir maps them on demand), so a model
past protobuf's 2 GB limit can be fused in little memory. Saving writes the model (and its external
data, next to it) into a temporary folder in the output's directory and moves the files into place
only when everything is written: a failure never leaves a half-written output.
"""

from __future__ import annotations

import inspect
import os
import shutil
import sys
import tempfile
from collections.abc import Callable

import onnx
import onnx_ir as ir

# Inline models must stay below protobuf's 2 GB message limit; leave room for the graph itself.
INLINE_LIMIT_BYTES = 1_800_000_000
# Tensors smaller than this stay inside the .onnx file when external data is written.
EXTERNAL_THRESHOLD_BYTES = 1024
# External data is written by a few threads (copying untouched weights overlaps slicing new ones),
# holding at most this many bytes of materialized tensors at once: peak memory stays small.
SAVE_WORKERS = 4
SAVE_IN_FLIGHT_BYTES = 64 * 1024 * 1024


class ModelIOError(Exception):
    """An input or output file problem, worded for one line on stderr."""


def load(path: str | os.PathLike) -> ir.Model:
    """Loads a model with onnx-ir; external tensors stay on disk until read."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelIOError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ModelIOError(f"{path}: not a file")
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, RuntimeError or ValueError by version
        raise ModelIOError(f"{path}: not an ONNX model ({type(e).__name__}: {e})") from e
    # Protobuf parses many non-ONNX byte strings into an empty message: demand a real model.
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelIOError(f"{path}: not an ONNX model (no ir_version or graph in the file)")
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:
        raise ModelIOError(f"{path}: invalid ONNX model ({type(e).__name__}: {e})") from e
    ir.external_data.set_base_dir(model.graph, os.path.dirname(os.path.abspath(path)))
    return model


def external_data_paths(model: ir.Model) -> set[str]:
    """Absolute paths of the external data files the model's initializers read from."""
    paths = set()
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                paths.add(os.path.abspath(tensor.path))
    return paths


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


def check_output_path(out_path: str | os.PathLike, in_path: str | os.PathLike | None = None,
                      model: ir.Model | None = None) -> None:
    """Refuses outputs that cannot be written or would overwrite the input or its data."""
    out = os.path.abspath(os.fspath(out_path))
    directory = os.path.dirname(out)
    if not os.path.isdir(directory):
        raise ModelIOError(f"{out_path}: output directory {directory} does not exist")
    if os.path.isdir(out):
        raise ModelIOError(f"{out_path}: is a directory, expected a model file path")
    if in_path is not None and os.path.exists(out) and os.path.samefile(out, in_path):
        raise ModelIOError(f"{out_path}: output is the input file; write to a new path")
    if model is not None:
        data = os.path.join(directory, data_file_name(out))
        for used in external_data_paths(model):
            if same_file(out, used):
                raise ModelIOError(
                    f"{out_path}: output is the input model's external data file {used}; write to a new path"
                )
            if os.path.exists(data) and os.path.samefile(data, used):
                raise ModelIOError(
                    f"{out_path}: its external data file {data} is read by the input model; "
                    "write to a new path"
                )


def save(
    model: ir.Model,
    path: str | os.PathLike,
    *,
    external_data: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Writes ``model`` to ``path`` atomically and returns the files written.

    external_data: None picks it when the model had external data or is too big to inline; the
    data goes to ``<path>.data`` beside the model. progress(done, total) is called per
    external tensor written.
    """
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    if external_data is None:
        external_data = needs_external_data(model)
    data_name = data_file_name(path) if external_data else None
    tmp_dir = tempfile.mkdtemp(prefix=".hcfuse-", dir=directory)
    try:
        tmp_model = os.path.join(tmp_dir, os.path.basename(path))
        callback = None
        if progress is not None:
            written_count = [0]  # writers call back out of order: count calls, not indices

            def callback(_tensor, info):
                written_count[0] += 1
                progress(written_count[0], info.total)
        if data_name is None:
            ir.save(model, tmp_model)
        else:
            ir.save(model, tmp_model, external_data=data_name,
                    size_threshold_bytes=EXTERNAL_THRESHOLD_BYTES, callback=callback, **_parallel_save_options())
        written = []
        # Data first: the model file appears last, so a model never names missing data.
        names = ([data_name] if data_name and os.path.exists(os.path.join(tmp_dir, data_name)) else [])
        for name in [*names, os.path.basename(path)]:
            os.replace(os.path.join(tmp_dir, name), os.path.join(directory, name))
            written.append(os.path.join(directory, name))
        return written
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _parallel_save_options() -> dict:
    """Parallel writers where this onnx-ir has them (1.1+); older versions write serially."""
    if "max_workers" not in inspect.signature(ir.save).parameters:
        return {}
    return {"max_workers": SAVE_WORKERS, "max_in_flight_bytes": SAVE_IN_FLIGHT_BYTES}


def progress_printer(label: str, stream=sys.stderr, every: float = 0.1) -> Callable[[int, int], None]:
    """A progress(done, total) callback printing ``label: k/n`` about every tenth of the way."""
    state = {"next": 0.0}

    def report(done: int, total: int) -> None:
        if total and (done / total >= state["next"] or done == total):
            print(f"{label}: {done}/{total}", file=stream, flush=True)
            state["next"] = done / total + every

    return report
