"""Decode graphs holding ONNX Runtime GenAI's standard-ONNX expansion of the hyper-connection block.

ONNX Runtime GenAI's model builder (microsoft/onnxruntime-genai, `src/python/py/models/builders/
expansions/qwen3_8.py`, class `Qwen38`) can write each of the block's contrib ops as standard ONNX:

- BranchwiseRMSNorm `{b}/hc_norm`: Reshape `{n}/Reshape` to (..., C, H) by `/model/constants/INT64/
  [0, 0, C, H]` (paged: `[-1, C, H]`), SimplifiedLayerNormalization `{n}/SimplifiedLayerNormalization`
  (axis=-1, epsilon, stash_type=1) with an all-ones (H) scale `model.layers.{i}.{loc}_hyper_connection.
  hc_norm.norm_scale`, Reshape `{n}/Flatten` back by `[0, 0, C*H]` (paged `[-1, C*H]`), then Mul
  `{n}/Scale` by the (C*H) initializer `...hc_norm.weight` that holds the checkpoint's weight + 1;
- ScaledSiLU `{b}/input_mix_weight_down/SiLU`: Div `{s}/Div` by `/model/constants/{DTYPE}/{1/alpha:g}`,
  Sigmoid `{s}/Sigmoid`, Mul named `{s}` (z * sigmoid(z));
- HyperConnectionPreMix `{b}/mixed/Mean`: Reshapes `{p}/streams/Reshape` and `{p}/pre_mix/Reshape` of hn
  and g to (..., C, H), Mul `{p}/Mul`, ReduceMean named `{p}` over `/model/constants/INT64/[-2]`
  (keepdims=0): the mean, i.e. reduction_scale 1/C;
- HyperConnectionPostMix `{b}/injection`: Unsqueeze `{q}/output/Unsqueeze` of the block output by
  `[-2]`, Unsqueeze `{q}/weight/Unsqueeze` of the post gate by `[-1]`, Mul `{q}/Mul`, Reshape
  `{q}/Reshape` to (..., C*H), Add named `{q}` of the streams and that.

Everything else is the packed form of models.qwen_decode (the packed down/inject MatMul + Split, the
up MatMul + Sigmoid, the inject Div/Sigmoid/Mul, `/model/hyper_connection/Tile`, H x H stand-in
sublayers), with the builder's scalar constants as `/model/constant_nodes/...` Constant nodes. Token
dims are `batch_size, sequence_length` (reshapes by 0, 0, ...) or, paged, `num_tokens` (by -1, ...);
every value carries its shape as the builder's make_value writes it (value_info=False drops them),
except that a Constant's output is declared with its real shape (the builder's make_constant declares
every constant as [], lists included).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from hcfuse import _op
from hcfuse.models.qwen_decode import DecodeConfig, _GraphBuilder

BATCH_SEQUENCE = ("batch_size", "sequence_length")
PAGED = ("num_tokens",)


class _ExpansionBuilder(_GraphBuilder):
    """models.qwen_decode's builder with the four contrib ops written as the GenAI expansions."""

    def __init__(self, cfg: DecodeConfig, paged: bool):
        super().__init__(cfg)
        self.paged = paged

    def emit(self, op_type: str, name: str, inputs, last: list, output: str | None = None, **attributes) -> ir.Value:
        out = self.value(output or f"{name}/output_0", self.T, last)
        self.nodes.append(ir.node(op_type, inputs, attributes, outputs=[out], name=name))
        return out

    def dims(self, *tail: int) -> ir.Value:
        """The builder's reshape target: leading dims kept by 0 (or -1 for the paged token dim)."""
        lead = [-1] if self.paged else [0] * len(self.cfg.leading_dims)
        return self.constant(ir.DataType.INT64, [*lead, *tail])

    def axes(self, axis: int) -> ir.Value:
        return self.constant(ir.DataType.INT64, [axis])

    def branchwise_rms_norm(self, name: str, streams: ir.Value, index: int) -> ir.Value:
        C, H = self.cfg.C, self.cfg.H
        prefix = name[1:].replace("/", ".")
        grouped = self.emit("Reshape", f"{name}/Reshape", [streams, self.dims(C, H)], [C, H])
        ones = ir.Value(name=f"{prefix}.norm_scale", type=ir.TensorType(self.T), shape=ir.Shape([H]),
                        const_value=ir.tensor(np.ones(H, self.T.numpy())))
        self.initializers.append(ones)
        epsilon = _op.BRANCH_NORM_DEFAULT_EPSILON if self.cfg.epsilon is None else self.cfg.epsilon
        normalized = self.emit("SimplifiedLayerNormalization", f"{name}/SimplifiedLayerNormalization",
                               [grouped, ones], [C, H], axis=-1, epsilon=epsilon, stash_type=1)
        flat = self.emit("Reshape", f"{name}/Flatten", [normalized, self.dims(C * H)], [C * H])
        weight_plus_one = self.weight(f"{prefix}.weight", "norm", (C * H,), index)
        return self.emit("Mul", f"{name}/Scale", [flat, weight_plus_one], [C * H])

    def scaled_silu(self, name: str, x: ir.Value) -> ir.Value:
        R = self.cfg.R
        z = self.emit("Div", f"{name}/Div", [x, self.constant(self.T, float(f"{1 / self.cfg.silu_alpha:g}"))], [R])
        sigmoid = self.emit("Sigmoid", f"{name}/Sigmoid", [z], [R])
        return self.emit("Mul", name, [z, sigmoid], [R])

    def pre_mix(self, name: str, hn: ir.Value, g: ir.Value) -> ir.Value:
        C, H = self.cfg.C, self.cfg.H
        a = self.emit("Reshape", f"{name}/streams/Reshape", [hn, self.dims(C, H)], [C, H])
        b = self.emit("Reshape", f"{name}/pre_mix/Reshape", [g, self.dims(C, H)], [C, H])
        weighted = self.emit("Mul", f"{name}/Mul", [a, b], [C, H])
        return self.emit("ReduceMean", name, [weighted, self.axes(-2)], [H], keepdims=0)

    def post_mix(self, name: str, streams: ir.Value, block_output: ir.Value, gate: ir.Value) -> ir.Value:
        C, H = self.cfg.C, self.cfg.H
        out = self.emit("Unsqueeze", f"{name}/output/Unsqueeze", [block_output, self.axes(-2)], [1, H])
        weight = self.emit("Unsqueeze", f"{name}/weight/Unsqueeze", [gate, self.axes(-1)], [C, 1])
        weighted = self.emit("Mul", f"{name}/Mul", [out, weight], [C, H])
        flat = self.emit("Reshape", f"{name}/Reshape", [weighted, self.dims(C * H)], [C * H])
        return self.emit("Add", name, [streams, flat], [C * H])

    def block(self, index: int, streams: ir.Value, *, basename: str, combine: bool = True):
        """One hyper-connection mix as the builder's make_hyper_connection_mix with expansions."""
        cfg, C, R = self.cfg, self.cfg.C, self.cfg.R
        CH = C * cfg.H
        hn = self.branchwise_rms_norm(f"{basename}/hc_norm", streams, index)
        down_name = f"{basename}/input_mix_weight_down/MatMul"
        inject = None
        if combine:
            packed = self.matmul(f"{basename}/input_mix_down_block_inject/MatMul", hn, "packed", (CH, R + C), index)
            down = self.value(f"{down_name}/output_0", self.T, [R])
            inject = self.value(f"{basename}/block_inject_weight/MatMul/output_0", self.T, [C])
            self.nodes.append(ir.node("Split", [packed, self.constant(ir.DataType.INT64, [R, C])], {"axis": -1},
                                      outputs=[down, inject], name=f"{basename}/input_mix_down_block_inject/Split"))
        else:
            down = self.matmul(down_name, hn, "down", (CH, R), index)
        d = self.scaled_silu(f"{basename}/input_mix_weight_down/SiLU", down)
        up = self.matmul(f"{basename}/input_mix_weight_up/MatMul", d, "up", (R, CH), index)
        g = self.node("Sigmoid", f"{basename}/input_mix_weight_up/Sigmoid", [up], CH)
        pre = self.pre_mix(f"{basename}/mixed/Mean", hn, g)
        if not combine:
            return pre, None
        x = self.node("Div", f"{basename}/block_inject_weight/Div", [inject, self.scalar(cfg.gate_div)], C)
        x = self.node("Sigmoid", f"{basename}/block_inject_weight/Sigmoid", [x], C)
        return pre, self.node("Mul", f"{basename}/block_inject_weight/Mul", [x, self.scalar(cfg.gate_mul)], C)


def build_expansion_model(
    num_blocks: int, *, paged: bool = False, final_mix: bool = False, value_info: bool = True, **options
) -> ir.Model:
    """num_blocks hyper-connection blocks in the GenAI expansion form, as an onnx_ir.Model.

    paged: token dims `num_tokens` (reshapes by -1) instead of `batch_size, sequence_length` (by 0, 0).
    final_mix: append the final mix (`final_hyper_connection`: no inject half, separate down MatMul).
    value_info: False leaves intermediate values without shapes.
    options: C, H, R, dtype, epsilon, seed, sublayer, num_weight_sets of models.qwen_decode.
    Input `inputs_embeds` (*tokens, H), tiled into C streams; output `hidden_states`. The constants are
    the builder's for C streams: SiLU and inject Div by C, the mean over C, the inject gate Mul by 2.
    """
    C = options.get("C", _op.QWEN_CONFIG["num_branches"])
    cfg = DecodeConfig(num_blocks, leading_dims=PAGED if paged else BATCH_SEQUENCE, gate_div=float(C),
                       gate_mul=2.0, silu_alpha=1.0 / C, reduction_scale=1.0 / C, **options)
    b = _ExpansionBuilder(cfg, paged)
    embeds = b.value("inputs_embeds", b.T, [cfg.H])
    repeats = b.constant(ir.DataType.INT64, [1] * len(cfg.leading_dims) + [C])
    streams = b.node("Tile", "/model/hyper_connection/Tile", [embeds, repeats], C * cfg.H)
    for k in range(num_blocks):
        layer, location = k // 2, ("attn", "mlp")[k % 2]
        basename = f"/model/layers.{layer}/{location}_hyper_connection"
        pre, gate = b.block(k, streams, basename=basename)
        streams = b.post_mix(f"{basename}/injection", streams, b.sublayer(k, layer, location, pre), gate)
    if final_mix:
        layer = (num_blocks + 1) // 2
        streams, _ = b.block(num_blocks, streams, basename=f"/model/layers.{layer}/final_hyper_connection",
                             combine=False)
    streams.name = "hidden_states"
    if not value_info:
        for node in b.nodes:
            for out in node.outputs:
                if out is not streams:
                    out.shape = None
    graph = ir.Graph([embeds], [streams], nodes=b.nodes, initializers=b.initializers,
                     opset_imports={"": _op.ONNX_OPSET, _op.DOMAIN: 1}, name="genai_hyper_connection_expansion")
    return ir.Model(graph, ir_version=_op.IR_VERSION, producer_name="hcfuse.models")


def make_expansion_model(num_blocks: int, **options) -> onnx.ModelProto:
    """build_expansion_model as an onnx.ModelProto (weights generated)."""
    return ir.to_proto(build_expansion_model(num_blocks, **options))


__all__ = ["BATCH_SEQUENCE", "PAGED", "build_expansion_model", "make_expansion_model"]
