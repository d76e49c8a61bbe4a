"""The ``hcfuse`` command: optimize, unfuse, infer-shapes, demo, lib-path.

Exit codes: 0 success (zero fusions is a warning), 1 verification failed, 2 usage or I/O error (one
line on stderr; the traceback only with --debug). Inputs are never modified; outputs are written
atomically (hcfuse.model_io).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import traceback

import onnx_ir as ir

from hcfuse import _op, model_io
from hcfuse.reference import DTYPES_BY_NAME

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_ERROR = 0, 1, 2
# Models with more weight bytes than this print progress on stderr.
LARGE_MODEL_BYTES = 256 * 1024 * 1024


def _op_counts(model: ir.Model) -> collections.Counter:
    return collections.Counter(node.op_type for graph in model.graphs() for node in graph)


def _format_op_counts(before: collections.Counter, after: collections.Counter) -> list[str]:
    lines = [f"  nodes: {sum(before.values())} -> {sum(after.values())}"]
    for op in sorted(set(before) | set(after)):
        if before[op] != after[op]:
            lines.append(f"    {op}: {before[op]} -> {after[op]}")
    return lines


class _Progress:
    """Stage lines on stderr for large models; silent otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.start = time.perf_counter()

    def stage(self, text: str) -> None:
        if self.enabled:
            print(f"[{time.perf_counter() - self.start:6.1f} s] {text}", file=sys.stderr, flush=True)

    def saver(self, label: str):
        return model_io.progress_printer(f"         {label}") if self.enabled else None


def _skeleton_proto(model: ir.Model):
    """The model as a proto whose large initializers are external references that are never read.

    Shape inference needs initializer shapes and small (shape-like) values only, so neither lazy
    tensors (the fusion's weight halves) nor external weights are materialized.
    """
    swapped = []
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is not None and tensor.nbytes > model_io.EXTERNAL_THRESHOLD_BYTES:
                swapped.append((value, tensor))
                value.const_value = ir.ExternalTensor(
                    "hcfuse-not-read.data", 0, tensor.nbytes, tensor.dtype, shape=tensor.shape, name=value.name)
    try:
        return ir.to_proto(model)
    finally:
        for value, tensor in swapped:
            value.const_value = tensor


def _infer_shapes(model: ir.Model) -> ir.Model:
    """hcfuse.infer_shapes (ORT's symbolic shape inference) applied to model's values in place."""
    from hcfuse.ort_symbolic_shape import infer_shapes

    inferred = ir.from_proto(infer_shapes(_skeleton_proto(model), auto_merge=True))
    found = {}
    for graph in inferred.graphs():
        found.update({v.name: v for node in graph for v in node.outputs})
        found.update({v.name: v for v in graph.outputs})
    for graph in model.graphs():
        for value in [*(v for node in graph for v in node.outputs), *graph.outputs]:
            source = found.get(value.name)
            if source is not None and source.type is not None:
                value.type, value.shape = source.type, source.shape
    return model


def _check_report_path(path: str, args, model: ir.Model) -> None:
    """Refuses a --report path that cannot be written or names a model file of this run (checked
    before any work, so a bad path neither costs a fusion nor leaves an output behind)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise model_io.ModelIOError(f"{path}: report directory {directory} does not exist")
    if os.path.isdir(path):
        raise model_io.ModelIOError(f"{path}: is a directory, expected a report file path")
    output_data = os.path.join(os.path.dirname(os.path.abspath(args.output)), model_io.data_file_name(args.output))
    models = {"the input model": args.input, "the output model": args.output, "the output's data": output_data}
    models.update({f"the input's data {p}": p for p in sorted(model_io.external_data_paths(model))})
    for what, other in models.items():
        if model_io.same_file(path, other):
            raise model_io.ModelIOError(f"{path}: the report would overwrite {what}; write it to a new path")


def _write_json_atomic(path: str, data: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".hcfuse-report-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _summarize_report(report) -> list[str]:
    counts = report.counts_by_rule()
    total = sum(counts.values())
    lines = [f"  fused {total} block(s)" + (": " + ", ".join(f"{r} {n}" for r, n in counts.items()) if counts else "")]
    rejected = list(report.rejected)
    if rejected:
        lines.append(f"  left unfused: {len(rejected)} candidate(s)")
        for item in rejected[:20]:
            lines.append(f"    {_short(item)}")
        if len(rejected) > 20:
            lines.append(f"    ... {len(rejected) - 20} more (see --report)")
    return lines


def _short(item) -> str:
    """One line for a rejected candidate (a hcfuse.rewrite.Rejection): its node and reason."""
    return f"{item.anchor or '?'}: {item.reason}" + (f" [{item.rule}]" if item.rule else "")


def _optimize(args) -> int:
    if os.path.isdir(args.input):
        return _genai_folder(args)
    t_start = time.perf_counter()
    model = model_io.load(args.input)
    model_io.check_output_path(args.output, args.input, model)
    if args.report:
        _check_report_path(args.report, args, model)
    progress = _Progress(model_io.initializer_bytes(model) > LARGE_MODEL_BYTES)
    progress.stage(f"loaded {args.input}")
    before = _op_counts(model)

    from hcfuse.api import optimize_with_report

    t_fuse = time.perf_counter()
    fused, report = optimize_with_report(model, debug=args.debug)
    fuse_s = time.perf_counter() - t_fuse
    progress.stage(f"fused in {fuse_s:.2f} s")
    if args.infer_shapes:
        fused = _infer_shapes(fused)
        progress.stage("inferred shapes")
    model_io.save(fused, args.output, progress=progress.saver("saving weights"))
    total_s = time.perf_counter() - t_start
    after = _op_counts(fused)

    lines = [f"hcfuse optimize: {args.input} -> {args.output}", *_summarize_report(report),
             *_format_op_counts(before, after), f"  time: fuse {fuse_s:.2f} s, total {total_s:.2f} s"]
    print("\n".join(lines))
    if not report.counts_by_rule():
        print(f"hcfuse: warning: no hyper-connection block was fused in {args.input}", file=sys.stderr)

    result = None
    if args.verify:
        from hcfuse.verification import verify

        result = verify(args.input, args.output)
        print(result.summary())
        if result.status == "unverifiable":
            print(f"hcfuse: warning: {args.output} was not verified: {result.reason}", file=sys.stderr)
    if args.report:
        _write_json_atomic(args.report, {
            "input": args.input, "output": args.output, "fusion": report.to_dict(),
            "nodes_before": sum(before.values()), "nodes_after": sum(after.values()),
            "ops_before": dict(before), "ops_after": dict(after),
            "time_s": {"fuse": fuse_s, "total": total_s},
            "verify": result.to_dict() if result is not None else None,
        })
    if result is not None and result.status == "failed":
        print(f"hcfuse: error: verification failed: {args.output} differs from {args.input} beyond the "
              "contract's bound", file=sys.stderr)
        return EXIT_VERIFY_FAILED
    return EXIT_OK


def _unfuse(args) -> int:
    if os.path.isdir(args.input):
        return _genai_folder(args, unfuse=True)
    from hcfuse.unfusion import unfuse

    model = model_io.load(args.input)
    model_io.check_output_path(args.output, args.input, model)
    count = unfuse(model)  # in place on our own loaded copy; the input file is not touched
    model_io.save(model, args.output)
    print(f"hcfuse unfuse: {args.input} -> {args.output}: expanded {count} {_op.OP_TYPE} node(s)")
    return EXIT_OK


def _genai_folder(args, unfuse: bool = False) -> int:
    """An onnxruntime-genai model folder (hcfuse.genai_folder): the decoder through the file pipeline."""
    from hcfuse import genai_folder

    if unfuse:
        result = genai_folder.unfuse_folder(args.input, args.output, debug=args.debug)
    else:
        result = genai_folder.optimize_folder(args.input, args.output, copy_library=not args.link_library,
                                              verify=args.verify, report=args.report,
                                              infer_shapes=args.infer_shapes, debug=args.debug)
    print(f"hcfuse: onnxruntime-genai folder {args.input} -> {args.output}: {len(result.copied)} other file(s) "
          f"copied; {genai_folder.CONFIG_NAME} custom_ops_library: {result.custom_ops_library or '(none)'}")
    return result.pipeline


def _infer_shapes_cmd(args) -> int:
    model = model_io.load(args.input)
    model_io.check_output_path(args.output, args.input, model)
    model_io.save(_infer_shapes(model), args.output)
    print(f"hcfuse infer-shapes: {args.input} -> {args.output}")
    return EXIT_OK


def _lib_path(args) -> int:
    from hcfuse._library import get_library_path

    print(get_library_path())
    return EXIT_OK


def _demo(args) -> int:
    from hcfuse.models import qwen_decode

    dtype = DTYPES_BY_NAME[args.dtype]
    with tempfile.TemporaryDirectory(prefix="hcfuse-demo-") as tmp:
        directory = args.out_dir or tmp
        source = os.path.join(directory, "demo.onnx")
        qwen_decode.save_decode_model(source, args.blocks, external_data=False, C=args.C, H=args.H, R=args.R,
                                      dtype=dtype)
        print(f"hcfuse demo: built {args.blocks} blocks (C={args.C}, H={args.H}, R={args.R}, {args.dtype}) "
              f"in the exporter's packed form: {source}")
        args.input, args.output, args.verify = source, os.path.join(directory, "demo.fused.onnx"), True
        return _optimize(args)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hcfuse", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="tracebacks and the full fusion report on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, func, help_text, io=True):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="tracebacks, and the fusion pass's full report on stderr")
        if io:
            p.add_argument("input", help="input .onnx model (never modified)")
            p.add_argument("-o", "--output", required=True, help="output .onnx path (not the input)")
        p.set_defaults(func=func)
        return p

    p = add("optimize", _optimize, f"fuse every hyper-connection block into one {_op.OP_TYPE} node "
            "(INPUT a model file, or an onnxruntime-genai model folder and OUTPUT a folder)")
    p.add_argument("--verify", action="store_true", help="run both models in onnxruntime and compare (ulp of T)")
    p.add_argument("--report", metavar="FILE.json", help="write the fusion report as JSON")
    p.add_argument("--infer-shapes", action="store_true", help="run symbolic shape inference after fusing")
    p.add_argument("--link-library", action="store_true",
                   help="INPUT an onnxruntime-genai model folder (OUTPUT a folder): name the installed library by "
                        "its absolute path in genai_config.json instead of copying it into OUTPUT")
    add("unfuse", _unfuse, f"expand every {_op.OP_TYPE} node back into the stock contrib-op chain "
        "(INPUT a model file, or an onnxruntime-genai model folder and OUTPUT a folder)")
    add("infer-shapes", _infer_shapes_cmd, "symbolic shape inference (ONNX Runtime's, with hcfuse's handler)")
    p = add("demo", _demo, "build a small decode model, fuse it, verify it, print the summary", io=False)
    p.add_argument("--blocks", type=_positive, default=4)
    p.add_argument("--dtype", choices=tuple(DTYPES_BY_NAME), default="float16")
    p.add_argument("-C", type=_positive, default=_op.QWEN_CONFIG["num_branches"], help="branches")
    p.add_argument("-H", type=_positive, default=64, help="features per branch")
    p.add_argument("-R", type=_positive, default=16, help="gate rank")
    p.add_argument("--out-dir", help="keep the models here (default: a temporary folder)")
    p.set_defaults(report=None, infer_shapes=False, link_library=False)
    add("lib-path", _lib_path, "print the path of the custom-op library", io=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "output", None) and getattr(args, "input", None):
        if os.path.abspath(args.output) == os.path.abspath(args.input):
            parser.error(f"output {args.output} is the input; write to a new path")
    if getattr(args, "out_dir", None) and not os.path.isdir(args.out_dir):
        parser.error(f"--out-dir {args.out_dir} is not a directory")
    try:
        return args.func(args)
    except (model_io.ModelIOError, OSError, ValueError, TypeError) as e:  # OSError: FileNotFoundError too
        if args.debug:
            traceback.print_exc()
        print(f"hcfuse {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # a bug, or an ORT failure: still one line unless --debug
        if args.debug:
            traceback.print_exc()
        print(f"hcfuse {args.command}: error: {type(e).__name__}: {e} (rerun with --debug for a traceback)",
              file=sys.stderr)
        return EXIT_ERROR
