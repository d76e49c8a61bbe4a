"""int4 weights for the benchmarks, as onnxruntime-genai's int4 builds hold them, without onnxruntime's quantizer.

`quantize_int4` is MatMulNBitsQuantizer(bits=4, block_size, is_symmetric=True)'s block quantization (its C++
routine, MLAS' BlockwiseQuantizer) in vectorized NumPy: byte for byte what hcfuse.models.nbits.quantize_nbits
writes (bench_decode.py --dry-run compares the two where onnxruntime.quantization imports), in a fraction of a
second per 13 MB weight set and with NumPy alone, so a GPU machine needs no quantizer.

The routine, per block of block_size elements of one column of B [K, N], in float32:
    m = the block's max if |max| > |min| else its min;   scale = T(m / -8)   (a block of zeros: its first zero)
    q = clamp(roundf(w * (1 / float(scale)) + 8), 0, 15)    (roundf: halves away from zero; 1/0 taken as 0)
bfloat16 weights are widened to float32 first and their scales narrowed to bfloat16 afterwards (the quantizer's
quantize_matmul does so), float16 ones quantized as float16 (their scale rounded to float16 before its inverse).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from hcfuse import _op_nbits
from hcfuse.models.nbits import NBitsWeight

BITS = 4
ZERO_POINT = _op_nbits.default_zero_point(BITS)  # 8: the value of absent zero points
QMAX = (1 << BITS) - 1


def quantize_int4(weight: np.ndarray, block_size: int = 32) -> NBitsWeight:
    """A MatMul's B, weight [K, N] of float32, float16 or bfloat16 (K a multiple of block_size), quantized to
    4 bits, symmetric: B uint8 [N, K / block_size, block_size / 2], scales of the weight's type, no zero points."""
    weight = np.asarray(weight)
    problem = _op_nbits.block_size_problem(block_size)
    if problem:
        raise ValueError(f"quantize_int4: {problem}")
    if weight.ndim != 2 or weight.shape[0] % block_size:
        raise ValueError(f"quantize_int4: weight must be (K, N) with K a multiple of block_size {block_size}; "
                         f"got shape {weight.shape}")
    K, N = weight.shape
    k_blocks = K // block_size
    blocks = np.ascontiguousarray(weight.astype(np.float32).T).reshape(N, k_blocks, block_size)
    hi, lo = blocks.max(axis=-1), blocks.min(axis=-1)
    extreme = np.where(np.abs(hi) > np.abs(lo), hi, lo)
    extreme = np.where(extreme == 0, blocks[..., 0], extreme)  # a block of zeros: the first one's sign, as MLAS' scan
    scale = extreme / np.float32(-ZERO_POINT)
    if weight.dtype == np.float16:  # MLAS quantizes float16 with float16 scales; bfloat16 went through float32
        scale = scale.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inverse = np.where(scale != 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    x = blocks * inverse[..., None] + np.float32(ZERO_POINT)  # float32 multiply, then add (no fused multiply-add)
    whole = np.trunc(x)
    rounded = whole + np.copysign(np.abs(x - whole) >= 0.5, x)  # roundf: exact, halves away from zero
    q = np.clip(rounded, 0, QMAX).astype(np.uint8)
    B = q[..., 0::2] | (q[..., 1::2] << 4)
    scales = scale.astype(ml_dtypes.bfloat16 if weight.dtype == ml_dtypes.bfloat16 else weight.dtype)
    return NBitsWeight(B, scales, None, BITS, block_size, K, N)


def nbits_weight_set(dense: dict[str, np.ndarray], block_size: int = 32) -> dict[str, np.ndarray]:
    """The quantized op's weight inputs, keyed by input name, from one dense weight set (hcfuse.models.hc_block.
    random_weights' dict): down and inject packed into one [C*H, R+C] weight (down's R columns, then inject's C),
    it and up quantized by quantize_int4, as onnxruntime-genai's int4 builds hold a block."""
    down_inject = np.concatenate([dense["down_weight"], dense["inject_weight"]], axis=1)
    out = {"norm_scale": dense["norm_scale"]}
    for proj, matrix in ((_op_nbits.DOWN_INJECT, down_inject), (_op_nbits.UP, dense["up_weight"])):
        q = quantize_int4(matrix, block_size)
        out[_op_nbits.INPUTS[proj.weight]], out[_op_nbits.INPUTS[proj.scales]] = q.B, q.scales
    return out

