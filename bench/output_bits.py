"""One line per (dtype, path, shape, rows): a hash of every output of one fused node, so that two builds
of the library can be compared bit for bit on a GPU machine:

    HCFUSE_LIBRARY=build/libhcfuse_ops.so python3 bench/output_bits.py > bits.txt

The fast path (HCFUSE_FORCE_PATH=fast) at decode row counts, one pass and several, on the real shape
(the real shape's kernels) and on two other shapes (the generic kernels); the general path
(HCFUSE_FORCE_PATH=general) in every row range (few-row, mid, prefill, long prefill), each with a short
last tile. Constant weights, the prologue and streams_out; seeded, so every run feeds the same values.
Every case runs with the real model's attributes; a few also with attributes that are not powers of
two (shape name suffixed "+odd"), where post_gate's rounding points (the gate logit, its sigmoid and
post_gate) each change bits.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fused_node_session import cuda_fused_node_session  # noqa: E402
from hcfuse._op import QWEN_ATTRIBUTES, QWEN_SHAPE  # noqa: E402
from hcfuse.checking._ort_io import run_bound  # noqa: E402
from hcfuse.models.hc_block import random_activations  # noqa: E402

SHAPES = {"real": QWEN_SHAPE, "4x1024x64": dict(C=4, H=1024, R=64), "4x256x512": dict(C=4, H=256, R=512)}
CASES = {  # path -> (shapes, rows)
    "fast": (list(SHAPES), [1, 2, 3, 4, 8, 16, 33]),
    "general": (["real"], [1, 17, 257, 1029, 4099]),
}
# gate_div and gate_mul not powers of two, so that post_gate's three roundings matter
ODD_ATTRIBUTES = {"epsilon": 1e-5, "reduction_scale": 0.7, "silu_alpha": -0.5, "gate_div": 3.0, "gate_mul": 1.7}
ODD_CASES = {"fast": (["real"], [1, 16]), "general": (["real"], [17, 257])}


def print_hashes(path: str, cases: dict, attributes: dict, suffix: str) -> None:
    """One line per (dtype, shape, rows) of cases[path], the node's attributes given."""
    shapes, row_counts = cases[path]
    for name, dtype in [("bf16", ml_dtypes.bfloat16), ("fp16", np.float16)]:
        for shape_name in shapes:
            shape = SHAPES[shape_name]
            rng = np.random.default_rng(0)
            session = cuda_fused_node_session(shape, dtype, rng, attributes)
            for rows in row_counts:
                feeds = random_activations((rows,), shape["C"], shape["H"], dtype, rng, prologue=True)
                out = run_bound(session, feeds, device="cuda")
                digests = (f"{k}:{hashlib.sha1(np.ascontiguousarray(v).view(np.uint8)).hexdigest()[:10]}"
                           for k, v in sorted(out.items()))
                print(name, path, shape_name + suffix, rows, " ".join(digests), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", nargs="+", default=list(CASES), choices=list(CASES))
    args = ap.parse_args()
    for path in args.paths:
        os.environ["HCFUSE_FORCE_PATH"] = path  # read when the session creates its kernels
        print_hashes(path, CASES, QWEN_ATTRIBUTES, "")
        print_hashes(path, ODD_CASES, ODD_ATTRIBUTES, "+odd")
    os.environ.pop("HCFUSE_FORCE_PATH", None)


if __name__ == "__main__":
    main()
