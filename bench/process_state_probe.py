"""Does an open session's captured graph run slower after other sessions run? (bench/README.md, "eighth session")

Keeps two 48-block sessions open - the op's own path at 256 rows (the general path) and the fast path at 1 row -
and times one replay of each (best of 5 repetitions, us) after each step: another fused session created and run,
a stock session created and run at 1 and 256 rows, a chain of ONNX Runtime MatMuls run, the others freed. Prints
the SM clock (nvidia-smi) with every line. On the H200 the general path's line went 1400 -> 1505 us at the stock
session's first run and stayed there; the fast path's did not move.

    python3 bench/process_state_probe.py     # on a GPU machine with onnxruntime-gpu and the built library
"""

from __future__ import annotations

import gc
import time

import numpy as np

import bench_decode as bd
import hcfuse


def main() -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(6)
    dtype, elem = bd.DTYPES["bf16"]
    weights = [bd.random_weights(bd.C, bd.H, bd.R, dtype, rng) for _ in range(bd.WEIGHT_SETS)]
    sublayers = [(rng.standard_normal((bd.H, bd.H)) / np.sqrt(bd.H)).astype(dtype) for _ in range(bd.WEIGHT_SETS)]
    t0 = time.time()

    def session(blocks: int, variant: str) -> bd.ChainRunner:
        model = bd.chain_model(blocks, dtype, elem, weights)
        return bd.ChainRunner(ort, hcfuse.unfuse(model) if variant == "stock" else model, variant, elem, dtype)

    def replay_us(runner: bd.ChainRunner, rows: int, graph_id: int) -> float:
        return bd.time_chains({0: runner}, rows, graph_id, 5, 60, 3e-3, 0.1, rng)[0]

    general, fast = session(48, "auto"), session(48, "fast")

    def show(step: str) -> None:
        print(f"{time.time() - t0:6.1f} s  {step:30s} auto at 256 rows {replay_us(general, 256, 0):8.1f} us  "
              f"fast at 1 row {replay_us(fast, 1, 0):7.1f} us  SM clock {bd.sm_clock_mhz()} MHz", flush=True)

    show("baseline")
    show("baseline again")
    other = session(96, "auto")
    show("fused 96-block session created")
    replay_us(other, 256, 0)
    show("... and run")
    stock = session(48, "stock")
    show("stock session created")
    replay_us(stock, 1, 0)
    show("... run at 1 row")
    replay_us(stock, 256, 1)
    show("... run at 256 rows")
    matmuls = bd.ChainRunner(ort, bd.matmul_chain_model(48, elem, dtype, sublayers), "matmul", elem, dtype)
    replay_us(matmuls, 1, 0)
    show("MatMul chain run")
    del other, stock, matmuls
    gc.collect()
    show("all but these two freed")


if __name__ == "__main__":
    main()
