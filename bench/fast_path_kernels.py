"""Runs one fused node of the real shape (constant weights, prologue, streams_out) a few times per row
count, eagerly, so a profiler can time the fast path's two kernels one by one:

    HCFUSE_FORCE_PATH=fast ncu --clock-control none --metrics gpu__time_duration.sum -k regex:HcFast \\
        python3 bench/fast_path_kernels.py --rows 1 8 16

--op nbits runs the quantized op instead (int4, block_size 32, symmetric, as onnxruntime-genai quantizes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hcfuse._op import QWEN_CONFIG  # noqa: E402
from hcfuse.checking._ort_io import run_bound  # noqa: E402
from hcfuse.checking._session import CUDA, inference_session  # noqa: E402
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights  # noqa: E402
from hcfuse.models.nbits import make_nbits_node_model, nbits_weights  # noqa: E402

C, H, R = QWEN_CONFIG["num_branches"], QWEN_CONFIG["hidden"], QWEN_CONFIG["rank"]
ATTRS = {k: QWEN_CONFIG[k] for k in ("epsilon", "reduction_scale", "silu_alpha", "gate_div", "gate_mul")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--op", choices=["dense", "nbits"], default="dense")
    args = ap.parse_args()
    rng = np.random.default_rng(6)
    dtype = ml_dtypes.bfloat16
    weights = random_weights(C, H, R, dtype, rng)
    if args.op == "nbits":
        model = make_nbits_node_model(nbits_weights(weights), C=C, dtype=dtype, prologue=True, streams_out=True,
                                      **ATTRS)
    else:
        model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True,
                                      weights_as_inputs=False, weights=weights, **ATTRS)
    sess = inference_session(model, [CUDA], optimize=True)
    for rows in args.rows:
        feeds = random_activations((rows,), C, H, dtype, rng, prologue=True)
        for _ in range(args.iters):
            run_bound(sess, feeds, device="cuda")
        print(f"fast_path_kernels: {args.op} rows={rows} ran {args.iters} times", flush=True)


if __name__ == "__main__":
    main()
