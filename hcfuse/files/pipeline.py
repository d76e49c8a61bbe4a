"""The file pipeline behind ``hcfuse optimize``, ``unfuse`` and ``infer-shapes``: paths in, paths out.

Each function loads the input lazily (weights stay on disk), refuses any output that is an input
(hcfuse.files.run_files), removes the temporaries of killed earlier runs beside the output, transforms
the model, writes it beside the output, checks that no input changed meanwhile
(hcfuse.files.unchanged_inputs), verifies the written model when asked, and only then commits model
and data as one (hcfuse.files.model_io). A verification that fails commits nothing (result.committed
is False); one that could not run commits. The input is never modified; a failure or an interrupt
before the commit leaves the previous output, if any, as it was.

    result = hcfuse.optimize_file("model.onnx", "model.fused.onnx", verify=True, report="fusion.json")
    result.fusion.counts_by_rule(), result.verify.passed, result.files
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import time
from collections.abc import Callable

import onnx_ir as ir

from hcfuse.files import model_io, steps, temporaries
from hcfuse.files.progress import Progress
from hcfuse.files.run_files import RunFiles
from hcfuse.files.unchanged_inputs import InputSignatures


@dataclasses.dataclass
class FileResult:
    """What a file run did. fusion (optimize), verify (optimize with verify=True) and expanded
    (unfuse) are None where they do not apply."""

    input: str
    output: str
    files: list[str]  # the files written: the model, and its external data file when it has one
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    time_s: dict[str, float]
    fusion: object | None = None  # hcfuse.rewrite.FusionReport
    verify: object | None = None  # hcfuse.checking.verification.VerifyResult
    expanded: int | None = None
    report: str | None = None
    committed: bool = True  # False: verification failed, the output was left as it was


    def to_dict(self) -> dict:
        """The JSON report of an optimize run (the --report file)."""
        return {
            "input": self.input, "output": self.output,
            "fusion": self.fusion.to_dict() if self.fusion is not None else None,
            "nodes_before": sum(self.ops_before.values()), "nodes_after": sum(self.ops_after.values()),
            "ops_before": self.ops_before, "ops_after": self.ops_after, "time_s": self.time_s,
            "verify": self.verify.to_dict() if self.verify is not None else None,
            "committed": self.committed, "files": self.files,
        }


def _op_counts(model: ir.Model) -> dict[str, int]:
    return dict(collections.Counter(node.op_type for graph in model.graphs() for node in graph))


def write_json_atomic(path: str, data: dict) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "x") as f:
            json.dump(data, f, indent=1, default=str)
            f.write("\n")

    temporaries.replace_atomic(path, write, suffix=".json")


def _run(input, output, transform: Callable[[ir.Model, Progress], dict], progress: Progress | None,
         report=None, check: Callable[[str, str], dict] | None = None) -> FileResult:
    """Load, check the paths, clean up, transform (in place; returns FileResult fields), write beside
    the output, check(input, written model) (returns FileResult fields; "committed": False keeps the
    previous output), commit."""
    began = time.perf_counter()
    progress = progress or Progress()
    input, output = os.fspath(input), os.fspath(output)
    signatures = InputSignatures()
    signatures.record([input])  # before reading it: a file replaced meanwhile is noticed at the end
    model = model_io.load(input)
    files = RunFiles.of(input, model, output, report)
    files.check()  # before any work: a refused path costs nothing and leaves nothing behind
    signatures.record(files.input_data)
    model_io.read_by_real_paths(model)
    for directory in {os.path.dirname(os.path.abspath(p)) for p in (output, report) if p is not None}:
        model_io.remove_stale_temporaries(directory, keep=files.inputs)
    progress.start(model_io.initializer_bytes(model))
    progress.stage(f"loaded {input}")
    before = _op_counts(model)
    fields = transform(model, progress)
    with model_io.staged(model, output, progress=progress.counter("saving weights")) as written:
        signatures.check()
        checked = check(input, written.model_path) if check is not None else {}
        committed = checked.pop("committed", True)
        files_written = written.commit() if committed else []
    progress.stage(f"saved {output}" if committed else f"not saved {output}")
    times = {**fields.pop("time_s", {}), **checked.pop("time_s", {}), "total": time.perf_counter() - began}
    return FileResult(input, output, files_written, before, _op_counts(model), times, **fields, **checked,
                      committed=committed)


def optimize_file(
    input: str | os.PathLike,
    output: str | os.PathLike,
    *,
    verify: bool = False,
    report: str | os.PathLike | None = None,
    infer_shapes: bool = False,
    progress: Progress | None = None,
    debug: bool = False,
    verify_dims: dict[str, int] | None = None,
) -> FileResult:
    """Fuses every hyper-connection block of the model file ``input`` into ``output``.

    The weights are never loaded to fuse (they are read once, streamed, while the output is
    written). verify: run both files in onnxruntime on the same random inputs and compare
    (result.verify; the output is kept either way, check result.verify.status). report: also write
    result.to_dict() as JSON there (atomically). infer_shapes: run symbolic shape inference on the
    fused model before saving. progress: a hcfuse.files.progress.Progress. debug: the fusion pass's
    nearest-miss tracing. Raises ModelIOError (paths, invalid model) or ValueError.
    """

    def fuse(model: ir.Model, progress: Progress) -> dict:
        from hcfuse.rewrite import fuse_with_report

        t_fuse = time.perf_counter()
        fusion = fuse_with_report(model, debug=debug)  # our own loaded copy: in place
        fuse_s = time.perf_counter() - t_fuse
        progress.stage(f"fused in {fuse_s:.2f} s")
        if infer_shapes:
            _infer_in_place(model)
            progress.stage("inferred shapes")
        return {"fusion": fusion, "time_s": {"fuse": fuse_s}}

    def check(original: str, written: str) -> dict:
        from hcfuse.checking.verification import verify as run_verify

        began = time.perf_counter()
        steps.reached("verifying")
        options = {"dims": verify_dims} if verify_dims is not None else {}
        outcome = run_verify(original, written, **options)
        (progress or Progress()).stage(f"verified: {outcome.status}")
        return {"verify": outcome, "committed": outcome.status != "failed",
                "time_s": {"verify": time.perf_counter() - began}}

    result = _run(input, output, fuse, progress, report, check if verify else None)
    if report is not None:
        write_json_atomic(os.fspath(report), result.to_dict())
        result.report = os.fspath(report)
    return result


def unfuse_file(input: str | os.PathLike, output: str | os.PathLike, *,
                progress: Progress | None = None) -> FileResult:
    """Expands every fused node of ``input`` back into the stock contrib-op chain, into ``output``
    (result.expanded counts them); same guarantees as optimize_file."""

    def expand(model: ir.Model, _progress: Progress) -> dict:
        from hcfuse.checking.unfusion import unfuse

        return {"expanded": unfuse(model)}

    return _run(input, output, expand, progress)


def infer_shapes_file(input: str | os.PathLike, output: str | os.PathLike, *,
                      progress: Progress | None = None) -> FileResult:
    """Writes ``input`` with every value's type and shape inferred (ONNX Runtime's symbolic shape
    inference with hcfuse's handler) to ``output``; weights are never read to infer."""

    def infer(model: ir.Model, _progress: Progress) -> dict:
        _infer_in_place(model)
        return {}

    return _run(input, output, infer, progress)


def _infer_in_place(model: ir.Model) -> None:
    from hcfuse.shapes.ort_symbolic_shape import apply_inferred_shapes

    apply_inferred_shapes(model)
