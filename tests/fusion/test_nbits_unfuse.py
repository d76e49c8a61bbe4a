"""hcfuse.unfuse on the quantized op: fuse -> unfuse gives back the chain as onnxruntime-genai's int4 builds
hold it (the packed down+inject MatMulNBits and its Split, the up MatMulNBits): the same nodes, reading the
same initializer bytes with the same attributes, running in a plain onnxruntime to the same outputs."""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest

import hcfuse
from hcfuse import _op_nbits
from tests._compare import cpu_session
from tests.fusion._nbits_chain import nbits_nodes, quantized_chain


def _constant(value: ir.Value):
    """A constant input as (name, dtype, shape, bytes): an initializer and a Constant node alike."""
    tensor = value.const_value if value.producer() is None else value.producer().attributes["value"].value
    return value.name, tensor.dtype, tuple(tensor.shape.dims), tensor.tobytes()


def _input(value: ir.Value | None):
    if value is None:
        return None
    producer = value.producer()
    if producer is None or producer.op_type == "Constant":
        return _constant(value) if (value.const_value is not None or producer is not None) else ("input", value.name)
    return ("computed", producer.op_type, value.index())


def chain(model: onnx.ModelProto) -> collections.Counter:
    """Each node as what it computes: op, domain, attributes and its inputs (constants by name and bytes,
    computed values by the op that makes them); names of nodes and computed values aside."""
    graph = ir.from_proto(model).graph
    return collections.Counter(
        (n.op_type, n.domain, tuple(sorted((k, repr(a.value)) for k, a in n.attributes.items())),
         tuple(_input(v) for v in n.inputs))
        for n in graph if n.op_type != "Constant"
    )


def _run(model: onnx.ModelProto, data):
    return cpu_session(model, None).run(None, data)


def _data(model: onnx.ModelProto, rows: int = 3):
    (value,) = ir.from_proto(model).graph.inputs
    x = np.random.default_rng(0).standard_normal((1, rows, value.shape[-1])).astype(np.float32)
    return {value.name: x.astype(value.dtype.numpy())}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("bits,symmetric,zp_form", [(4, True, None), (4, False, None), (8, False, None),
                                                     (4, False, "T")])
def test_fuse_then_unfuse_gives_the_packed_chain_back(dtype, bits, symmetric, zp_form):
    original = ir.to_proto(quantized_chain(
        3, dtype=dtype, final_mix=False, quantizer=dict(bits=bits, symmetric=symmetric, zp_form=zp_form)))
    fused = hcfuse.optimize(original)
    assert len(nbits_nodes(ir.from_proto(fused))) == 3
    unfused = hcfuse.unfuse(fused)
    onnx.checker.check_model(unfused)
    assert chain(unfused) == chain(original)
    assert {o.domain for o in unfused.opset_import} == {o.domain for o in original.opset_import}
    data = _data(original)
    for got, want in zip(_run(unfused, data), _run(original, data), strict=True):
        np.testing.assert_array_equal(got, want)


def test_separate_down_and_inject_come_back_packed():
    original = ir.to_proto(quantized_chain(2, packed=False, final_mix=False, quantizer=dict(symmetric=False)))
    unfused = hcfuse.unfuse(hcfuse.optimize(original))
    ops = collections.Counter(n.op_type for n in unfused.graph.node)
    assert ops["Split"] == 2 and ops["MatMulNBits"] == 2 * 2 + 2  # packed and up per block, 2 sublayers
    data = _data(original)
    for got, want in zip(_run(unfused, data), _run(original, data), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_dense_projection_comes_back_a_matmul():
    m = quantized_chain(1, final_mix=False, quantizer=dict(
        exclude=["/model/layers.0/attn_hyper_connection/input_mix_weight_up/MatMul"]))
    original = ir.to_proto(m)
    unfused = hcfuse.unfuse(hcfuse.optimize(original))
    assert chain(unfused) == chain(original)


def test_a_quantized_node_without_the_shapes_it_needs_says_which():
    fused = hcfuse.optimize(quantized_chain(1, final_mix=False, dtype=ml_dtypes.bfloat16))
    node = nbits_nodes(fused)[0]
    node.inputs[_op_nbits.UP_WEIGHT].shape = None
    weight = r"'model\.layers\.0\.attn_hyper_connection\.input_mix_weight_up\.MatMul\.weight_Q4'"
    with pytest.raises(ValueError, match=rf"HyperConnectionLowRankMixNBits node '.*': dim 0 of {weight}"):
        hcfuse.unfuse(fused)
