"""The hcfuse command: optimize, unfuse, infer-shapes, demo, lib-path.

Exit codes are EXIT_* below (the --help epilog lists them). An error, or an interrupt (Ctrl-C), is
one line on stderr (the traceback only with --debug); the interrupt's line says whether the output
was written. Inputs are never modified; outputs are written atomically, model and data together
(hcfuse.files.model_io). The work itself is hcfuse.files.pipeline's; this module parses, prints and
maps outcomes to exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import traceback
import warnings

from hcfuse import _op

# 0: done (zero fusions is a warning); 1: --verify found the output wrong, nothing written; 2: usage or
# I/O error; 3: written, but --verify could not run (the summary says why); 130: interrupted (Ctrl-C).
EXIT_OK, EXIT_VERIFY_FAILED, EXIT_ERROR, EXIT_NOT_VERIFIED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES = f"""exit status:
  {EXIT_OK}    done (zero fusions is a warning)
  {EXIT_VERIFY_FAILED}    --verify: the output differs from the input beyond the bound; nothing was written
  {EXIT_ERROR}    usage or I/O error (one line on stderr; the traceback with --debug)
  {EXIT_NOT_VERIFIED}    --verify could not run (e.g. an input it cannot make, bfloat16 on the CPU): the output
       was written, not verified; the summary says why
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); the line on stderr says whether the output was written"""

OPTIMIZE_EXAMPLE = """example:
  hcfuse optimize model.onnx -o model.fused.onnx --verify --report fusion.json
  hcfuse optimize model_dir -o fused_dir --verify --dim batch_size=1 --dim past_sequence_length=15
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
                           infer_shapes=args.infer_shapes, progress=_progress(), debug=args.debug,
                           verify_dims=dict(args.dim) or None)
    return _print_optimized(args, result, result.output, " and ".join(result.files) or result.output,
                            result.committed)


def _print_optimized(args, result, output: str, written: str, committed: bool) -> int:
    """optimize's summary of a hcfuse.files.pipeline.FileResult; its exit code. output: the fused model's
    final path; written: what the run wrote (the files, or the folder); committed: whether it did
    (False: verification failed)."""
    if args.debug:
        print(json.dumps(result.fusion.to_dict(), indent=1, default=str), file=sys.stderr)
    times = [f"{name} {result.time_s[name]:.2f} s" for name in ("fuse", "verify", "total") if name in result.time_s]
    lines = [f"hcfuse optimize: {result.input} -> {output}", *_summarize_report(result.fusion),
             *_format_op_counts(result.ops_before, result.ops_after), f"  time: {', '.join(times)}"]
    print("\n".join(lines))
    if not result.fusion.counts_by_rule():
        print(f"hcfuse: warning: no hyper-connection block was fused in {result.input}", file=sys.stderr)
    if result.verify is None:
        return EXIT_OK
    from hcfuse.checking.verification import FAILED, NOT_VERIFIED

    print(result.verify.summary())
    if result.verify.status == NOT_VERIFIED:
        print(f"hcfuse optimize: NOT VERIFIED: wrote {written}, but could not verify it: {result.verify.reason}",
              file=sys.stderr)
        return EXIT_NOT_VERIFIED
    if result.verify.status == FAILED:
        print(f"hcfuse optimize: error: verification failed: {output} differs from {result.input} "
              f"beyond the contract's bound; " + (f"{written} was written" if committed else
                                                  f"{args.output} was not written (any previous one is unchanged)"),
              file=sys.stderr)
        return EXIT_VERIFY_FAILED
    return EXIT_OK


def _print_unfused(result) -> int:
    print(f"hcfuse unfuse: {result.input} -> {result.output}: expanded {result.expanded} fused node(s)")
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
        with warnings.catch_warnings():  # printed below as one line each
            warnings.simplefilter("ignore", genai_folder.LibraryLocationWarning)
            result = genai_folder.optimize_folder(args.input, args.output, copy_library=not args.link_library,
                                                  verify=args.verify, report=args.report,
                                                  infer_shapes=args.infer_shapes, progress=_progress(),
                                                  debug=args.debug, verify_dims=dict(args.dim) or None)
        for line in result.warnings:
            print(f"hcfuse: warning: {line}", file=sys.stderr)
        code = _print_optimized(args, result.pipeline, result.model, args.output, result.committed)
        if not result.committed:
            return code
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
    from hcfuse.reference import DTYPES_BY_NAME

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


def _dim(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    try:
        size = int(value)
    except ValueError:
        size = -1
    if not sep or not name or size < 0:
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE with SIZE an integer >= 0; got {text!r}")
    return name, size


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


class _Version(argparse.Action):
    """--version: hcfuse's version, onnxruntime's, and the custom-op library (looked up only when asked)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print hcfuse's and onnxruntime's versions and the "
                         "custom-op library's path, then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(EXIT_OK)


def version_text() -> str:
    import onnxruntime

    import hcfuse
    from hcfuse._library import get_library_path

    try:
        library = get_library_path()
    except FileNotFoundError:
        library = "kernels not built"
    return f"hcfuse {hcfuse.__version__}\nonnxruntime {onnxruntime.__version__}\nlibrary {library}"


def build_parser() -> argparse.ArgumentParser:
    from hcfuse.reference import DTYPES_BY_NAME  # here, not at import: main catches a Ctrl-C from here on

    parser = _Parser(prog="hcfuse", description=__doc__.splitlines()[0], epilog=EXIT_CODES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version)
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
            epilog=OPTIMIZE_EXAMPLE + "\n\n" + EXIT_CODES)
    p.add_argument("--verify", action="store_true",
                   help="run both models in onnxruntime on the same random inputs and compare (ulp of T) before "
                        "writing; exit 1 (nothing written) if they differ, 3 (written) if it cannot run")
    p.add_argument("--dim", metavar="NAME=SIZE", type=_dim, action="append", default=[],
                   help="with --verify: the size of the input dim NAME (repeatable, e.g. --dim batch_size=1 "
                        "--dim past_sequence_length=15); dims not given follow from the graph (total = past + "
                        "sequence) or are 3 (a decoder's sequence_length 1: a decode step)")
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
    p.set_defaults(report=None, infer_shapes=False, link_library=False, dim=[])
    add("lib-path", _lib_path, "print the path of the custom-op library", io=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = None
    outputs: dict[str, tuple | None] = {}
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if getattr(args, "output", None) and getattr(args, "input", None):
            if os.path.abspath(args.output) == os.path.abspath(args.input):
                parser.error(f"output {args.output} is the input; write to a new path")
        if getattr(args, "out_dir", None) and not os.path.isdir(args.out_dir):
            parser.error(f"--out-dir {args.out_dir} is not a directory")
        if getattr(args, "dim", None) and not args.verify:
            parser.error("--dim sets the sizes --verify runs on; give --verify too")
        outputs = {p: _identity(p) for p in (getattr(args, "output", None), getattr(args, "report", None)) if p}
        return _run(args)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the line below short
        if args is not None and args.debug:
            traceback.print_exc()
        command = f"hcfuse {args.command}" if args is not None else "hcfuse"
        print(f"{command}: interrupted{_interrupted_state(outputs)}", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args) -> int:
    from hcfuse.files import model_io

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


def _identity(path: str) -> tuple | None:
    """What stands at path now (None: nothing): outputs are committed by a rename, which changes it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _interrupted_state(outputs: dict[str, tuple | None]) -> str:
    """'; OUT was not written (...)' for each output, from what stands at its path now."""
    parts = []
    for path, before in outputs.items():
        now = _identity(path)
        if now == before:
            parts.append(f"{path} was not written" + (" (the previous one is unchanged)" if before else ""))
        elif now is None:
            parts.append(f"{path} is gone")
        else:
            parts.append(f"{path} was written before the interrupt")
    return "".join(f"; {p}" for p in parts)
