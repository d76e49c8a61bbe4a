"""One line per (dtype, rows): a hash of every output of the general path at the real shape (prologue,
streams_out), so that two builds of the library can be compared bit for bit on a GPU machine:
    HCFUSE_LIBRARY=build/libhcfuse_ops.so python3 bench/general_path_bits.py > bits.txt
The rows cover the few-row, mid, prefill and long prefill ranges, each with a short last tile."""

from __future__ import annotations

import argparse
import hashlib

import ml_dtypes
import numpy as np

import hcfuse
from hcfuse._op import QWEN_ATTRIBUTES, QWEN_SHAPE
from hcfuse.checking._ort_io import run_bound
from hcfuse.checking._session import CUDA, inference_session
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[17, 257, 1029, 4099])
    args = ap.parse_args()
    for name, dtype in [("bf16", ml_dtypes.bfloat16), ("fp16", np.float16)]:
        rng = np.random.default_rng(0)
        weights = random_weights(**QWEN_SHAPE, dtype=dtype, rng=rng)
        model = make_fused_node_model(**QWEN_SHAPE, dtype=dtype, prologue=True, streams_out=True,
                                      weights_as_inputs=False, weights=weights, **QWEN_ATTRIBUTES)
        session = inference_session(model, [(CUDA, {})], library=hcfuse.get_library_path())
        for rows in args.rows:
            feeds = random_activations((rows,), QWEN_SHAPE["C"], QWEN_SHAPE["H"], dtype, rng, prologue=True)
            out = run_bound(session, feeds, device="cuda")
            digests = (f"{k}:{hashlib.sha1(np.ascontiguousarray(v).view(np.uint8)).hexdigest()[:10]}"
                       for k, v in sorted(out.items()))
            print(name, rows, " ".join(digests), flush=True)


if __name__ == "__main__":
    main()
