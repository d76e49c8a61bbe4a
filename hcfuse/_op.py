"""Single source of truth for com.microsoft::HyperConnectionLowRankMix (see docs/NUMERICS.md).

Schema, symbolic-shape handler, rewrite rules, model builders, kernels' tests and the CLI
import names from here; nothing else spells them.
"""

from __future__ import annotations

DOMAIN = "com.microsoft"
OP_TYPE = "HyperConnectionLowRankMix"
SINCE_VERSION = 1

# Inputs in order; the last two are optional and come as a pair (both or neither).
INPUTS = (
    "streams",
    "norm_scale",
    "down_weight",
    "up_weight",
    "inject_weight",
    "prev_block_output",
    "prev_post_gate",
)
NUM_REQUIRED_INPUTS = 5
# Outputs in order; streams_out is optional.
OUTPUTS = ("pre_output", "post_gate", "streams_out")
NUM_REQUIRED_OUTPUTS = 2
# Positions of the inputs and outputs above (schema, shape handler, builders and tests index with these).
STREAMS, NORM_SCALE, DOWN_WEIGHT, UP_WEIGHT, INJECT_WEIGHT, PREV_BLOCK_OUTPUT, PREV_POST_GATE = range(len(INPUTS))
PRE_OUTPUT, POST_GATE, STREAMS_OUT = range(len(OUTPUTS))
WEIGHT_INPUTS = INPUTS[NORM_SCALE:NUM_REQUIRED_INPUTS]  # norm_scale, down_weight, up_weight, inject_weight

# The standard ONNX opset and IR version of the models hcfuse builds (and unfusion imports by default).
ONNX_OPSET = 21
IR_VERSION = 10

# Attribute name -> default (None: required).
ATTRIBUTES: dict[str, float | int | None] = {
    "num_branches": None,
    "epsilon": 1e-5,
    "reduction_scale": 1.0,
    "silu_alpha": 1.0,
    "gate_div": 1.0,
    "gate_mul": 1.0,
}
FLOAT_ATTRIBUTES = ("epsilon", "reduction_scale", "silu_alpha", "gate_div", "gate_mul")

# Element types the op accepts (onnx.TensorProto enum values: FLOAT, FLOAT16, BFLOAT16).
ELEMENT_TYPES = (1, 10, 16)

# The stock contrib ops of the unfused chain (all in DOMAIN, since_version 1).
POST_MIX = "HyperConnectionPostMix"
BRANCH_NORM = "BranchwiseRMSNorm"
SCALED_SILU = "ScaledSiLU"
PRE_MIX = "HyperConnectionPreMix"
CHAIN_CONTRIB_OPS = (POST_MIX, BRANCH_NORM, SCALED_SILU, PRE_MIX)
BRANCH_NORM_DEFAULT_EPSILON = 1e-5

# Qwen3.8-Flash-Next's block: the shape and attributes benchmarks and demos use.
QWEN_CONFIG = {
    "num_branches": 4,
    "hidden": 2560,
    "rank": 320,
    "num_blocks": 96,
    "epsilon": 1e-6,
    "reduction_scale": 0.25,
    "silu_alpha": 0.25,
    "gate_div": 4.0,
    "gate_mul": 2.0,
}
# The same, as the op's attributes and as the builders' (C, H, R) keyword arguments.
QWEN_ATTRIBUTES = {name: QWEN_CONFIG[name] for name in FLOAT_ATTRIBUTES}
QWEN_SHAPE = {"C": QWEN_CONFIG["num_branches"], "H": QWEN_CONFIG["hidden"], "R": QWEN_CONFIG["rank"]}


def attribute_defaults() -> dict[str, float]:
    """Defaults of the optional attributes (num_branches has none)."""
    return {k: v for k, v in ATTRIBUTES.items() if v is not None}
