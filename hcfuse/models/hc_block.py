"""Builders of small ONNX models around one HyperConnectionLowRankMix node, plus random weights.

Kernel tests (CPU and CUDA) and benchmarks build their sessions from these.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from hcfuse._op import (
    ATTRIBUTES,
    DOMAIN,
    INPUTS,
    IR_VERSION,
    NUM_REQUIRED_INPUTS,
    ONNX_OPSET,
    OP_TYPE,
    OUTPUTS,
    WEIGHT_INPUTS,
)


def weight_shapes(C: int, H: int, R: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the four weights for C branches of H features and rank R."""
    return {
        "norm_scale": (C * H,),
        "down_weight": (C * H, R),
        "up_weight": (R, C * H),
        "inject_weight": (C * H, C),
    }


def random_weights(C: int, H: int, R: int, dtype, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Weights of realistic magnitude (unit-variance products) rounded to dtype, keyed by input name."""
    width = C * H
    return {
        "norm_scale": (1.0 + 0.1 * rng.standard_normal(width)).astype(dtype),
        "down_weight": (rng.standard_normal((width, R)) / np.sqrt(width)).astype(dtype),
        "up_weight": (rng.standard_normal((R, width)) * (2.0 / np.sqrt(R))).astype(dtype),
        "inject_weight": (rng.standard_normal((width, C)) / np.sqrt(width)).astype(dtype),
    }


def random_activations(leading: Sequence[int], C: int, H: int, dtype, rng: np.random.Generator,
                       prologue: bool = False) -> dict[str, np.ndarray]:
    """streams (and, with prologue, prev_block_output and prev_post_gate) for the given leading dims."""
    lead = tuple(leading)
    out = {"streams": rng.standard_normal((*lead, C * H)).astype(dtype)}
    if prologue:
        out["prev_block_output"] = rng.standard_normal((*lead, H)).astype(dtype)
        out["prev_post_gate"] = rng.uniform(0.0, 2.0, (*lead, C)).astype(dtype)
    return out


def _elem_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def make_fused_node_model(
    *,
    C: int,
    H: int,
    R: int,
    dtype,
    leading_dims: Sequence[int | str] = ("rows",),
    prologue: bool = False,
    streams_out: bool = False,
    weights_as_inputs: bool = True,
    weights: dict[str, np.ndarray] | None = None,
    **attrs,
) -> onnx.ModelProto:
    """A model of one fused node; graph inputs/outputs carry the op's input and output names (hcfuse._op).

    leading_dims are ints or symbolic names. With weights_as_inputs=False the four weights are
    initializers taken from ``weights`` (see random_weights). attrs override attribute defaults;
    num_branches is always C.
    """
    unknown = set(attrs) - set(ATTRIBUTES)
    if unknown:
        raise ValueError(f"{OP_TYPE}: unknown attributes {sorted(unknown)}; expected some of {list(ATTRIBUTES)}")
    elem = _elem_type(dtype)
    lead = list(leading_dims)
    act_shapes = {"streams": [*lead, C * H], "prev_block_output": [*lead, H], "prev_post_gate": [*lead, C]}
    node_inputs = list(INPUTS[: NUM_REQUIRED_INPUTS + (2 if prologue else 0)])
    graph_inputs = [helper.make_tensor_value_info("streams", elem, act_shapes["streams"])]
    initializers = []
    if weights_as_inputs:
        graph_inputs += [helper.make_tensor_value_info(n, elem, list(s)) for n, s in weight_shapes(C, H, R).items()]
    else:
        if weights is None:
            raise ValueError(f"{OP_TYPE}: weights_as_inputs=False needs weights= (e.g. random_weights(...))")
        initializers = [numpy_helper.from_array(np.asarray(weights[n]).astype(dtype), n) for n in WEIGHT_INPUTS]
    if prologue:
        graph_inputs += [helper.make_tensor_value_info(n, elem, act_shapes[n])
                         for n in ("prev_block_output", "prev_post_gate")]
    out_names = list(OUTPUTS[: 3 if streams_out else 2])
    out_shapes = {"pre_output": [*lead, H], "post_gate": [*lead, C], "streams_out": [*lead, C * H]}
    graph_outputs = [helper.make_tensor_value_info(n, elem, out_shapes[n]) for n in out_names]
    node = helper.make_node(OP_TYPE, node_inputs, out_names, domain=DOMAIN, name="hc_lowrank_mix",
                            num_branches=C, **attrs)
    graph = helper.make_graph([node], "hc_fused_node", graph_inputs, graph_outputs, initializers)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(DOMAIN, 1)],
        ir_version=IR_VERSION,
    )


__all__ = [
    "make_fused_node_model",
    "random_activations",
    "random_weights",
    "weight_shapes",
]
