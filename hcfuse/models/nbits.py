"""MatMulNBits weights as onnxruntime's MatMulNBitsQuantizer writes them, for tests and model builders.

`quantize_nbits` runs the quantizer's own block quantization (its DefaultWeightOnlyQuantizer, the C++
routines MatMulNBitsQuantizer calls for a MatMul), so B, scales and zero points are byte for byte what a
quantized model holds; zp_form "T" adds the one form the default quantizer does not write, zero points of T.
Needs onnxruntime.
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from hcfuse import _op_nbits
from hcfuse.reference_nbits import unpack_zero_points

ZP_FORMS = ("packed", "T")


class NBitsWeight(NamedTuple):
    """One MatMulNBits weight: B uint8 [N, k_blocks, blob_size], scales T [N, k_blocks], zero_points (None,
    uint8 [N, ceil(k_blocks*bits/8)] or T [N, k_blocks]) and the node's attributes."""

    B: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    bits: int
    block_size: int
    K: int
    N: int


def quantize_nbits(weight: np.ndarray, bits: int = 4, block_size: int = 32, symmetric: bool = True,
                   zp_form: str | None = None) -> NBitsWeight:
    """Quantizes a MatMul's B, weight [K, N] of T (float32, float16 or bfloat16; the scales get its type), as
    MatMulNBitsQuantizer(bits=bits, block_size=block_size, is_symmetric=symmetric) does. zp_form None: as the
    quantizer writes it (no zero points when symmetric, packed uint8 otherwise); "packed": packed uint8 (for a
    symmetric quantization, 2^(bits-1) written out); "T": zero points of T, [N, k_blocks], the same values."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    weight = np.asarray(weight)
    for problem in (_op_nbits.bits_problem(bits), _op_nbits.block_size_problem(block_size)):
        if problem:
            raise ValueError(f"quantize_nbits: {problem}")
    if weight.ndim != 2:
        raise ValueError(f"quantize_nbits: weight must be (K, N); got shape {weight.shape}")
    if zp_form is not None and zp_form not in ZP_FORMS:
        raise ValueError(f"quantize_nbits: zp_form must be None, 'packed' or 'T'; got {zp_form!r}")
    dtype = weight.dtype
    bfloat16 = dtype == ml_dtypes.bfloat16
    # the quantizer widens a bfloat16 weight to float32 and narrows its scales back (its quantize_matmul)
    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric, bits=bits)
    B, scales, zp = DefaultWeightOnlyQuantizer(config).qbits_block_quant(weight.astype(np.float32) if bfloat16 else weight)
    scales = scales.astype(dtype)
    K, N = weight.shape
    if zp_form is None:
        zero_points = None if symmetric else zp
    else:
        if symmetric:
            zp = _pack_default_zero_points(N, scales.shape[1], bits)
        zero_points = zp if zp_form == "packed" else unpack_zero_points(zp, bits, scales.shape[1]).astype(dtype)
    return NBitsWeight(B, scales, zero_points, bits, block_size, K, N)


def _pack_default_zero_points(N: int, num_k_blocks: int, bits: int) -> np.ndarray:
    """Packed uint8 zero points that all hold 2^(bits-1) (the value an absent input stands for)."""
    zp = _op_nbits.default_zero_point(bits)
    byte = zp | (zp << 4) if bits == 4 else zp
    return np.full((N, _op_nbits.packed_zero_point_cols(num_k_blocks, bits)), byte, dtype=np.uint8)
