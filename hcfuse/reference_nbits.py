"""NumPy reference of ai.hcfuse::HyperConnectionLowRankMixNBits (docs/QUANTIZED.md).

A quantized projection's weight is what com.microsoft::MatMulNBits defines, w[k, n] = (q[n, k] - zp[n, b]) *
scale[n, b] with b = k // block_size, computed in fp32 and never rounded to T; a dense projection is its T
weight widened. The rest is the dense op's contract run on those fp32 weights
(`hcfuse.reference.steps_f32_weights`), so every rounding point is the dense op's, and so is every
accumulation order but one: a quantized projection's dot products run in lane order (`matmul_lanes_f32`):

- lane j (j = 0 .. 31) sums the terms of k = j, j + 32, j + 64, ... in ascending k into an fp32 accumulator
  that starts at 0, each step a separately rounded multiply and add, as the dense order does;
- the 32 lane sums are added in a fixed tree: u[l] = s[2l] + s[2l+1] (l = 0 .. 15), then halving,
  u[l] + u[l + 8], then + 4, + 2 and + 1.

This is the order a CPU reads MatMulNBits' bytes in without transposing them: 16 bytes of a column hold 32
consecutive k, the even k in the low nibbles and the odd in the high, each a vector of lanes.

Packing (MatMulNBits' own): element (k, n) is in block b = k // block_size at position i = k % block_size;
bits 4: byte i // 2 of B[n, b, :], low nibble for even i, high for odd; bits 8: byte i. Packed uint8 zero
points: for (n, b), bits 4: byte b // 2 of zero_points[n, :], low nibble for even b; bits 8: byte b. Elements
k >= K of the last block are padding.
"""

from __future__ import annotations

import inspect

import numpy as np

from hcfuse import _op_nbits
from hcfuse._op_nbits import (
    ATTRIBUTES,
    DOWN_INJECT,
    INPUTS,
    NORM_SCALE,
    OP_TYPE,
    PREV_BLOCK_OUTPUT,
    PREV_POST_GATE,
    REQUIRED_INPUTS,
    STREAMS,
    UP,
)
from hcfuse.reference import (
    check_dtypes,
    check_prologue,
    check_required,
    check_streams,
    matmul_seq_f32,
    steps_f32_weights,
)

_F32 = np.float32
LANES = 32  # the lanes of a quantized projection's dot products
_MATMUL_CHUNK_FLOATS = 1 << 23  # the largest (rows, LANES, N) accumulator matmul_lanes_f32 holds at once


def lane_tree_f32(s: np.ndarray) -> np.ndarray:
    """(..., LANES, N) lane sums -> (..., N): u[l] = s[2l] + s[2l+1], then halving (u[l] + u[l + half])."""
    u = s[..., 0::2, :] + s[..., 1::2, :]
    while u.shape[-2] > 1:
        half = u.shape[-2] // 2
        u = u[..., :half, :] + u[..., half:, :]
    return u[..., 0, :]


def matmul_lanes_f32(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(rows, K) @ (K, N) in fp32 in lane order: lane j sums k = j, j + LANES, ... sequentially from 0, a
    rounded multiply and a rounded add a step; then lane_tree_f32."""
    rows, K = x.shape
    N = w.shape[1]
    out = np.empty((rows, N), dtype=_F32)
    step = max(1, _MATMUL_CHUNK_FLOATS // (LANES * max(N, 1)))
    for r0 in range(0, rows, step):
        xr = x[r0 : r0 + step]
        acc = np.zeros((xr.shape[0], LANES, N), dtype=_F32)
        for k0 in range(0, K, LANES):
            kt = min(LANES, K - k0)  # lanes past K add nothing
            acc[:, :kt, :] += xr[:, k0 : k0 + kt, None] * w[None, k0 : k0 + kt, :]
        out[r0 : r0 + step] = lane_tree_f32(acc)
    return out


def _unpack_nibbles(packed: np.ndarray, bits: int) -> np.ndarray:
    """Bytes (..., n) -> values (..., n * 8 // bits): bits 4 low nibble first, bits 8 as they are."""
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def unpack_nbits(B: np.ndarray, bits: int, block_size: int, K: int) -> np.ndarray:
    """MatMulNBits' B uint8 [N, k_blocks, blob_size] -> the quantized values q as uint8 [K, N] (padding dropped)."""
    N = B.shape[0]
    q = _unpack_nibbles(B, bits).reshape(N, -1)[:, :K]
    return np.ascontiguousarray(q.T)


def unpack_zero_points(zero_points: np.ndarray, bits: int, num_k_blocks: int) -> np.ndarray:
    """Packed uint8 zero points [N, ceil(k_blocks*bits/8)] -> uint8 [N, k_blocks]."""
    return _unpack_nibbles(zero_points, bits)[:, :num_k_blocks]


def dequantize(B, scales, zero_points, bits: int, block_size: int, K: int) -> np.ndarray:
    """The fp32 weight [K, N] of a MatMulNBits B [N, k_blocks, blob_size], scales T [N, k_blocks] and
    zero_points (None: 2^(bits-1); uint8 [N, ceil(k_blocks*bits/8)] packed; T [N, k_blocks]):
    w[k, n] = (q[n, k] - zp[n, b]) * scale[n, b] in fp32. Exact when the zero points are integers (absent or
    packed) and the scales 16-bit; otherwise the fp32 arithmetic's rounding."""
    B, scales = np.asarray(B), np.asarray(scales)
    num_k_blocks = scales.shape[1]
    if zero_points is None:
        zp = np.full(scales.shape, _op_nbits.default_zero_point(bits), dtype=_F32)
    elif np.asarray(zero_points).dtype == np.uint8:
        zp = unpack_zero_points(zero_points, bits, num_k_blocks).astype(_F32)
    else:
        zp = np.asarray(zero_points).astype(_F32)
    q = unpack_nbits(B, bits, block_size, K).astype(_F32)  # [K, N]
    block = np.arange(K) // block_size
    return (q - zp.T[block]) * scales.astype(_F32).T[block]


def _check_quantized(where: str, proj, given: dict, dtype, K: int, N: int, bits: int, block_size: int) -> None:
    """Shapes and types of one quantized projection's weight, scales and zero points."""
    B, scales, zero_points = (given[INPUTS[i]] for i in (proj.weight, proj.scales, proj.zero_points))
    b_name, s_name, zp_name = INPUTS[proj.weight], INPUTS[proj.scales], INPUTS[proj.zero_points]
    nkb, blob = _op_nbits.k_blocks(K, block_size), _op_nbits.blob_size(bits, block_size)
    dims = f"K = {proj.K} = {K}, N = {proj.N} = {N}, bits {bits}, block_size {block_size}"
    if B.shape != (N, nkb, blob):
        raise ValueError(f"{where}: {b_name} must be uint8 (N, k_blocks, blob_size) = ({N}, {nkb}, {blob}) "
                         f"({dims}); got {B.shape}")
    if scales is None:
        raise ValueError(f"{where}: {s_name} is required with a quantized (uint8) {b_name}; got None")
    if scales.dtype != dtype:
        raise TypeError(f"{where}: {s_name} must have the dtype of streams ({dtype}); got {scales.dtype}")
    if scales.shape != (N, nkb):
        raise ValueError(f"{where}: {s_name} must be (N, k_blocks) = ({N}, {nkb}) ({dims}); got {scales.shape}")
    if zero_points is None:
        return
    packed = (N, _op_nbits.packed_zero_point_cols(nkb, bits))
    if zero_points.dtype == np.uint8:
        if zero_points.shape != packed:
            raise ValueError(f"{where}: packed uint8 {zp_name} must be (N, ceil(k_blocks*bits/8)) = {packed} "
                             f"({dims}); got {zero_points.shape}")
    elif zero_points.dtype == dtype:
        if zero_points.shape != (N, nkb):
            raise ValueError(f"{where}: {zp_name} of T must be (N, k_blocks) = ({N}, {nkb}) ({dims}); "
                             f"got {zero_points.shape}")
    else:
        raise TypeError(f"{where}: {zp_name} must be uint8 (packed) or the dtype of streams ({dtype}); "
                        f"got {zero_points.dtype}")


def _check_shapes(given: dict, C, bits, block_size) -> tuple[int, int]:
    """Validates every shape and type rule of the op, naming the input; returns (H, R)."""
    op = OP_TYPE
    dtype = check_required(op, given, [INPUTS[i] for i in REQUIRED_INPUTS])
    streams = given[INPUTS[STREAMS]]
    width, H = check_streams(op, streams, C)
    quantized = {}
    for proj in (DOWN_INJECT, UP):
        weight = given[INPUTS[proj.weight]]
        if weight.dtype not in (dtype, np.uint8):
            raise TypeError(f"{op}: {INPUTS[proj.weight]} must be uint8 (quantized) or the dtype of streams "
                            f"({dtype}); got {weight.dtype}")
        quantized[proj] = weight.dtype == np.uint8
        if not quantized[proj]:
            for i in (proj.scales, proj.zero_points):
                if given[INPUTS[i]] is not None:
                    raise ValueError(f"{op}: {INPUTS[i]} is given but {INPUTS[proj.weight]} is dense ({dtype}); "
                                     f"it goes only with a quantized (uint8) weight")
    if not any(quantized.values()):
        raise ValueError(f"{op}: down_inject_weight or up_weight must be quantized (uint8); with both dense the "
                         f"block is the dense op's")
    problem = _op_nbits.bits_problem(bits) or _op_nbits.block_size_problem(block_size)
    if problem:
        raise ValueError(f"{op}: attribute {problem}")
    check_dtypes(op, given, [INPUTS[i] for i in (NORM_SCALE, PREV_BLOCK_OUTPUT, PREV_POST_GATE)], dtype)
    norm_scale = given[INPUTS[NORM_SCALE]]
    if norm_scale.shape != (width,):
        raise ValueError(f"{op}: norm_scale must be (C*H,) = ({width},); got {norm_scale.shape}")

    di = given[INPUTS[DOWN_INJECT.weight]]
    if quantized[DOWN_INJECT]:
        if di.ndim != 3 or di.shape[0] <= C:
            raise ValueError(f"{op}: quantized down_inject_weight must be uint8 (R+C, k_blocks, blob_size) with "
                             f"R >= 1 (C = {C}); got {di.shape}")
        R = di.shape[0] - C
        _check_quantized(op, DOWN_INJECT, given, dtype, width, R + C, bits, block_size)
    else:
        if di.ndim != 2 or di.shape[0] != width or di.shape[1] <= C:
            raise ValueError(f"{op}: down_inject_weight must be (C*H, R+C) = ({width}, R+{C}) with R >= 1; "
                             f"got {di.shape}")
        R = di.shape[1] - C
    up = given[INPUTS[UP.weight]]
    if quantized[UP]:
        _check_quantized(op, UP, given, dtype, R, width, bits, block_size)
    elif up.shape != (R, width):
        raise ValueError(f"{op}: up_weight must be (R, C*H) = ({R}, {width}) (R from down_inject_weight); "
                         f"got {up.shape}")

    check_prologue(op, streams, H, C, given[INPUTS[PREV_BLOCK_OUTPUT]], given[INPUTS[PREV_POST_GATE]])
    return H, R


def projection_f32(given: dict, proj, K: int, bits: int, block_size: int) -> np.ndarray:
    """A projection's fp32 weight [K, N]: dequantized when quantized, widened when dense."""
    weight = given[INPUTS[proj.weight]]
    if weight.dtype != np.uint8:
        return weight.astype(_F32)
    return dequantize(weight, given[INPUTS[proj.scales]], given[INPUTS[proj.zero_points]], bits, block_size, K)


def projection_matmul(given: dict, proj):
    """The order of a projection's dot products: lane order when quantized, the dense op's when dense."""
    return matmul_lanes_f32 if given[INPUTS[proj.weight]].dtype == np.uint8 else matmul_seq_f32


def hc_lowrank_mix_nbits(
    streams,
    norm_scale,
    down_inject_weight,
    down_inject_scales=None,
    down_inject_zero_points=None,
    up_weight=None,
    up_scales=None,
    up_zero_points=None,
    prev_block_output=None,
    prev_post_gate=None,
    *,
    num_branches: int,
    epsilon: float = ATTRIBUTES["epsilon"],
    reduction_scale: float = ATTRIBUTES["reduction_scale"],
    silu_alpha: float = ATTRIBUTES["silu_alpha"],
    gate_div: float = ATTRIBUTES["gate_div"],
    gate_mul: float = ATTRIBUTES["gate_mul"],
    bits: int = ATTRIBUTES["bits"],
    block_size: int = ATTRIBUTES["block_size"],
    accuracy_level: int = ATTRIBUTES["accuracy_level"],
):
    """Returns (pre_output (..., H), post_gate (..., C), streams_out (..., C*H)), all of dtype T. Inputs in
    the op's order (up_weight is required; it is a keyword default only to follow the optional ones)."""
    steps = _steps(**locals())
    return steps["pre_output"], steps["post_gate"], steps["S"]


def hc_lowrank_mix_nbits_steps(*args, **kwargs) -> dict[str, np.ndarray]:
    """Every rounding point of the contract, as hcfuse.reference.hc_lowrank_mix_steps gives them. Takes
    hc_lowrank_mix_nbits' arguments."""
    bound = inspect.signature(hc_lowrank_mix_nbits).bind(*args, **kwargs)
    bound.apply_defaults()
    return _steps(**bound.arguments)


def _steps(*, num_branches, epsilon, reduction_scale, silu_alpha, gate_div, gate_mul, bits, block_size,
           accuracy_level, **inputs) -> dict[str, np.ndarray]:
    del accuracy_level  # kept for unfusion; no part of the computation
    given = {name: None if inputs[name] is None else np.asarray(inputs[name]) for name in INPUTS}
    C = num_branches
    H, R = _check_shapes(given, C, bits, block_size)
    down_inject_f32 = projection_f32(given, DOWN_INJECT, C * H, bits, block_size)
    up_f32 = projection_f32(given, UP, R, bits, block_size)
    prologue = None
    if given[INPUTS[PREV_BLOCK_OUTPUT]] is not None:
        prologue = (given[INPUTS[PREV_BLOCK_OUTPUT]], given[INPUTS[PREV_POST_GATE]])
    return steps_f32_weights(given[INPUTS[STREAMS]], given[INPUTS[NORM_SCALE]], down_inject_f32, up_f32, prologue,
                             num_branches=C, epsilon=epsilon, reduction_scale=reduction_scale,
                             silu_alpha=silu_alpha, gate_div=gate_div, gate_mul=gate_mul,
                             down_inject_matmul=projection_matmul(given, DOWN_INJECT),
                             up_matmul=projection_matmul(given, UP))
