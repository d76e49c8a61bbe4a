"""Saving a model with one commit point: a reader never sees a half-written output or a model next
to another run's data.

The run writes everything into its own hidden folder beside the output (hcfuse.files.temporaries
names it), then:
1. commit: one os.replace puts a model in place whose external data is the new data inside that
   folder (`.hcfuse-.../OUT.onnx.data`): before it the old pair is whole, after it the new one;
2. the new data takes the name OUT.onnx.data (a hard link replacing the previous run's file);
3. a second os.replace puts the model reading OUT.onnx.data in place; the folder is removed.
A run killed after step 1 leaves a whole new pair, which the next run writing in that directory
completes (steps 2-3, hcfuse.files.stale_runs); a run killed before it leaves only its folder, which
the next run removes. A run interrupted (an exception, Ctrl-C) removes its folder only when the
output does not read it, decided from the output file itself, so no signal between the rename and
the clean-up loses data. Callers that check the written model before it replaces the output
(verify) use ``staged``. Each step announces itself (hcfuse.files.steps).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import shutil
from collections.abc import Callable, Iterator

import onnx
import onnx_ir as ir

from hcfuse.files import steps, temporaries
from hcfuse.files.errors import ModelIOError, one_line
from hcfuse.files.model_checks import external_data_problem
from hcfuse.files.model_loading import (EXTERNAL_THRESHOLD_BYTES, external_tensors, locations,
                                        needs_external_data, tensor_protos)
from hcfuse.files.paths import data_file_name, fsync_path

try:
    import fcntl
except ImportError:  # not POSIX: runs in one directory are not serialized
    fcntl = None

# External data is written by a few threads (copying untouched weights overlaps slicing new ones),
# holding at most this many bytes of materialized tensors at once: peak memory stays small.
SAVE_WORKERS = 4
SAVE_IN_FLIGHT_BYTES = 64 * 1024 * 1024


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


def _write_relocated(source: str, target: str, location: str) -> None:
    """Copies the model file ``source`` to ``target`` with every external location set to ``location``."""
    proto = onnx.load(source, load_external_data=False)
    for tensor in tensor_protos(proto.graph):
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
            fsync_path(self.model_path)
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
        fsync_path(os.path.join(tmp, data_name))
        _write_relocated(self.model_path, staged_path, f"{os.path.basename(tmp)}/{data_name}")
        steps.reached("staged")
        with directory_lock(directory):
            os.replace(staged_path, self.path)  # the commit point: the new model, reading the new data in tmp
            steps.reached("committed")
            finish(tmp, name)
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
            bases = {os.fspath(t.base_dir) or os.path.dirname(t.path) for t in external_tensors(model)} or {directory}
            problem = next(filter(None, (external_data_problem(model, b) for b in sorted(bases))), None)
            raise ModelIOError(f"{path}: writing it failed: {problem or one_line(e)} (did the input's data "
                               "change while hcfuse ran?)") from e
        steps.reached("written")
        yield StagedModel(path, tmp_model, os.path.exists(os.path.join(tmp, data_name)))
    finally:
        if not reads_from(path, tmp):  # after the commit the output reads tmp: a later run completes it
            shutil.rmtree(tmp, ignore_errors=True)


def reads_from(path: str, folder: str) -> bool:
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


def finish(tmp: str, name: str) -> None:
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


def _parallel_save_options() -> dict:
    """Parallel writers where this onnx-ir has them (1.1+); older versions write serially."""
    if "max_workers" not in inspect.signature(ir.save).parameters:
        return {}
    return {"max_workers": SAVE_WORKERS, "max_in_flight_bytes": SAVE_IN_FLIGHT_BYTES}
