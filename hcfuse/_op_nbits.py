"""Single source of truth for ai.hcfuse::HyperConnectionLowRankMixNBits (see docs/QUANTIZED.md).

The quantized form of com.microsoft::HyperConnectionLowRankMix: the same computation, with each of its two
projections given either dense or as com.microsoft::MatMulNBits takes its weight (B, scales, optional
zero_points), bytes unchanged. Names the dense op shares (streams, norm_scale, the prologue pair, the outputs,
the dense attributes, the element types) come from hcfuse/_op.py; schema, shape handler, reference, rewrite
rules, builders and tests import the rest from here.
"""

from __future__ import annotations

from typing import NamedTuple

from hcfuse import _op

DOMAIN = "ai.hcfuse"
OP_TYPE = "HyperConnectionLowRankMixNBits"
SINCE_VERSION = 1

# The dense op's own names for the inputs both ops take
_STREAMS, _NORM_SCALE = _op.INPUTS[_op.STREAMS], _op.INPUTS[_op.NORM_SCALE]
_PREV_BLOCK_OUTPUT, _PREV_POST_GATE = _op.INPUTS[_op.PREV_BLOCK_OUTPUT], _op.INPUTS[_op.PREV_POST_GATE]

# Inputs in order. down_inject_weight is a MatMul's B [C*H, R+C] when dense (down's R columns, then inject's C),
# MatMulNBits' B [R+C, k_blocks, blob_size] when quantized; up_weight is [R, C*H] dense or [C*H, k_blocks, blob]
# quantized. Scales are given iff their weight is quantized; zero points are optional with a quantized weight;
# the prologue pair comes both or neither. An absent optional input is an empty name.
INPUTS = (
    _STREAMS,
    _NORM_SCALE,
    "down_inject_weight",
    "down_inject_scales",
    "down_inject_zero_points",
    "up_weight",
    "up_scales",
    "up_zero_points",
    _PREV_BLOCK_OUTPUT,
    _PREV_POST_GATE,
)
# Positions of the inputs above (schema, shape handler, reference, rewrite rules and tests index with these).
(STREAMS, NORM_SCALE, DOWN_INJECT_WEIGHT, DOWN_INJECT_SCALES, DOWN_INJECT_ZERO_POINTS,
 UP_WEIGHT, UP_SCALES, UP_ZERO_POINTS, PREV_BLOCK_OUTPUT, PREV_POST_GATE) = range(len(INPUTS))
REQUIRED_INPUTS = (STREAMS, NORM_SCALE, DOWN_INJECT_WEIGHT, UP_WEIGHT)

# Outputs: the dense op's, same names, order and optional streams_out.
OUTPUTS = _op.OUTPUTS
NUM_REQUIRED_OUTPUTS = _op.NUM_REQUIRED_OUTPUTS
PRE_OUTPUT, POST_GATE, STREAMS_OUT = _op.PRE_OUTPUT, _op.POST_GATE, _op.STREAMS_OUT


class Projection(NamedTuple):
    """One projection's input positions and its MatMul's (K, N) in the op's symbols."""

    name: str
    weight: int
    scales: int
    zero_points: int
    K: str
    N: str


DOWN_INJECT = Projection("down_inject", DOWN_INJECT_WEIGHT, DOWN_INJECT_SCALES, DOWN_INJECT_ZERO_POINTS, "C*H", "R+C")
UP = Projection("up", UP_WEIGHT, UP_SCALES, UP_ZERO_POINTS, "R", "C*H")
PROJECTIONS = (DOWN_INJECT, UP)

# Attribute name -> default (None: required): the dense op's six, then MatMulNBits' bits, block_size and
# accuracy_level (one value for every quantized projection of a node; accuracy_level does not change the
# computation and is kept so that unfusion writes the MatMulNBits nodes back as they were).
ATTRIBUTES: dict[str, float | int | None] = {**_op.ATTRIBUTES, "bits": 4, "block_size": 32, "accuracy_level": 0}
FLOAT_ATTRIBUTES = _op.FLOAT_ATTRIBUTES
NBITS_ATTRIBUTES = ("bits", "block_size", "accuracy_level")

BITS = (4, 8)
MIN_BLOCK_SIZE = 16  # block_size: a power of two >= 16 (MatMulNBits' own rule)

# Element types: T (activations, scales, T zero points) as the dense op's; a weight input is T (dense) or uint8
# (MatMulNBits' B); zero points are uint8 (packed) or T.
ELEMENT_TYPES = _op.ELEMENT_TYPES
QUANTIZED_TYPE = 2  # onnx.TensorProto.UINT8


def attribute_defaults() -> dict[str, float | int]:
    """Defaults of the optional attributes (num_branches has none)."""
    return {k: v for k, v in ATTRIBUTES.items() if v is not None}


def bits_problem(bits) -> str | None:
    """What is wrong with a bits value, or None."""
    return None if bits in BITS else f"bits must be one of {', '.join(map(str, BITS))}; got {bits!r}"


def block_size_problem(block_size) -> str | None:
    """What is wrong with a block_size value, or None."""
    ok = isinstance(block_size, int) and block_size >= MIN_BLOCK_SIZE and block_size & (block_size - 1) == 0
    return None if ok else f"block_size must be a power of two >= {MIN_BLOCK_SIZE}; got {block_size!r}"


def k_blocks(K: int, block_size: int) -> int:
    """Quantization blocks along K: ceil(K / block_size) (the last one padded)."""
    return -(-K // block_size)


def blob_size(bits: int, block_size: int) -> int:
    """Bytes of one block of B: block_size * bits / 8."""
    return block_size * bits // 8


def packed_zero_point_cols(num_k_blocks: int, bits: int) -> int:
    """Bytes per row of packed uint8 zero points: ceil(k_blocks * bits / 8)."""
    return -(-num_k_blocks * bits // 8)


def default_zero_point(bits: int) -> int:
    """The zero point of a projection given without zero points: 2^(bits-1)."""
    return 1 << (bits - 1)
