"""NumPy reference of com.microsoft::HyperConnectionLowRankMix (docs/NUMERICS.md, "The contract").

Every kernel test compares against this. All arithmetic is fp32; each step is rounded once to the
element type T exactly where docs/NUMERICS.md says (S, hn, down, Z, SG, hidden, up, g, pre_output,
inject, the gate logit inject / gate_div, its sigmoid, post_gate). Accumulation order is fixed and
spelled out, so a kernel that follows it can match bit for bit:

- dot products (hn @ down_weight, hn @ inject_weight, hidden @ up_weight) and the sum of squares
  of the norm accumulate sequentially over k = 0, 1, ..., K-1 into an fp32 accumulator that starts
  at 0, each step a separately rounded multiply and add (no fused multiply-add);
- pre_output sums branches c = 0, ..., C-1 the same way, then multiplies by reduction_scale;
- sigmoid(x) = 1 / (1 + e) in fp32 with e = exp(-x) correctly rounded to fp32 (computed in
  float64 and rounded once; an accurate expf gives the same e).

A kernel may fuse the products' multiply-adds (the CPU kernel does where the CPU has FMA): for
float16 and bfloat16 inputs each product is exact in fp32, so the bits do not change; for float32
they may, by a few ulp of the outputs. With float32 a kernel may also sum a product in fixed slices
of k, each sequential, added in a fixed order (the CPU kernel sums hn @ down_weight in 8 slices of
ceil(C*H / 8) rows; the CUDA general path splits it too): each order carries its own rounding
error of about sqrt(K) ulps, so outputs then differ from this reference by tens of scaled ulps
(the kernel tests state the bounds). 16-bit outputs keep this reference's order.

T is np.float32, np.float16 or ml_dtypes.bfloat16, the same for every input and output.
"""

from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np

from hcfuse._op import ATTRIBUTES, INPUTS, NUM_REQUIRED_INPUTS, OP_TYPE

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
# T by name ("float32", "float16", "bfloat16"), e.g. for a --dtype option
DTYPES_BY_NAME = {dtype.name: dtype for dtype in SUPPORTED_DTYPES}
_F32 = np.float32


def round_to(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rounds fp32 values to T (round to nearest even) and returns them as fp32 again."""
    return x.astype(dtype).astype(_F32)


def sigmoid_f32(x: np.ndarray) -> np.ndarray:
    """fp32 sigmoid 1 / (1 + exp(-x)) with a correctly rounded fp32 exp."""
    x = np.asarray(x, dtype=_F32)
    with np.errstate(over="ignore"):
        e = np.exp(-x.astype(np.float64)).astype(_F32)
    return _F32(1.0) / (_F32(1.0) + e)


def matmul_seq_f32(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(rows, K) @ (K, N) in fp32, accumulating sequentially over k (the contract's order)."""
    acc = np.zeros((x.shape[0], w.shape[1]), dtype=_F32)
    for k in range(x.shape[1]):
        acc += x[:, k : k + 1] * w[k]
    return acc


def post_mix_f32(x: np.ndarray, block_output: np.ndarray, gate: np.ndarray, dtype) -> np.ndarray:
    """S = x + gate * block_output[h]: x (rows, C, H), block_output (rows, H), gate (rows, C, 1) or
    (rows, C, H)."""
    return round_to(x + gate * block_output[:, None, :], dtype)  # rounding point: S


def rms_norm_branches_f32(x: np.ndarray, scale: np.ndarray, epsilon, dtype) -> np.ndarray:
    """hn = x * (1 / sqrt(mean_h(x^2) + epsilon)) * scale per branch: x (rows, C, H), scale broadcasting
    to (C, H); the sum of squares runs sequentially over h."""
    ss = np.zeros(x.shape[:-1], dtype=_F32)
    for h in range(x.shape[-1]):
        ss += x[..., h] * x[..., h]
    inv_rms = _F32(1.0) / np.sqrt(ss / _F32(x.shape[-1]) + _F32(epsilon))
    return round_to(x * inv_rms[..., None] * scale, dtype)  # rounding point: hn


def scaled_silu_f32(down: np.ndarray, alpha, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Z, SG, hidden) = (alpha * down, sigmoid(Z), Z * SG), each rounded to dtype."""
    z = round_to(_F32(alpha) * down, dtype)  # rounding point: Z
    sg = round_to(sigmoid_f32(z), dtype)  # rounding point: SG
    return z, sg, round_to(z * sg, dtype)  # rounding point: hidden


def post_gate_f32(inject: np.ndarray, gate_div, gate_mul, dtype) -> np.ndarray:
    """cast_T(cast_T(sigmoid(cast_T(inject / gate_div))) * gate_mul), the rounding points of the stock Div,
    Sigmoid and Mul nodes (onnxruntime's schema of the op states the same)."""
    logit = round_to(inject / _F32(gate_div), dtype)  # rounding point: gate logit
    return round_to(round_to(sigmoid_f32(logit), dtype) * _F32(gate_mul), dtype)  # rounding points: sigmoid, post_gate


def pre_mix_f32(hn: np.ndarray, g: np.ndarray, reduction_scale, dtype) -> np.ndarray:
    """reduction_scale * sum_c(hn * g), branches summed in order: hn and g (rows, C, H) -> (rows, H)."""
    mix = np.zeros((hn.shape[0], hn.shape[-1]), dtype=_F32)
    for c in range(hn.shape[1]):
        mix += hn[:, c] * g[:, c]
    return round_to(_F32(reduction_scale) * mix, dtype)  # rounding point: pre_output


def check_required(op: str, given: dict, required) -> np.dtype:
    """Raises when a required input (a name of `given`) is None or streams is not of a T; returns T."""
    missing = [name for name in required if given[name] is None]
    if missing:
        raise ValueError(f"{op}: required input(s) {', '.join(missing)} missing (got None)")
    dtype = given["streams"].dtype
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{op}: streams must be float32, float16 or bfloat16; got {dtype}")
    return dtype


def check_dtypes(op: str, given: dict, names, dtype) -> None:
    """Raises when an input of `names` that is given is not of streams' dtype."""
    for name in names:
        value = given[name]
        if value is not None and value.dtype != dtype:
            raise TypeError(f"{op}: {name} must have the dtype of streams ({dtype}); got {value.dtype}")


def check_streams(op: str, streams, C) -> tuple[int, int]:
    """Raises on a num_branches that is not a positive integer or a streams whose last dim is not a positive
    multiple of it; returns (C*H, H)."""
    if not isinstance(C, (int, np.integer)) or C <= 0:
        raise ValueError(f"{op}: attribute num_branches must be a positive integer; got {C!r}")
    if streams.ndim < 1:
        raise ValueError(f"{op}: streams must have rank >= 1 (..., C*H); got a scalar")
    width = streams.shape[-1]
    if width == 0 or width % C:
        raise ValueError(f"{op}: the last dim of streams (C*H = {width}) must be a positive multiple of num_branches = {C}")
    return width, width // C


def check_prologue(op: str, streams, H: int, C, prev_block_output, prev_post_gate) -> None:
    """Raises unless the prologue inputs are both absent, or both given as (..., H) and (..., C) with streams'
    leading dims."""
    if (prev_block_output is None) != (prev_post_gate is None):
        only = "prev_block_output" if prev_post_gate is None else "prev_post_gate"
        raise ValueError(f"{op}: prev_block_output and prev_post_gate must be given together or not at all; got only {only}")
    lead = streams.shape[:-1]
    if prev_block_output is not None:
        if prev_block_output.shape != (*lead, H):
            raise ValueError(f"{op}: prev_block_output must be (..., H) = {(*lead, H)}; got {prev_block_output.shape}")
        if prev_post_gate.shape != (*lead, C):
            raise ValueError(f"{op}: prev_post_gate must be (..., C) = {(*lead, C)}; got {prev_post_gate.shape}")


def _check_shapes(streams, norm_scale, down_weight, up_weight, inject_weight, prev_block_output, prev_post_gate, C):
    """Validates shapes and dtypes like the kernels do; returns (H, R)."""
    op = OP_TYPE
    given = dict(zip(INPUTS, (streams, norm_scale, down_weight, up_weight, inject_weight, prev_block_output, prev_post_gate)))
    dtype = check_required(op, given, INPUTS[:NUM_REQUIRED_INPUTS])
    check_dtypes(op, given, INPUTS, dtype)
    width, H = check_streams(op, streams, C)
    if norm_scale.shape != (width,):
        raise ValueError(f"{op}: norm_scale must be (C*H,) = ({width},); got {norm_scale.shape}")
    if down_weight.ndim != 2 or down_weight.shape[0] != width or down_weight.shape[1] < 1:
        raise ValueError(f"{op}: down_weight must be (C*H, R) = ({width}, R) with R >= 1; got {down_weight.shape}")
    R = down_weight.shape[1]
    if up_weight.shape != (R, width):
        raise ValueError(f"{op}: up_weight must be (R, C*H) = ({R}, {width}); got {up_weight.shape}")
    if inject_weight.shape != (width, C):
        raise ValueError(f"{op}: inject_weight must be (C*H, C) = ({width}, {C}); got {inject_weight.shape}")
    check_prologue(op, streams, H, C, prev_block_output, prev_post_gate)
    return H, R


def hc_lowrank_mix(
    streams,
    norm_scale,
    down_weight,
    up_weight,
    inject_weight,
    prev_block_output=None,
    prev_post_gate=None,
    *,
    num_branches: int,
    epsilon: float = ATTRIBUTES["epsilon"],
    reduction_scale: float = ATTRIBUTES["reduction_scale"],
    silu_alpha: float = ATTRIBUTES["silu_alpha"],
    gate_div: float = ATTRIBUTES["gate_div"],
    gate_mul: float = ATTRIBUTES["gate_mul"],
):
    """Returns (pre_output (..., H), post_gate (..., C), streams_out (..., C*H)), all of dtype T."""
    steps = _steps(**locals())
    return steps["pre_output"], steps["post_gate"], steps["S"]


def hc_lowrank_mix_steps(*args, **kwargs) -> dict[str, np.ndarray]:
    """Every rounding point of the contract, keyed by docs/NUMERICS.md's name (S, hn, down, Z, SG, hidden, up, g,
    pre_output, inject, post_gate), as arrays of dtype T shaped (..., last dim of the step).
    Takes hc_lowrank_mix's arguments."""
    bound = inspect.signature(hc_lowrank_mix).bind(*args, **kwargs)
    bound.apply_defaults()
    return _steps(**bound.arguments)


def _steps(streams, norm_scale, down_weight, up_weight, inject_weight, prev_block_output, prev_post_gate, *,
           num_branches, epsilon, reduction_scale, silu_alpha, gate_div, gate_mul) -> dict[str, np.ndarray]:
    arrays = [None if a is None else np.asarray(a) for a in
              (streams, norm_scale, down_weight, up_weight, inject_weight, prev_block_output, prev_post_gate)]
    streams, norm_scale, down_weight, up_weight, inject_weight, prev_block_output, prev_post_gate = arrays
    C = num_branches
    _check_shapes(*arrays, C)
    # one pass over k for both products that read hn: columns [0, R) are down, [R, R+C) inject
    w_hn = np.concatenate([down_weight.astype(_F32), inject_weight.astype(_F32)], axis=1)
    prologue = None if prev_block_output is None else (prev_block_output, prev_post_gate)
    return steps_f32_weights(streams, norm_scale, w_hn, up_weight.astype(_F32), prologue, num_branches=C,
                             epsilon=epsilon, reduction_scale=reduction_scale, silu_alpha=silu_alpha,
                             gate_div=gate_div, gate_mul=gate_mul)


@np.errstate(over="ignore", invalid="ignore", divide="ignore")  # IEEE results (inf, NaN) are the contract
def steps_f32_weights(streams, norm_scale, down_inject_f32, up_f32, prologue, *, num_branches, epsilon,
                      reduction_scale, silu_alpha, gate_div, gate_mul, down_inject_matmul=matmul_seq_f32,
                      up_matmul=matmul_seq_f32) -> dict[str, np.ndarray]:
    """The contract's steps with the projections given as fp32 arrays: down_inject_f32 (C*H, R+C), down's
    columns then inject's, and up_f32 (R, C*H); prologue is None or (prev_block_output, prev_post_gate). T is
    streams' dtype. The dense op passes its T weights widened; the quantized op its weights dequantized
    exactly, with the order of its quantized projections' sums (down_inject_matmul, up_matmul: (rows, K) @
    (K, N) in fp32). Shapes are the caller's to check."""
    C = num_branches
    T = streams.dtype
    lead = streams.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    H = streams.shape[-1] // C
    R = down_inject_f32.shape[1] - C
    eps, rs, alpha, gdiv, gmul = (_F32(v) for v in (epsilon, reduction_scale, silu_alpha, gate_div, gate_mul))
    # each step is a function below; the arrays between them are fp32 holding values of T

    x = streams.reshape(rows, C, H).astype(_F32)
    if prologue is not None:
        prev_block_output, prev_post_gate = prologue
        x = post_mix_f32(x, prev_block_output.reshape(rows, H).astype(_F32),
                         prev_post_gate.reshape(rows, C, 1).astype(_F32), T)
    hn = rms_norm_branches_f32(x, norm_scale.astype(_F32).reshape(C, H), eps, T).reshape(rows, C * H)

    acc = down_inject_matmul(hn, down_inject_f32)
    down = round_to(acc[:, :R], T)  # rounding point: down
    inject = round_to(acc[:, R:], T)  # rounding point: inject

    z, sg, hidden = scaled_silu_f32(down, alpha, T)
    up = round_to(up_matmul(hidden, up_f32), T)  # rounding point: up
    g = round_to(sigmoid_f32(up), T)  # rounding point: g

    pre_output = pre_mix_f32(hn.reshape(rows, C, H), g.reshape(rows, C, H), rs, T)
    post_gate = post_gate_f32(inject, gdiv, gmul, T)

    steps = {"S": x.reshape(rows, C * H), "hn": hn, "down": down, "Z": z, "SG": sg, "hidden": hidden, "up": up,
             "g": g, "pre_output": pre_output, "inject": inject, "post_gate": post_gate}
    return {k: v.astype(T).reshape(*lead, v.shape[-1]) for k, v in steps.items()}
