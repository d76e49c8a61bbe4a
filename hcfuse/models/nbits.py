"""MatMulNBits weights as onnxruntime's MatMulNBitsQuantizer writes them, and small models of one
HyperConnectionLowRankMixNBits node built from them, for tests, kernels and model builders.

`quantize_nbits` runs the quantizer's own block quantization (its DefaultWeightOnlyQuantizer, the C++
routines MatMulNBitsQuantizer calls for a MatMul), so B, scales and zero points are byte for byte what a
quantized model holds; zp_form "T" adds the one form the default quantizer does not write, zero points of T.
Needs onnxruntime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from hcfuse import _op_nbits
from hcfuse._op import IR_VERSION, ONNX_OPSET
from hcfuse.models.hc_block import random_weights
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
    quantizer = DefaultWeightOnlyQuantizer(config)
    B, scales, zp = quantizer.qbits_block_quant(weight.astype(np.float32) if bfloat16 else weight)
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


def random_nbits_weights(C: int, H: int, R: int, dtype, rng: np.random.Generator,
                         quantized: Sequence[str] = ("down_inject", "up"), bits: int = 4, block_size: int = 32,
                         symmetric: bool = True, zp_form: str | None = None) -> dict[str, np.ndarray]:
    """The op's weight inputs, keyed by input name: hcfuse.models.hc_block's random weights as nbits_weights
    makes them."""
    return nbits_weights(random_weights(C, H, R, dtype, rng), quantized, bits, block_size, symmetric, zp_form)


def nbits_weights(dense: dict[str, np.ndarray], quantized: Sequence[str] = ("down_inject", "up"), bits: int = 4,
                  block_size: int = 32, symmetric: bool = True, zp_form: str | None = None) -> dict[str, np.ndarray]:
    """The op's weight inputs, keyed by input name, from the dense op's (hcfuse.models.hc_block.random_weights'
    dict): down and inject packed into down_inject_weight (C*H, R+C), and the projections named in quantized
    ("down_inject", "up") quantized by quantize_nbits (scales and zero points added under their names)."""
    matrices = {_op_nbits.DOWN_INJECT: np.concatenate([dense["down_weight"], dense["inject_weight"]], axis=1),
                _op_nbits.UP: dense["up_weight"]}
    unknown = set(quantized) - {proj.name for proj in matrices}
    if unknown:
        raise ValueError(f"nbits_weights: unknown projection(s) {sorted(unknown)}; expected down_inject, up")
    out = {"norm_scale": dense["norm_scale"]}
    for proj, matrix in matrices.items():
        if proj.name not in quantized:
            out[_op_nbits.INPUTS[proj.weight]] = matrix
            continue
        q = quantize_nbits(matrix, bits, block_size, symmetric, zp_form)
        out[_op_nbits.INPUTS[proj.weight]], out[_op_nbits.INPUTS[proj.scales]] = q.B, q.scales
        if q.zero_points is not None:
            out[_op_nbits.INPUTS[proj.zero_points]] = q.zero_points
    return out


def make_nbits_node_model(weights: dict[str, np.ndarray], *, C: int, dtype,
                          leading_dims: Sequence[int | str] = ("rows",), prologue: bool = False,
                          streams_out: bool = False, **attrs) -> onnx.ModelProto:
    """A model of one HyperConnectionLowRankMixNBits node named "hc_lowrank_mix_nbits": streams (and the
    prologue pair) are graph inputs, the weights (random_nbits_weights' dict) constant initializers, the
    outputs named as the op's. attrs override the attribute defaults (bits and block_size among them, which
    must be the weights'); num_branches is always C."""
    unknown = set(attrs) - set(_op_nbits.ATTRIBUTES)
    if unknown:
        raise ValueError(f"{_op_nbits.OP_TYPE}: unknown attributes {sorted(unknown)}; "
                         f"expected some of {list(_op_nbits.ATTRIBUTES)}")
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    width = weights["norm_scale"].shape[0]
    H, lead = width // C, list(leading_dims)
    shapes = {"streams": [*lead, width], "prev_block_output": [*lead, H], "prev_post_gate": [*lead, C],
              "pre_output": [*lead, H], "post_gate": [*lead, C], "streams_out": [*lead, width]}
    activations = ["streams", *(["prev_block_output", "prev_post_gate"] if prologue else [])]
    node_inputs = [name if name in weights or name in activations else "" for name in _op_nbits.INPUTS]
    while not node_inputs[-1]:
        node_inputs.pop()
    out_names = list(_op_nbits.OUTPUTS[: 3 if streams_out else 2])
    node = helper.make_node(_op_nbits.OP_TYPE, node_inputs, out_names, domain=_op_nbits.DOMAIN,
                            name="hc_lowrank_mix_nbits", num_branches=C, **attrs)
    graph = helper.make_graph(
        [node], "hc_nbits_node",
        [helper.make_tensor_value_info(n, elem, shapes[n]) for n in activations],
        [helper.make_tensor_value_info(n, elem, shapes[n]) for n in out_names],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET),
                                                   helper.make_opsetid(_op_nbits.DOMAIN, _op_nbits.SINCE_VERSION)],
                             ir_version=IR_VERSION)
