"""Decode graphs holding the hyper-connection block as onnxruntime's `mobius` exporter writes it.

mobius (`src/mobius/models/qwen4_exp.py`, the Qwen4Exp text core: `Qwen4ExpGroupedRMSNorm`,
`Qwen4ExpGatedResidual`, `Qwen4ExpDecoderLayer`, `Qwen4ExpTextModel`) traces the block with onnxscript's
builder as pure standard ONNX, then folds constants. What its output holds, per block
`model.layers.{i}.{attn|mlp}_hyper_connection` (the final one `model.hyper_connection_mixer`):

- the norm `hc_norm` in float32: Shape(S); Cast(S, FLOAT); Reshape by `[-1, C, H]`; Mul(x, x);
  ReduceMean([-1], keepdims=1); Add epsilon (a float32 scalar); Sqrt; Reciprocal; Mul(x, that); the weight
  + 1 as Cast(weight, FLOAT), Add of one Constant(value_float=1.0) shared by the whole graph, Reshape by
  `[C, H]`; Mul; Reshape back by Shape(S); Cast(to=T) (constant folding turns the CastLike into a Cast; in
  float32 every Cast to FLOAT is gone);
- MatMul by the pre-transposed `input_mix_weight_down.weight_t` [C*H, R], Div by C (a T scalar), Swish
  (opset 24, alpha 1); MatMul by `input_mix_weight_up.weight_t` [R, C*H], Sigmoid;
- the pre-mix: Reshape of the gate and of hn by `[0, 0, C, H]`, Mul(gate, hn) in T, Cast(FLOAT),
  ReduceMean([-2], keepdims=0), Cast(to=T) (premix_in="T": an earlier revision, the mean in T, no casts);
- the inject gate: MatMul by `block_inject_weight.weight_t` [C*H, C], Div by C, Sigmoid, Mul by 2 (the
  final mixer has none);
- the post-mix (`Qwen4ExpGatedResidual.inject`): Add(S, Reshape(Mul(Unsqueeze(out, [-2]), Unsqueeze(gate,
  [-1])), `[0, 0, -1]`)).

The streams start as a Concat of C copies of `inputs_embeds`; ple_before lists the blocks whose input is
Add(S, PLE(S)) (per-layer embeddings, a graph input `ple_output.{k}` here), token_mask multiplies the
pre-mix output of the attention blocks by Unsqueeze(Cast(token_mask, T), [-1]) (its linear-attention
layers). Between blocks an H x H MatMul stands in for attention / MoE. Node names and value names follow
onnxscript's builder (`model/layers.0/attn_hyper_connection/hc_norm/Cast_node_2`,
`v_model.layers.0.attn_hyper_connection.hc_norm.Cast_2`); shared constants are initializers
`const_1d_{k}` (int64 lists) and `const_{value}_{f32|f16|bf16}` (scalars). Opset imports are {"": 24}
only, IR version 11.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx_ir as ir

from hcfuse.reference import SUPPORTED_DTYPES

OPSET = 24
IR_VERSION = 11
TOKENS = ("batch_size", "sequence_length")
_SUFFIX = {ir.DataType.FLOAT: "f32", ir.DataType.FLOAT16: "f16", ir.DataType.BFLOAT16: "bf16"}


@dataclasses.dataclass(frozen=True)
class MobiusConfig:
    num_blocks: int
    C: int = 4
    H: int = 2560
    R: int = 320
    dtype: type = np.float32
    epsilon: float = 1e-6
    final_mix: bool = True
    ple_before: tuple = ()
    token_mask: bool = False
    premix_in: str = "float"
    value_info: bool = True
    seed: int = 0

    def __post_init__(self):
        if np.dtype(self.dtype) not in SUPPORTED_DTYPES:
            raise ValueError(f"mobius model: dtype must be float32, float16 or bfloat16; got {self.dtype}")
        if self.premix_in not in ("float", "T"):
            raise ValueError(f"mobius model: premix_in must be 'float' or 'T'; got {self.premix_in!r}")


class _Builder:
    """Appends nodes named as onnxscript's builder names them; one node counter for the graph."""

    def __init__(self, cfg: MobiusConfig):
        self.cfg = cfg
        self.T = ir.DataType.from_numpy(np.dtype(cfg.dtype))
        self.nodes: list[ir.Node] = []
        self.initializers: dict[str, ir.Value] = {}
        self.inputs: list[ir.Value] = []
        self.lists = 0
        self.one = None  # the shared Constant(value_float=1.0)

    def shape(self, *tail) -> ir.Shape | None:
        return ir.Shape([*TOKENS, *tail]) if self.cfg.value_info else None

    def node(self, scope: str, op_type: str, inputs, dtype: ir.DataType | None = None, tail=None, **attrs) -> ir.Value:
        n = len(self.nodes)
        name = f"{scope}/{op_type}_node_{n}"
        shape = self.shape(*tail) if isinstance(tail, (list, tuple)) else None
        out = ir.Value(name=f"v_{scope.replace('/', '.')}.{op_type}_{n}", type=ir.TensorType(dtype or self.T),
                       shape=shape)
        self.nodes.append(ir.node(op_type, inputs, attrs, outputs=[out], name=name))
        return out

    def const(self, value, dtype: ir.DataType) -> ir.Value:
        """A folded constant as the builder names it: `const_1d_{k}` for lists, `const_{v}_{type}` scalars."""
        if isinstance(value, list):
            key = ("list", tuple(value))
            name = None
        else:
            key = ("scalar", float(value), dtype)
            name = f"const_{float(value)!r}_{_SUFFIX[dtype]}"
        cached = self.initializers.get(str(key))
        if cached is not None:
            return cached
        if name is None:
            name = f"const_1d_{self.lists}"
            self.lists += 1
        array = np.array(value, dtype=np.int64 if isinstance(value, list) else dtype.numpy())
        out = ir.Value(name=name, type=ir.TensorType(ir.DataType.INT64 if isinstance(value, list) else dtype),
                       shape=ir.Shape(array.shape), const_value=ir.tensor(array, name=name))
        self.initializers[str(key)] = out
        return out

    def weight(self, name: str, shape: tuple, role: str, index: int) -> ir.Value:
        rng = np.random.default_rng([self.cfg.seed, index, sum(map(ord, role))])
        CH = self.cfg.C * self.cfg.H
        scale = {"norm": 0.1, "down": CH ** -0.5, "up": 2.0 * self.cfg.R ** -0.5, "inject": 2.0 * CH ** -0.5,
                 "sublayer": self.cfg.H ** -0.5}[role]
        data = (rng.standard_normal(shape) * scale).astype(self.T.numpy())
        value = ir.Value(name=name, type=ir.TensorType(self.T), shape=ir.Shape(shape),
                         const_value=ir.tensor(data, name=name))
        self.initializers[name] = value
        return value

    def to_float(self, scope: str, x: ir.Value, tail) -> ir.Value:
        if self.T == ir.DataType.FLOAT:
            return x  # a Cast to the type x has: folded away
        return self.node(scope, "Cast", [x], ir.DataType.FLOAT, tail, to=ir.DataType.FLOAT)

    def to_T(self, scope: str, x: ir.Value, tail) -> ir.Value:
        if self.T == ir.DataType.FLOAT:
            return x
        return self.node(scope, "Cast", [x], self.T, tail, to=self.T)

    def norm(self, prefix: str, s: ir.Value, index: int) -> ir.Value:
        C, H = self.cfg.C, self.cfg.H
        scope, F = f"{prefix}/hc_norm", ir.DataType.FLOAT
        original_shape = self.node(scope, "Shape", [s], ir.DataType.INT64, None)
        grouped = self.node(scope, "Reshape", [self.to_float(scope, s, [C * H]), self.const([-1, C, H], F)], F)
        squares = self.node(scope, "Mul", [grouped, grouped], F)
        variance = self.node(scope, "ReduceMean", [squares, self.const([-1], F)], F, keepdims=1)
        shifted = self.node(scope, "Add", [variance, self.const(self.cfg.epsilon, F)], F)
        inverse = self.node(scope, "Reciprocal", [self.node(scope, "Sqrt", [shifted], F)], F)
        normalized = self.node(scope, "Mul", [grouped, inverse], F)
        weight = self.weight(f"{prefix[1:] if prefix.startswith('/') else prefix}.hc_norm.weight".replace("/", "."),
                             (C * H,), "norm", index)
        if self.one is None:
            self.one = self.node("model", "Constant", [], F, None, value_float=1.0)
        plus_one = self.node(scope, "Add", [self.to_float(scope, weight, None), self.one], F)
        scale = self.node(scope, "Reshape", [plus_one, self.const([C, H], F)], F)
        flat = self.node(scope, "Reshape", [self.node(scope, "Mul", [normalized, scale], F), original_shape], F,
                         [C * H])
        return self.to_T(scope, flat, [C * H])

    def linear(self, prefix: str, module: str, x: ir.Value, shape: tuple, role: str, index: int) -> ir.Value:
        w = self.weight(f"{prefix.replace('/', '.')}.{module}.weight_t", shape, role, index)
        return self.node(f"{prefix}/{module}", "MatMul", [x, w], None, [shape[1]])

    def block(self, prefix: str, s: ir.Value, index: int, combine: bool):
        cfg, C, H, R = self.cfg, self.cfg.C, self.cfg.H, self.cfg.R
        hn = self.norm(prefix, s, index)
        c = self.const(float(C), self.T)
        down = self.linear(prefix, "input_mix_weight_down", hn, (C * H, R), "down", index)
        d = self.node(prefix, "Swish", [self.node(prefix, "Div", [down, c], None, [R])], None, [R])
        g = self.node(prefix, "Sigmoid", [self.linear(prefix, "input_mix_weight_up", d, (R, C * H), "up", index)],
                      None, [C * H])
        grouped = self.const([0, 0, C, H], ir.DataType.INT64)
        weighted = self.node(prefix, "Mul", [self.node(prefix, "Reshape", [g, grouped], None, [C, H]),
                                             self.node(prefix, "Reshape", [hn, grouped], None, [C, H])], None, [C, H])
        axes = self.const([-2], ir.DataType.INT64)
        if cfg.premix_in == "float":
            mean = self.node(prefix, "ReduceMean", [self.to_float(prefix, weighted, [C, H]), axes],
                             ir.DataType.FLOAT, [H], keepdims=0)
            pre = self.to_T(prefix, mean, [H])
        else:
            pre = self.node(prefix, "ReduceMean", [weighted, axes], None, [H], keepdims=0)
        if not combine:
            return pre, None
        inject = self.linear(prefix, "block_inject_weight", hn, (C * H, C), "inject", index)
        gate = self.node(prefix, "Sigmoid", [self.node(prefix, "Div", [inject, c], None, [C])], None, [C])
        return pre, self.node(prefix, "Mul", [gate, self.const(2.0, self.T)], None, [C])

    def inject(self, s: ir.Value, out: ir.Value, gate: ir.Value) -> ir.Value:
        C, H = self.cfg.C, self.cfg.H
        o = self.node("model", "Unsqueeze", [out, self.const([-2], ir.DataType.INT64)], None, [1, H])
        w = self.node("model", "Unsqueeze", [gate, self.const([-1], ir.DataType.INT64)], None, [C, 1])
        flat = self.node("model", "Reshape", [self.node("model", "Mul", [o, w], None, [C, H]),
                                              self.const([0, 0, -1], ir.DataType.INT64)], None, [C * H])
        return self.node("model", "Add", [s, flat], None, [C * H])


def build_mobius_model(num_blocks: int, **options) -> ir.Model:
    """num_blocks hyper-connection blocks as mobius exports them (and the final mixer unless
    final_mix=False), as an onnx_ir.Model. options: C, H, R, dtype, epsilon, final_mix, ple_before,
    token_mask, premix_in ("float" or "T"), value_info (False: intermediate values without shapes), seed.
    Inputs `inputs_embeds` (batch_size, sequence_length, H), `token_mask` (bool) with token_mask,
    `ple_output.{k}` per ple_before block; output `hidden_states`."""
    cfg = MobiusConfig(num_blocks, **options)
    b = _Builder(cfg)
    C, H = cfg.C, cfg.H
    embeds = ir.Value(name="inputs_embeds", type=ir.TensorType(b.T), shape=ir.Shape([*TOKENS, H]))
    b.inputs.append(embeds)
    mask = None
    if cfg.token_mask:
        token_mask = ir.Value(name="token_mask", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape(list(TOKENS)))
        b.inputs.append(token_mask)
        mask = b.node("model", "Unsqueeze", [b.node("model", "Cast", [token_mask], None, [], to=b.T),
                                             b.const([-1], ir.DataType.INT64)], None, [1])
    s = b.node("model", "Concat", [embeds] * C, None, [C * H], axis=-1)
    for k in range(num_blocks):
        layer, location = divmod(k, 2)
        location = ("attn", "mlp")[location]
        if k in cfg.ple_before:
            ple = ir.Value(name=f"ple_output.{k}", type=ir.TensorType(b.T), shape=ir.Shape([*TOKENS, C * H]))
            b.inputs.append(ple)
            s = b.node(f"model/layers.{layer}", "Add", [s, ple], None, [C * H])
        prefix = f"model/layers.{layer}/{location}_hyper_connection"
        pre, gate = b.block(prefix, s, k, combine=True)
        if mask is not None and location == "attn":
            pre = b.node(f"model/layers.{layer}", "Mul", [pre, mask], None, [H])
        proj = "self_attn/o_proj" if location == "attn" else "mlp/down_proj"
        out = b.linear(f"model/layers.{layer}", proj, pre, (H, H), "sublayer", k)
        s = b.inject(s, out, gate)
    if cfg.final_mix:
        s, _ = b.block("model/hyper_connection_mixer", s, num_blocks, combine=False)
    s.name = "hidden_states"
    if s.shape is None:
        s.shape = ir.Shape([*TOKENS, H if cfg.final_mix else C * H])
    graph = ir.Graph(b.inputs, [s], nodes=b.nodes, initializers=list(b.initializers.values()),
                     opset_imports={"": OPSET}, name="main_graph")
    return ir.Model(graph, ir_version=IR_VERSION, producer_name="hcfuse.models")


def make_mobius_model(num_blocks: int, **options) -> onnx.ModelProto:
    """build_mobius_model as an onnx.ModelProto."""
    return ir.to_proto(build_mobius_model(num_blocks, **options))


__all__ = ["MobiusConfig", "build_mobius_model", "make_mobius_model"]
