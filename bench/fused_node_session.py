"""One fused node on CUDA, as the GPU scripts run it: prologue and streams_out, weights as constant
initializers, hcfuse's library registered."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hcfuse  # noqa: E402
from hcfuse.checking._session import CUDA, inference_session  # noqa: E402
from hcfuse.models.hc_block import make_fused_node_model, random_weights  # noqa: E402


def cuda_fused_node_session(shape: dict, dtype, rng, attributes: dict):
    """An onnxruntime session of one node of shape (C, H, R) with random weights drawn from rng."""
    weights = random_weights(**shape, dtype=dtype, rng=rng)
    model = make_fused_node_model(**shape, dtype=dtype, prologue=True, streams_out=True, weights_as_inputs=False,
                                  weights=weights, **attributes)
    return inference_session(model, [(CUDA, {})], library=hcfuse.get_library_path())
