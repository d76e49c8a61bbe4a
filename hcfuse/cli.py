"""The ``hcfuse`` command: optimize, unfuse, infer-shapes, demo, lib-path.

Exit codes: 0 success (zero fusions is a warning), 1 verification failed, 2 usage or I/O error (one
line on stderr; the traceback only with --debug). Inputs are never modified; outputs are written
atomically, model and data together (hcfuse.files.model_io). The work itself is hcfuse.files.pipeline's; this
module parses, prints and maps exceptions to exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

from hcfuse import _op
from hcfuse.files import model_io
from hcfuse.reference import DTYPES_BY_NAME

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_ERROR = 0, 1, 2

OPTIMIZE_EXAMPLE = """example:
  hcfuse optimize model.onnx -o model.fused.onnx --verify --report fusion.json
  (model.onnx and its data are never modified; model.fused.onnx and, for a model with external
  data, model.fused.onnx.data are replaced together, never one without the other)"""


def _format_op_counts(before: dict, after: dict) -> list[str]:
    lines = [f"  nodes: {sum(before.values())} -> {sum(after.values())}"]
    for op in sorted(set(before) | set(after)):
        if before.get(op, 0) != after.get(op, 0):
            lines.append(f"    {op}: {before.get(op, 0)} -> {after.get(op, 0)}")
    return lines


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


def _progress():
    from hcfuse.files.progress import TerminalProgress

    return TerminalProgress(sys.stderr)


def _optimize(args) -> int:
    if os.path.isdir(args.input):
        return _genai_folder(args)
    from hcfuse.files.pipeline import optimize_file

    result = optimize_file(args.input, args.output, verify=args.verify, report=args.report,
                           infer_shapes=args.infer_shapes, progress=_progress(), debug=args.debug)
    return _print_optimized(args, result)


def _print_optimized(args, result) -> int:
    """optimize's summary of a hcfuse.files.pipeline.FileResult; its exit code."""
    if args.debug:
        print(json.dumps(result.fusion.to_dict(), indent=1, default=str), file=sys.stderr)
    lines = [f"hcfuse optimize: {result.input} -> {result.output}", *_summarize_report(result.fusion),
             *_format_op_counts(result.ops_before, result.ops_after),
             f"  time: fuse {result.time_s['fuse']:.2f} s, total {result.time_s['total']:.2f} s"]
    print("\n".join(lines))
    if not result.fusion.counts_by_rule():
        print(f"hcfuse: warning: no hyper-connection block was fused in {result.input}", file=sys.stderr)
    if result.verify is not None:
        print(result.verify.summary())
        if result.verify.status == "unverifiable":
            print(f"hcfuse: warning: {result.output} was not verified: {result.verify.reason}", file=sys.stderr)
        if result.verify.status == "failed":
            print(f"hcfuse: error: verification failed: {result.output} differs from {result.input} beyond the "
                  "contract's bound", file=sys.stderr)
            return EXIT_VERIFY_FAILED
    return EXIT_OK


def _print_unfused(result) -> int:
    print(f"hcfuse unfuse: {result.input} -> {result.output}: expanded {result.expanded} {_op.OP_TYPE} node(s)")
    return EXIT_OK


def _unfuse(args) -> int:
    if os.path.isdir(args.input):
        return _genai_folder(args, unfuse=True)
    from hcfuse.files.pipeline import unfuse_file

    return _print_unfused(unfuse_file(args.input, args.output, progress=_progress()))


def _genai_folder(args, unfuse: bool = False) -> int:
    """An onnxruntime-genai model folder (hcfuse.files.genai_folder): the decoder through the file pipeline."""
    from hcfuse.files import genai_folder

    if unfuse:
        result = genai_folder.unfuse_folder(args.input, args.output, progress=_progress())
        code = _print_unfused(result.pipeline)
    else:
        result = genai_folder.optimize_folder(args.input, args.output, copy_library=not args.link_library,
                                              verify=args.verify, report=args.report,
                                              infer_shapes=args.infer_shapes, progress=_progress(),
                                              debug=args.debug)
        code = _print_optimized(args, result.pipeline)
    print(f"hcfuse: onnxruntime-genai folder {args.input} -> {args.output}: {len(result.copied)} other file(s) "
          f"copied; {genai_folder.CONFIG_NAME} custom_ops_library: {result.custom_ops_library or '(none)'}")
    return code


def _infer_shapes_cmd(args) -> int:
    from hcfuse.files.pipeline import infer_shapes_file

    infer_shapes_file(args.input, args.output, progress=_progress())
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


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr (message and usage), exit code 2."""

    def error(self, message: str):
        usage = " ".join(self.format_usage().split())
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}; {usage}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hcfuse", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="tracebacks and the full fusion report on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, func, help_text, io=True, epilog=None):
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="tracebacks, and the fusion pass's full report on stderr")
        if io:
            p.add_argument("input", help="input .onnx model (never modified)")
            p.add_argument("-o", "--output", required=True, help="output .onnx path (neither the input nor one of its data files)")
        p.set_defaults(func=func)
        return p

    p = add("optimize", _optimize, f"fuse every hyper-connection block into one {_op.OP_TYPE} node "
            "(INPUT a model file, or an onnxruntime-genai model folder and OUTPUT a folder)",
            epilog=OPTIMIZE_EXAMPLE)
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
