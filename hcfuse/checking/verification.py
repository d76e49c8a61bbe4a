"""Runs an original and an optimized model on the same random inputs and compares them in ulp of T.

The gap of an output is its largest per-element difference counted in units in the last place of
the output's element type T, measured at max(|original|, |optimized|, RMS of the original output):
at an element's own magnitude, but never finer than the output's typical magnitude, so a value that
cancels to near zero (pre_output sums C products) is not judged by the spacing of tiny numbers.

The bound (DEFAULT_MAX_ULP) follows docs/NUMERICS.md's contract. The fused op rounds to T at the same points
as the stock chain, so a single block differs only where accumulation order or the sigmoid flips a
rounding: 1 ulp of a step, a few ulp of the outputs after it (measured on CPU: at most 3 ulp in
float16, 23 ulp in float32 at the full Qwen size, where the stock MatMul and Sigmoid are themselves
a few fp32 ulp off). A chain carries those differences through its residual streams from block to
block, slowly: the exporter-shaped decode graphs of hcfuse.models measured 7 ulp at 8 full-size blocks, 8
at 24 and 9-11 at 96 blocks in float16, 28.5 ulp at 8 full-size blocks in float32; on an H200
(CUDA, rows 1/4/16) 6/13/15 ulp at 96 full-size blocks in bfloat16 and 18/29/38.5 ulp at 8
full-size blocks in float32 (TF32 off: it keeps only 10 mantissa bits, thousands of ulp). The bounds,
32 ulp for float16/bfloat16 and 512 for float32, leave about 3x room over that for any depth up to
96 blocks; a real fusion error (a lost constant, a wrong weight slice) is thousands of ulp. Integer
outputs must match exactly.

Quantized blocks (ai.hcfuse.HyperConnectionLowRankMixNBits) take each weight as MatMulNBits defines it,
exactly, in fp32. Where the original MatMulNBits compute so too (onnxruntime's CPU provider below
accuracy_level 4), the gap is the dense op's: measured on an x86-64 CPU (onnxruntime 1.32) with every MatMul
quantized by MatMulNBitsQuantizer (bits 4 and 8,
block sizes 32 and 128, symmetric and not, rows 1 and 16), at most 16 ulp in float16 (96 blocks of
C=4 H=512 R=64, 9 ulp at 24 full-size blocks) and 49 ulp in float32 (24 full-size blocks), within the
dense bounds. With accuracy_level 4, onnxruntime's CPU MatMulNBits quantizes its activations to int8
(a scale per block of K, max|x| / 127), which the fused op does not: each quantized projection of the
original then carries a relative error of up to 1/254 of its block's largest input, and every MatMulNBits
after a block (the sublayers too) rounds its slightly different input to other int8 values, so the two
models part by int8 steps, not by roundings of T. Measured the same way: float16 28 ulp at 4 blocks, 61
at 8 full-size, 69 at 24 full-size, up to 121 at 48 (three seeds) and 81 at 96 blocks (H=512); float32
2.3e5, 4.5e5, 5.4e5, 8.9e5 and 6.9e5 ulp: about 0.12 of the output's scale in both types at most.
INT8_ACTIVATIONS_MAX_ULP allows 0.375 of the output's scale (3x that) in every type. That bound alone is a
weak check: on small chains a wrong scale stays under it (halved up scales: 0.02 of the scale; negated
down/inject scales: 0.33). So where it applies, verify first runs both models with every MatMulNBits at
accuracy_level 0 (fp32 activations, as the fused op computes; the weights stay on disk) and compares them at the
dense bounds, then the models as they are at the int8 bound. onnxruntime's CUDA
MatMulNBits has no int8-activation path: there the dense bounds apply.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
import onnx
import onnx_ir as ir

from hcfuse import _op, _op_nbits
from hcfuse.checking import feeds
from hcfuse.files import model_io
from hcfuse.files.proto_walk import proto_nodes
from hcfuse.checking._session import CPU as _CPU
from hcfuse.checking._session import CUDA as _CUDA
from hcfuse.checking._session import inference_session

# Largest accepted gap in ulp of T, per element type (float32, float16, bfloat16).
DEFAULT_MAX_ULP = {ir.DataType.FLOAT: 512.0, ir.DataType.FLOAT16: 32.0, ir.DataType.BFLOAT16: 32.0}
# Bound where quantized fused blocks replace MatMulNBits that quantize activations to int8 (accuracy_level 4
# on the CPU): 0.375 of the output's scale in each type (the module doc gives the measurements).
INT8_ACTIVATIONS_MAX_ULP = {ir.DataType.FLOAT: 0.375 * 2.0**23, ir.DataType.FLOAT16: 0.375 * 2.0**10,
                            ir.DataType.BFLOAT16: 0.375 * 2.0**7}
INT8_ACTIVATIONS_ACCURACY_LEVEL = 4  # MatMulNBits' accuracy_level that computes with int8 activations
# Size given to a symbolic input dim that neither `dims` nor the graph sizes (hcfuse.checking.feeds).
DEFAULT_ROWS = 3
_MANTISSA_BITS = {ir.DataType.FLOAT: 23, ir.DataType.FLOAT16: 10, ir.DataType.BFLOAT16: 7}
_MIN_EXPONENT = {ir.DataType.FLOAT: -126, ir.DataType.FLOAT16: -14, ir.DataType.BFLOAT16: -126}


@dataclasses.dataclass
class OutputGap:
    name: str
    dtype: str
    shape: tuple
    max_ulp: float  # inf when a NaN/Inf appears in one model only
    bound: float

    @property
    def ok(self) -> bool:
        return self.max_ulp <= self.bound


PASSED, FAILED, NOT_VERIFIED = "passed", "failed", "not verified"


@dataclasses.dataclass
class VerifyResult:
    """status: PASSED, FAILED (the reason says why when no gap is to blame) or NOT_VERIFIED (nothing
    was compared; the reason says why). dims: the size each symbolic input dim was given."""

    status: str
    provider: str | None
    outputs: list[OutputGap]
    reason: str = ""
    input_shapes: dict = dataclasses.field(default_factory=dict)
    dims: dict = dataclasses.field(default_factory=dict)
    bound_reason: str = ""  # why the bounds are not DEFAULT_MAX_ULP's, when they are not

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def summary(self) -> str:
        if self.status == NOT_VERIFIED:
            return f"verify: not verified: {self.reason}"
        sizes = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        lines = [f"verify ({self.provider}, {f'dims {sizes}' if sizes else f'inputs {self.input_shapes}'}): "
                 f"{self.status.upper()}"]
        if self.reason:
            lines.append(f"  {self.reason}")
        if self.bound_reason:
            lines.append(f"  bound: {self.bound_reason}")
        for gap in self.outputs:
            mark = "ok" if gap.ok else "FAIL"
            lines.append(f"  {gap.name} {gap.dtype}{list(gap.shape)}: max gap {gap.max_ulp:g} ulp "
                         f"(bound {gap.bound:g}) {mark}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class _RunError(Exception):
    """onnxruntime could not load or run a model; the message says which and why."""


def scaled_ulp(original: np.ndarray, optimized: np.ndarray, dtype: ir.DataType | None = None) -> np.ndarray:
    """Per element, |original - optimized| in ulp of dtype at max(|a|, |b|, RMS(original)) (see the
    module doc); inf where a NaN or Inf appears in one array only (or Infs of opposite sign), 0 where
    both hold the same one. dtype defaults to original's element type."""
    if dtype is None:
        dtype = ir.DataType.from_numpy(np.asarray(original).dtype)
    a = np.asarray(original).astype(np.float64)
    b = np.asarray(optimized).astype(np.float64)
    if a.shape != b.shape:
        raise ValueError(f"scaled_ulp: shapes differ: original {a.shape}, optimized {b.shape}")
    special = ~(np.isfinite(a) & np.isfinite(b))
    same = (np.isnan(a) & np.isnan(b)) | (a == b)
    finite = a[~special]
    rms = np.sqrt(np.mean(finite * finite)) if finite.size else 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        magnitude = np.maximum(np.maximum(np.abs(a), np.abs(b)), rms)
        exponent = np.maximum(np.floor(np.log2(np.maximum(magnitude, np.finfo(np.float64).tiny))),
                              _MIN_EXPONENT[dtype])
        gap = np.abs(a - b) / np.exp2(exponent - _MANTISSA_BITS[dtype])
    return np.where(special, np.where(same, 0.0, np.inf), gap)


def ulp_gap(original: np.ndarray, optimized: np.ndarray, dtype: ir.DataType) -> float:
    """Largest scaled_ulp of the two arrays: the gap verify compares with its bound."""
    gaps = scaled_ulp(original, optimized, dtype)
    return float(gaps.max()) if gaps.size else 0.0


def default_max_ulp(optimized: ir.Model, provider: str) -> tuple[dict, str]:
    """The bound per element type for comparing optimized with its original on provider, and the reason
    when it is not DEFAULT_MAX_ULP: INT8_ACTIVATIONS_MAX_ULP on the CPU where a quantized fused node's
    original MatMulNBits ran with accuracy_level 4 (its int8 activations; see the module doc)."""
    graphs = [*optimized.graphs(), *optimized.functions.values()]
    levels = {node.attributes.get_int("accuracy_level", 0) for graph in graphs for node in graph
              if node.op_type == _op_nbits.OP_TYPE and node.domain == _op_nbits.DOMAIN}
    if provider == _CPU and INT8_ACTIVATIONS_ACCURACY_LEVEL in levels:
        return {**DEFAULT_MAX_ULP, **INT8_ACTIVATIONS_MAX_ULP}, (
            f"quantized blocks whose original MatMulNBits have accuracy_level {INT8_ACTIVATIONS_ACCURACY_LEVEL}: "
            f"onnxruntime's CPU provider quantizes their activations to int8, the fused op does not")
    return dict(DEFAULT_MAX_ULP), ""


def _default_bounds(path: str, provider: str) -> tuple[dict, str]:
    try:
        optimized = model_io.load(path)
    except Exception:  # noqa: BLE001 - a model onnx-ir cannot read fails its run below, with onnxruntime's reason
        return dict(DEFAULT_MAX_ULP), ""
    return default_max_ulp(optimized, provider)


def _available_providers(providers: list[str] | None) -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if providers is None:
        return [_CUDA] if _CUDA in available else [_CPU]
    missing = [p for p in providers if p not in available]
    if missing:
        raise ValueError(f"verify: providers {missing} are not available; onnxruntime has {available}")
    return list(providers)


def _uses_bfloat16(model: ir.Model) -> bool:
    values = [*model.graph.inputs, *model.graph.outputs, *model.graph.initializers.values()]
    values += [out for node in model.graph for out in node.outputs]
    return any(v.dtype == ir.DataType.BFLOAT16 for v in values)


def _session(model: str | bytes, provider: str, library: str, folder: str | None = None):
    # fatal only: a failure reaches the caller as one line of the result's reason
    # float32 MatMul on TF32 tensor cores keeps 10 mantissa bits: the contract accumulates in fp32
    providers = [(provider, {"use_tf32": "0"})] if provider == _CUDA else [provider]
    # a model given as bytes finds its external data in folder
    config = {"session.model_external_initializers_file_folder_path": folder} if folder else None
    return inference_session(model, providers, library=library, log_severity=4, config=config)


def _with_fp32_nbits_activations(path: str) -> bytes | None:
    """The model at path (its weights left on disk) with accuracy_level 4 dropped from every MatMulNBits, so
    they take fp32 activations and exact fp32 weights as the fused op does; None when it has no such node."""
    proto = onnx.load(path, load_external_data=False)
    changed = False
    for node in proto_nodes(proto):
        if node.op_type != "MatMulNBits" or node.domain != _op.DOMAIN:
            continue
        for attr in list(node.attribute):
            if attr.name == "accuracy_level" and attr.i == INT8_ACTIVATIONS_ACCURACY_LEVEL:
                node.attribute.remove(attr)
                changed = True
    return proto.SerializeToString() if changed else None


def _as_path(model, directory: str, name: str) -> str:
    """A path ORT can load: the given path, or the model saved into directory (external data if big)."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if isinstance(model, onnx.ModelProto):
        model = ir.from_proto(model)
    path = os.path.join(directory, name)
    model_io.save(model, path)
    return path


def verify(
    original,
    optimized,
    *,
    providers: list[str] | None = None,
    seed: int = 0,
    rows: int = DEFAULT_ROWS,
    dims: dict[str, int] | None = None,
    max_ulp: dict | float | None = None,
) -> VerifyResult:
    """Compares original and optimized (ModelProto, onnx_ir.Model or a path) in onnxruntime.

    providers: default CUDA when onnxruntime sees it, else CPU (with hcfuse's library registered).
    dims: sizes of symbolic input dims by name ({"batch_size": 1, "past_sequence_length": 7}); the
    others follow from the graph where it relates them (total = past + sequence) or are ``rows``
    (hcfuse.checking.feeds says how sizes and input data are made).
    max_ulp: the bound, one number or per ir.DataType (a type not named keeps default_max_ulp's: DEFAULT_MAX_ULP,
    or INT8_ACTIVATIONS_MAX_ULP for quantized blocks whose MatMulNBits quantize activations on the CPU).
    Returns NOT_VERIFIED with the reason when verification cannot run (an input no data can be made
    for, the original model not running on the inputs, bfloat16 on the CPU, no custom-op library) and
    FAILED when the original runs but the optimized model does not. Raises ValueError when ``dims``
    names a dim the model does not have or sizes that contradict the graph.
    """
    provider = _available_providers(providers)[0]
    with tempfile.TemporaryDirectory(prefix="hcfuse-verify-") as tmp:
        orig_path = _as_path(original, tmp, "original.onnx")
        opt_path = _as_path(optimized, tmp, "optimized.onnx")
        reference = model_io.load(orig_path)
        sizes = feeds.resolve_dims(reference, dims, rows)
        bounds, bound_reason = _default_bounds(opt_path, provider)

        def not_verified(reason: str, inputs: dict | None = None) -> VerifyResult:
            return VerifyResult(NOT_VERIFIED, provider, [], reason=reason, input_shapes=inputs or {}, dims=sizes)

        if provider == _CPU and _uses_bfloat16(reference):
            return not_verified("the model computes in bfloat16 and onnxruntime's CPU provider has no bfloat16 "
                                "MatMul/Sigmoid/Div/Mul for the stock chain; verify on CUDA (onnxruntime-gpu)")
        library = _library()
        if library is None:
            return not_verified("hcfuse's custom-op library is not built, so the optimized model cannot run")
        try:
            data = feeds.make_feeds(reference, sizes, rows, np.random.default_rng(seed))
        except feeds.NotFeedable as e:
            return not_verified(str(e))
        shapes = {k: list(v.shape) for k, v in data.items()}
        try:
            expected = _run("original", orig_path, provider, library, data)
        except _RunError as e:
            hint = "; set the inputs' sizes with dims (hcfuse optimize --dim NAME=VALUE)" if _about_sizes(e) else ""
            return not_verified(f"{e}{hint}", shapes)
        try:
            actual = _run("optimized", opt_path, provider, library, data)
        except _RunError as e:
            return VerifyResult(FAILED, provider, [], reason=f"the original model runs but {e}", input_shapes=shapes,
                                dims=sizes)
        exact_original = _with_fp32_nbits_activations(orig_path) if bound_reason else None
        if exact_original is not None and not isinstance(max_ulp, (int, float)):
            # the int8-activation bound is loose: first the same model computing as the fused op, at the dense bounds
            # (both models: MatMulNBits left unfused, e.g. the sublayers', take fp32 activations in both)
            exact_optimized = _with_fp32_nbits_activations(opt_path) or opt_path
            try:
                exact = [_run(f"{which} at accuracy_level 0", model, provider, library, data,
                              folder=os.path.dirname(os.path.abspath(path)))
                         for which, model, path in (("original", exact_original, orig_path),
                                                    ("optimized", exact_optimized, opt_path))]
            except _RunError as e:
                return not_verified(str(e), shapes)
            strict = _compare(*exact, reference, provider, shapes, sizes, dict(DEFAULT_MAX_ULP))
            if not strict.passed:
                strict.reason = strict.reason or ("with every MatMulNBits at accuracy_level 0 (fp32 activations, as "
                                                  "the fused op computes), at the dense bounds")
                return strict
    if isinstance(max_ulp, (int, float)):
        bounds, bound_reason = {dtype: float(max_ulp) for dtype in DEFAULT_MAX_ULP}, ""
    elif max_ulp:
        bounds = {**bounds, **max_ulp}
    result = _compare(expected, actual, reference, provider, shapes, sizes, bounds)
    result.bound_reason = bound_reason
    return result


def _about_sizes(error: Exception) -> bool:
    """Whether onnxruntime's refusal of the original model may come from the sizes verify chose."""
    return any(word in str(error).lower() for word in ("shape", "dim", "rank", "size", "broadcast", "index"))


def _library() -> str | None:
    from hcfuse._library import get_library_path

    try:
        return get_library_path()
    except FileNotFoundError:
        return None


def _run(which: str, model: str | bytes, provider: str, library: str, data: dict, folder: str | None = None
         ) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    from hcfuse.checking._ort_io import run_bound  # bfloat16 in and out as raw bits (ORT's numpy API refuses it)

    run_options = ort.RunOptions()
    run_options.log_severity_level = 4  # onnxruntime's own log line would repeat the error below
    try:
        return run_bound(_session(model, provider, library, folder), data, run_options=run_options)
    except Exception as e:  # onnxruntime's Fail/InvalidArgument/RuntimeException... carry the reason
        shapes = {k: list(v.shape) for k, v in data.items()}
        from hcfuse._library import missing_library_message

        reason = missing_library_message(e, library) or " ".join(str(e).split())
        raise _RunError(f"onnxruntime ({provider}) could not run the {which} model on inputs {shapes}: {reason}") from e


def _compare(expected, actual, reference: ir.Model, provider, shapes, sizes, bounds: dict) -> VerifyResult:
    gaps = []
    for out in reference.graph.outputs:
        a, b = expected[out.name], actual.get(out.name)
        if b is None or b.shape != a.shape or b.dtype != a.dtype:
            found = "missing" if b is None else f"{b.dtype}{list(b.shape)}"
            reason = f"output {out.name!r}: expected {a.dtype}{list(a.shape)}, optimized gives {found}"
            return VerifyResult(FAILED, provider, gaps, reason=reason, input_shapes=shapes, dims=sizes)
        dtype = ir.DataType.from_numpy(a.dtype)
        if dtype in _MANTISSA_BITS:
            bound = bounds[dtype]
            gap = ulp_gap(a, b, dtype)
        else:
            bound, gap = 0.0, float(0 if np.array_equal(a, b) else np.inf)
        gaps.append(OutputGap(out.name, dtype.name, a.shape, gap, float(bound)))
    status = PASSED if all(g.ok for g in gaps) else FAILED
    return VerifyResult(status, provider, gaps, input_shapes=shapes, dims=sizes)
