"""verify's bound for quantized blocks: where onnxruntime's CPU MatMulNBits quantizes activations to int8
(accuracy_level 4) the fused op does not, and the gap, measured in hcfuse.checking.verification's doc, is
thousands of float32 ulp; INT8_ACTIVATIONS_MAX_ULP holds it, and a real fusion error still fails."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import hcfuse
from hcfuse import _op_nbits
from hcfuse.checking._session import CPU, CUDA
from hcfuse.checking.verification import (
    DEFAULT_MAX_ULP,
    FAILED,
    INT8_ACTIVATIONS_MAX_ULP,
    PASSED,
    default_max_ulp,
    verify,
)
from hcfuse.models.quantized import quantized_decode_model

F32 = ir.DataType.FLOAT
SHAPE = dict(C=4, H=64, R=16)


def _pair(accuracy_level, blocks=4, dtype=np.float32):
    original = quantized_decode_model(blocks, dtype=dtype, accuracy_level=accuracy_level, **SHAPE)
    return original, hcfuse.optimize(original)


@pytest.mark.parametrize("accuracy_level,provider,int8", [(4, CPU, True), (None, CPU, False), (4, CUDA, False)])
def test_the_bound_follows_the_original_matmulnbits(accuracy_level, provider, int8):
    _, optimized = _pair(accuracy_level, blocks=1)
    bounds, reason = default_max_ulp(ir.from_proto(optimized), provider)
    assert bounds == ({**DEFAULT_MAX_ULP, **INT8_ACTIVATIONS_MAX_ULP} if int8 else DEFAULT_MAX_ULP)
    assert ("quantizes their activations to int8" in reason) == int8


def test_dense_blocks_keep_the_dense_bound():
    from hcfuse.models.qwen_decode import make_decode_model

    optimized = hcfuse.optimize(make_decode_model(1, **SHAPE))
    assert default_max_ulp(ir.from_proto(optimized), CPU) == (DEFAULT_MAX_ULP, "")


def test_int8_activations_pass_within_their_bound_not_the_dense_one(hcfuse_lib):  # noqa: F811
    original, optimized = _pair(4)
    result = verify(original, optimized, providers=[CPU])
    assert result.status == PASSED, result.summary()
    assert "bound: quantized blocks whose original MatMulNBits have accuracy_level 4" in result.summary()
    (gap,) = result.outputs
    assert DEFAULT_MAX_ULP[F32] < gap.max_ulp <= INT8_ACTIVATIONS_MAX_ULP[F32] == gap.bound
    dense = verify(original, optimized, providers=[CPU], max_ulp={F32: DEFAULT_MAX_ULP[F32]})
    assert dense.status == FAILED, dense.summary()


def test_without_int8_activations_the_dense_bound_holds(hcfuse_lib):  # noqa: F811
    original, optimized = _pair(None)
    result = verify(original, optimized, providers=[CPU])
    assert result.status == PASSED and result.outputs[0].bound == DEFAULT_MAX_ULP[F32], result.summary()
    assert not result.bound_reason


def test_a_wrong_fusion_still_fails_within_the_int8_bound(hcfuse_lib):  # noqa: F811
    original, optimized = _pair(4)
    model = ir.from_proto(optimized)
    node = next(n for n in model.graph if n.op_type == _op_nbits.OP_TYPE)
    node.attributes["gate_mul"] = ir.AttrFloat32("gate_mul", 1.0)  # a lost constant (the builder's is 2)
    result = verify(original, ir.to_proto(model), providers=[CPU])
    assert result.status == FAILED, result.summary()


def test_a_wrong_scale_that_hides_under_the_int8_bound_fails(hcfuse_lib):  # noqa: F811
    """Halved up scales move a small chain's output by about 0.02 of its scale, far inside the int8 bound:
    verify catches it by running both models with every MatMulNBits at accuracy_level 0 first."""
    original, optimized = _pair(4)
    model = ir.from_proto(optimized)
    node = next(n for n in model.graph if n.op_type == _op_nbits.OP_TYPE)
    scales = node.inputs[_op_nbits.INPUTS.index("up_scales")]
    scales.const_value = ir.tensor(scales.const_value.numpy() * 0.5, name=scales.name)
    result = verify(original, ir.to_proto(model), providers=[CPU])
    assert result.status == FAILED and "accuracy_level 0" in result.reason, result.summary()
