"""The decode benchmark's chains (bench_decode.py's docstring describes them) and each variant's model.

Two weight formats: "dense" (the dense op, com.microsoft.HyperConnectionLowRankMix, 16/32-bit weights) and
"int4" (ai.hcfuse.HyperConnectionLowRankMixNBits with both projections as onnxruntime-genai's int4 builds
quantize them: MatMulNBitsQuantizer(block_size=32, is_symmetric=True, accuracy_level=4), down and inject packed
into one weight of N = R + C, scales T [N, k_blocks], no zero points). A variant's model is its format's fused
chain, or for the stock variants hcfuse.unfuse of it (the int4 chain then holds com.microsoft.MatMulNBits).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hcfuse  # noqa: E402
from hcfuse import _op, _op_nbits  # noqa: E402
from hcfuse._op import IR_VERSION, QWEN_CONFIG  # noqa: E402
from hcfuse._op import ONNX_OPSET as OPSET  # noqa: E402
from hcfuse.models.hc_block import random_weights  # noqa: E402
from hcfuse.models.nbits import nbits_weights  # noqa: E402
from hcfuse.models.quantized import GENAI_INT4  # noqa: E402

C, H, R = QWEN_CONFIG["num_branches"], QWEN_CONFIG["hidden"], QWEN_CONFIG["rank"]
K = C * H
ATTRS = {k: QWEN_CONFIG[k] for k in ("epsilon", "reduction_scale", "silu_alpha", "gate_div", "gate_mul")}
# The int4 node's MatMulNBits attributes, as onnxruntime-genai's int4 build writes them (accuracy_level 4 does not
# change the fused op's computation; unfusion writes it back on the MatMulNBits nodes)
NBITS_ATTRS = {k: GENAI_INT4[k] for k in ("bits", "block_size", "accuracy_level")}
BLOCK_SIZE = NBITS_ATTRS["block_size"]
DTYPES = {"bf16": (ml_dtypes.bfloat16, TensorProto.BFLOAT16), "fp16": (np.float16, TensorProto.FLOAT16),
          "fp32": (np.float32, TensorProto.FLOAT)}
# Distinct weight sets cycling through a chain, per format: enough that they do not stay in the H100's 50 MB or
# the H200's 60 MB L2, as a real 96-block model's weights do not (dense bf16: 8 x 13.2 MB = 105 MB; int4 bf16:
# 32 x 3.7 MB = 119 MB, where 8 sets, 30 MB, would be served from the L2)
WEIGHT_SETS = {"dense": 8, "int4": 32}
STOCK = {"stock": "dense", "stock-int4": "int4"}  # the unfused variants and the format they unfuse
# fused variants of the int4 format (every other fused variant is dense): the quantized op on the path it picks,
# and pinned to its fast path or its general kernels
FUSED_INT4 = ("nbits", "nbits-fast", "nbits-general")


def variant_format(variant: str) -> str:
    """The weight format a variant's chain holds ("dense" or "int4"); "matmul" has none of the blocks."""
    return STOCK.get(variant) or ("int4" if variant in FUSED_INT4 else "dense")


def weight_bytes(fmt: str, itemsize: int) -> int:
    """Bytes of one block's weights: norm scale and the three products (dense), or norm scale, B and scales of
    down+inject (N = R + C, K = C*H) and up (N = C*H, K = R) at 4 bits (int4)."""
    if fmt == "dense":
        return (2 * K * R + K * C + K) * itemsize
    packed = sum(n * k // 2 + n * (k // BLOCK_SIZE) * itemsize for k, n in ((K, R + C), (R, K)))
    return K * itemsize + packed


def weight_sets(fmt: str, count: int, dtype, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """count weight sets of a format: hcfuse.models.hc_block's random weights, quantized for int4."""
    t0 = time.perf_counter()
    dense = (random_weights(C, H, R, dtype, rng) for _ in range(count))
    sets = [nbits_weights(w, bits=GENAI_INT4["bits"], block_size=BLOCK_SIZE, symmetric=GENAI_INT4["symmetric"])
            for w in dense] if fmt == "int4" else list(dense)
    size_mb = weight_bytes(fmt, np.dtype(dtype).itemsize) / 1e6
    print(f"{np.dtype(dtype).name} {fmt}: {count} weight sets of {size_mb:.2f} MB made in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    return sets


def sublayer_weights(dtype, rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """H x H matrices for --sublayer (the same dense MatMul between blocks for every variant)."""
    return [(rng.standard_normal((H, H)) / np.sqrt(H)).astype(dtype) for _ in range(count)]


def chain_model(num_blocks: int, elem: int, weights: list[dict[str, np.ndarray]],
                sublayers: list[np.ndarray] | None = None) -> onnx.ModelProto:
    """num_blocks fused nodes chained as bench_decode.py's docstring says; rows is a symbolic dim. The op is the
    weights' format's: dense (random_weights' dicts) or quantized (hcfuse.models.nbits.nbits_weights' dicts). With sublayers (H x H
    matrices), prev_block_output of block k+1 is MatMul(pre_output of block k, W[k % n]): the "real model" variant,
    a sublayer kernel (which does not trigger dependents early) between blocks."""
    spec = _op_nbits if _op_nbits.INPUTS[_op_nbits.DOWN_INJECT_WEIGHT] in weights[0] else _op
    attrs = {**ATTRS, **(NBITS_ATTRS if spec is _op_nbits else {})}
    weight_inputs = spec.INPUTS[spec.NORM_SCALE:spec.PREV_BLOCK_OUTPUT]  # absent ones (zero points) stay empty
    used = weights[:num_blocks]
    inits = [numpy_helper.from_array(w[name], f"w{s}_{name}") for s, w in enumerate(used) for name in w]
    inits += [numpy_helper.from_array(m, f"sub{s}") for s, m in enumerate((sublayers or [])[:num_blocks])]
    nodes = []
    prev = None  # (pre_output, post_gate, streams_out) of the previous block
    for k in range(num_blocks):
        s = k % len(weights)
        wnames = [f"w{s}_{n}" if n in weights[s] else "" for n in weight_inputs]
        if prev is not None and sublayers:
            nodes.append(helper.make_node("MatMul", [prev[0], f"sub{(k - 1) % len(sublayers)}"], [f"sub_out_{k}"],
                                          name=f"sublayer_{k}"))
            prev = [f"sub_out_{k}", prev[1], prev[2]]
        ins = ["streams", *wnames] if prev is None else [prev[2], *wnames, prev[0], prev[1]]
        while not ins[-1]:
            ins.pop()
        outs = [f"pre_{k}", f"gate_{k}", f"streams_{k}"]
        nodes.append(helper.make_node(spec.OP_TYPE, ins, outs, domain=spec.DOMAIN, name=f"block_{k}",
                                      num_branches=C, **attrs))
        prev = outs
    last = num_blocks - 1
    graph = helper.make_graph(
        nodes, f"hc_chain_{num_blocks}",
        [helper.make_tensor_value_info("streams", elem, ["rows", C * H])],
        [helper.make_tensor_value_info(f"pre_{last}", elem, ["rows", H]),
         helper.make_tensor_value_info(f"gate_{last}", elem, ["rows", C]),
         helper.make_tensor_value_info(f"streams_{last}", elem, ["rows", C * H])],
        inits)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(spec.DOMAIN, spec.SINCE_VERSION)]
    if spec is _op_nbits:
        opsets.append(helper.make_opsetid(_op.DOMAIN, 1))  # MatMulNBits' domain, for the unfused chain
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def matmul_chain_model(num_blocks: int, elem: int, sublayers: list[np.ndarray]) -> onnx.ModelProto:
    """The sublayers alone: x_{k+1} = MatMul(x_k, W[k % n]) for num_blocks - 1 steps (the real-model
    variant's MatMuls without the blocks), so the blocks' share of that variant can be told apart."""
    inits = [numpy_helper.from_array(m, f"sub{s}") for s, m in enumerate(sublayers[:num_blocks])]
    nodes = [helper.make_node("MatMul", [f"x_{k}", f"sub{k % len(sublayers)}"], [f"x_{k + 1}"])
             for k in range(num_blocks - 1)]
    nodes[0].input[0] = "streams"
    graph = helper.make_graph(nodes, f"matmul_chain_{num_blocks}",
                              [helper.make_tensor_value_info("streams", elem, ["rows", H])],
                              [helper.make_tensor_value_info(f"x_{num_blocks - 1}", elem, ["rows", H])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def variant_model(variant: str, fused: onnx.ModelProto | None, elem: int, num_blocks: int,
                  sublayers: list[np.ndarray] | None) -> onnx.ModelProto:
    """A variant's chain: `fused` (its format's fused chain of num_blocks) as it is, unfused for the stock
    variants, or the MatMuls alone for "matmul"."""
    if variant == "matmul":
        return matmul_chain_model(num_blocks, elem, sublayers)
    return hcfuse.unfuse(fused) if variant in STOCK else fused
