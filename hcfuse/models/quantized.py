"""Decode graphs quantized as onnxruntime-genai's int4 builds quantize them, for tests and benchmarks.

The genai model builder runs onnxruntime's `MatMulNBitsQuantizer` over the whole finished graph, so every
MatMul with a constant weight, both projections of each hyper-connection block included, becomes a
`com.microsoft.MatMulNBits` (B uint8 [N, k_blocks, blob], scales T [N, k_blocks], packed uint8 zero points
when asymmetric). `quantize_model` runs that quantizer on a model (float32, float16 and bfloat16 weights
alike: it widens bfloat16 to float32 and narrows the scales back); `zp_form="T"` then rewrites the zero
points as T [N, k_blocks], the one form of MatMulNBits the quantizer does not write;
`save_quantized_genai_model_folder` quantizes the decoder of an onnxruntime-genai-shaped model folder.
Needs onnxruntime.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import onnx
import onnx_ir as ir

from hcfuse.models.genai_model_folder import MODEL_FILE, save_genai_model_folder
from hcfuse.models.qwen_decode import make_decode_model

ZP_FORMS = (None, "T")
# quantize_model's options as onnxruntime-genai's int4 builds set them (its defaults; named where a caller says so)
GENAI_INT4 = {"bits": 4, "block_size": 32, "symmetric": True, "accuracy_level": 4}


def projection_names(layer: int = 0, location: str = "attn", *, packed: bool = True) -> dict[str, str]:
    """The names of one block's projection MatMuls as the builder writes them (for nodes_to_exclude)."""
    base = f"/model/layers.{layer}/{location}_hyper_connection"
    names = {"up": f"{base}/input_mix_weight_up/MatMul"}
    if packed:
        names["down_inject"] = f"{base}/input_mix_down_block_inject/MatMul"
    else:
        names.update(down=f"{base}/input_mix_weight_down/MatMul", inject=f"{base}/block_inject_weight/MatMul")
    return names


def quantize_model(model: onnx.ModelProto, *, bits: int = 4, block_size: int = 32, symmetric: bool = True,
                   accuracy_level: int | None = 4, exclude: Sequence[str] = (), zp_form: str | None = None,
                   ) -> onnx.ModelProto:
    """model with its MatMuls quantized by MatMulNBitsQuantizer(bits, block_size, is_symmetric, accuracy_level,
    nodes_to_exclude=exclude); zp_form "T" turns the packed zero points into T zero points (asymmetric only)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if zp_form not in ZP_FORMS:
        raise ValueError(f"quantize_model: zp_form must be None or 'T'; got {zp_form!r}")
    if zp_form and symmetric:
        raise ValueError("quantize_model: zp_form 'T' needs symmetric=False (a symmetric quantization has none)")
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # it logs every node at INFO
    try:
        quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=symmetric,
                                         accuracy_level=accuracy_level, nodes_to_exclude=list(exclude))
        quantizer.process()
    finally:
        quiet.setLevel(level)
    out = quantizer.model.model
    return _zero_points_as_t(out) if zp_form == "T" else out


def _zero_points_as_t(model: onnx.ModelProto) -> onnx.ModelProto:
    from hcfuse.reference_nbits import unpack_zero_points

    m = ir.from_proto(model)
    for node in m.graph:
        if node.op_type != "MatMulNBits" or len(node.inputs) < 4 or node.inputs[3] is None:
            continue
        zp, scales = node.inputs[3], node.inputs[2]
        bits = node.attributes.get_int("bits", 4)
        values = unpack_zero_points(zp.const_value.numpy(), bits, scales.shape[1]).astype(scales.dtype.numpy())
        zp.const_value = ir.tensor(values, name=zp.name)
        zp.type, zp.shape = ir.TensorType(scales.dtype), ir.Shape(values.shape)
    return ir.to_proto(m)


def quantized_decode_model(num_blocks: int, *, bits: int = 4, block_size: int = 32, symmetric: bool = True,
                           accuracy_level: int | None = 4, exclude: Sequence[str] = (), zp_form: str | None = None,
                           **options) -> onnx.ModelProto:
    """hcfuse.models.qwen_decode.make_decode_model(num_blocks, **options), then quantize_model."""
    dense = make_decode_model(num_blocks, **options)
    return quantize_model(dense, bits=bits, block_size=block_size, symmetric=symmetric,
                          accuracy_level=accuracy_level, exclude=exclude, zp_form=zp_form)


def save_quantized_genai_model_folder(directory: str | os.PathLike, num_blocks: int, *, quantizer: dict | None = None,
                                      **options) -> str:
    """hcfuse.models.genai_model_folder.save_genai_model_folder(directory, num_blocks, **options), its decoder then
    quantized in place by quantize_model(**quantizer) (weights in model.onnx.data). Returns the directory."""
    directory = save_genai_model_folder(directory, num_blocks, **options)
    path = os.path.join(directory, MODEL_FILE)
    quantized = quantize_model(onnx.load(path), **(quantizer or {}))  # every weight read: the data file is free
    ir.save(ir.from_proto(quantized), path, external_data=MODEL_FILE + ".data")
    return directory


__all__ = ["ZP_FORMS", "projection_names", "quantize_model", "quantized_decode_model",
           "save_quantized_genai_model_folder"]
