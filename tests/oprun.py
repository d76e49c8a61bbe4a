"""onnx.reference OpRun classes for the four stock contrib ops and the fused op, so that
ReferenceEvaluator(model, new_ops=CONTRIB_OPS) runs either the unfused chain or the fused node.

They implement the forms the fused op replaces (flattened (..., C*H) streams, post_mix/pre_mix of
shape (..., C) or (..., C*H), no stream_mix) with hcfuse.reference's step functions, so one
contract serves both graphs; anything else raises NotImplementedError naming the op and the form.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun

from hcfuse import reference
from hcfuse._op import ATTRIBUTES, BRANCH_NORM, BRANCH_NORM_DEFAULT_EPSILON, DOMAIN, OP_TYPE, POST_MIX, PRE_MIX, SCALED_SILU

_F32 = np.float32


def _branches(x: np.ndarray, C: int | None, op: str) -> tuple[np.ndarray, tuple[int, ...], int]:
    """(rows, C, H) fp32 view of a flattened (..., C*H) input, its leading dims, and H."""
    if not C or x.ndim < 1 or x.shape[-1] % C:
        raise NotImplementedError(f"{op}: only flattened (..., C*H) inputs with num_branches are supported; "
                                  f"got shape {x.shape}, num_branches={C}")
    lead = x.shape[:-1]
    H = x.shape[-1] // C
    return x.reshape(-1, C, H).astype(_F32), lead, H


def _per_branch(m: np.ndarray, rows: int, C: int, H: int, op: str, name: str) -> np.ndarray:
    """A mix input of shape (..., C), (..., C, 1) or (..., C*H) as (rows, C, H or 1) fp32."""
    if m.size == rows * C:
        return m.reshape(rows, C, 1).astype(_F32)
    if m.size == rows * C * H:
        return m.reshape(rows, C, H).astype(_F32)
    raise NotImplementedError(f"{op}: {name} of shape {m.shape} is not (..., C) or (..., C*H) for C={C}, H={H}")


class HyperConnectionPostMix(OpRun):
    op_domain = DOMAIN

    def _run(self, streams, block_output, post_mix, stream_mix=None, num_branches=None):
        if stream_mix is not None:
            raise NotImplementedError(f"{POST_MIX}: stream_mix is not supported by this reference")
        x, lead, H = _branches(streams, num_branches, POST_MIX)
        rows = x.shape[0]
        gate = _per_branch(post_mix, rows, num_branches, H, POST_MIX, "post_mix")
        s = reference.post_mix_f32(x, block_output.reshape(rows, H).astype(_F32), gate, streams.dtype)
        return (s.astype(streams.dtype).reshape(streams.shape),)


class BranchwiseRMSNorm(OpRun):
    op_domain = DOMAIN

    def _run(self, X, scale=None, num_branches=None, epsilon=BRANCH_NORM_DEFAULT_EPSILON):
        x, lead, H = _branches(X, num_branches, BRANCH_NORM)
        w = _F32(1.0) if scale is None else scale.astype(_F32).reshape(-1, H)  # (C*H), (C, H) or (H)
        hn = reference.rms_norm_branches_f32(x, w, epsilon, X.dtype)
        return (hn.astype(X.dtype).reshape(X.shape),)


class ScaledSiLU(OpRun):
    op_domain = DOMAIN

    def _run(self, X, scale=None, alpha=1.0):
        if scale is not None:
            if np.ndim(scale) != 0:
                raise ValueError(f"{SCALED_SILU}: scale must be a 0-d scalar; got shape {np.shape(scale)}")
            alpha = float(scale)
        _, _, hidden = reference.scaled_silu_f32(X.astype(_F32), alpha, X.dtype)
        return (hidden.astype(X.dtype),)


class HyperConnectionPreMix(OpRun):
    op_domain = DOMAIN

    def _run(self, streams, pre_mix, num_branches=None, reduction_scale=1.0):
        x, lead, H = _branches(streams, num_branches, PRE_MIX)
        g = np.broadcast_to(_per_branch(pre_mix, x.shape[0], num_branches, H, PRE_MIX, "pre_mix"), x.shape)
        y = reference.pre_mix_f32(x, g, reduction_scale, streams.dtype)
        return (y.astype(streams.dtype).reshape(*lead, H),)


class HyperConnectionLowRankMix(OpRun):
    op_domain = DOMAIN

    def _run(self, streams, norm_scale, down_weight, up_weight, inject_weight, prev_block_output=None,
             prev_post_gate=None, num_branches=None, epsilon=ATTRIBUTES["epsilon"],
             reduction_scale=ATTRIBUTES["reduction_scale"], silu_alpha=ATTRIBUTES["silu_alpha"],
             gate_div=ATTRIBUTES["gate_div"], gate_mul=ATTRIBUTES["gate_mul"]):
        if num_branches is None:
            raise ValueError(f"{OP_TYPE}: attribute num_branches is required")
        outs = reference.hc_lowrank_mix(
            streams, norm_scale, down_weight, up_weight, inject_weight, prev_block_output, prev_post_gate,
            num_branches=num_branches, epsilon=epsilon, reduction_scale=reduction_scale, silu_alpha=silu_alpha,
            gate_div=gate_div, gate_mul=gate_mul)
        return outs[: len(self.output)]


CONTRIB_OPS = [HyperConnectionPostMix, BranchwiseRMSNorm, ScaledSiLU, HyperConnectionPreMix, HyperConnectionLowRankMix]
