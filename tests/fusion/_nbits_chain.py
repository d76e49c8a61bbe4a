"""Helpers of the quantized-block tests: chains quantized by onnxruntime's MatMulNBitsQuantizer, and both
models run by onnx's ReferenceEvaluator (hcfuse's library need not have the quantized kernel): MatMulNBits as
its definition says (fp32 weights, the product rounded to T), the fused node by hcfuse.reference_nbits."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from hcfuse import _op_nbits
from hcfuse.models.quantized import GENAI_INT4, quantized_decode_model
from hcfuse.reference_nbits import dequantize, hc_lowrank_mix_nbits
from tests.fusion._chain import C, H, R
from tests.oprun import CONTRIB_OPS

# the small chain (2 blocks and the final mix) the quantizer turns into an int4 genai build's form
SMALL = dict(C=C, H=H * 4, R=R * 2, final_mix=True, tile_embeddings=False)


def quantized_chain(num_blocks: int = 2, *, quantizer: dict | None = None, **options) -> ir.Model:
    return ir.from_proto(quantized_decode_model(num_blocks, **{**GENAI_INT4, **(quantizer or {})},
                                                **{**SMALL, **options}))


def nbits_nodes(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == _op_nbits.OP_TYPE and n.domain == _op_nbits.DOMAIN]


def matmul_nbits(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == "MatMulNBits"]


class MatMulNBits(OpRun):
    op_domain = "com.microsoft"

    def _run(self, A, B, scales, zero_points=None, g_idx=None, bias=None, K=None, N=None, bits=4, block_size=None,
             accuracy_level=0, weight_prepacked=0):
        w = dequantize(B, scales, zero_points, bits, block_size, K)
        return ((A.astype(np.float32) @ w).astype(A.dtype),)


class HyperConnectionLowRankMixNBits(OpRun):
    op_domain = _op_nbits.DOMAIN

    def _run(self, *inputs, **attrs):
        given = dict(zip(_op_nbits.INPUTS, inputs))
        outs = hc_lowrank_mix_nbits(**given, **{k: v for k, v in attrs.items() if v is not None})
        return outs[: len(self.output)]


def run_reference(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = onnx.inliner.inline_local_functions(ir.to_proto(model))  # the evaluator's new_ops miss functions
    evaluator = ReferenceEvaluator(proto, new_ops=[*CONTRIB_OPS, MatMulNBits, HyperConnectionLowRankMixNBits])
    return evaluator.run(None, feeds)


def feeds(model: ir.Model, rows: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    (value,) = model.graph.inputs
    width = value.shape[-1]
    data = np.random.default_rng(seed).standard_normal((1, rows, width)).astype(np.float32)
    return {value.name: data.astype(value.dtype.numpy())}
