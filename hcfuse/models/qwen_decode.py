"""Qwen3.8-Flash-Next-shaped decode graphs holding the stock, unfused hyper-connection chain.

The default (packed) form reproduces what ONNX Runtime GenAI's model builder writes for this model
family (microsoft/onnxruntime-genai, `src/python/py/models/builders/qwen.py`, Qwen4Exp text model):

- node names `/model/layers.{i}/{attn|mlp}_hyper_connection/{hc_norm, input_mix_down_block_inject/MatMul,
  input_mix_down_block_inject/Split, input_mix_weight_down/SiLU, input_mix_weight_up/MatMul, ...}`,
  initializers named after their node (`model.layers.0.attn_hyper_connection.hc_norm.weight`), MatMul
  weights stored [in, out];
- one packed MatMul of hn with a [C*H, R+C] weight (down and inject side by side), then
  Split(axis=-1) by a `/model/constants/INT64/[R, C]` constant;
- shared scalar constants as Constant nodes whose output is named `/model/constants/{DTYPE}/{value}`
  (DTYPE is onnx_ir's DataType name, e.g. BFLOAT16) made by `/model/constant_nodes/...`;
- the injection PostMix of block k takes block k's norm input as its streams and feeds block k+1's
  norm (so block k+1 has a prologue), and `/model/hyper_connection/Tile` turns the embeddings into C
  streams for block 0;
- optionally the final mix (`final_hyper_connection`) without the inject half.

Between blocks a stand-in sublayer (an H x H MatMul, or an Identity) turns pre_output into the block
output, as attention / MoE do in the real model. Weights are onnx_ir lazy tensors filled from a seeded
generator on demand, so a full-size 96-block model can be saved with external data without holding all
weights in memory (`save_decode_model`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from hcfuse import _op
from hcfuse.reference import SUPPORTED_DTYPES

_Q = _op.QWEN_CONFIG  # the defaults below: Qwen3.8-Flash-Next's block


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Everything that shapes a decode graph (see make_decode_model for the meaning of each field)."""

    num_blocks: int
    C: int = _Q["num_branches"]
    H: int = _Q["hidden"]
    R: int = _Q["rank"]
    dtype: type = np.float32
    packed: bool = True
    leading_dims: tuple = ("batch", "seq")
    sublayer: str = "matmul"
    gate_div: float = _Q["gate_div"]
    gate_mul: float = _Q["gate_mul"]
    epsilon: float | None = _Q["epsilon"]
    reduction_scale: float = _Q["reduction_scale"]
    silu_alpha: float = _Q["silu_alpha"]
    num_weight_sets: int | None = None
    seed: int = 0
    final_mix: bool = False
    constants: str = "node"
    constant_shape: tuple = ()
    weights_as_inputs: bool = False
    extra_add_before: tuple = ()
    tile_embeddings: bool = True

    def __post_init__(self):
        if self.num_blocks < 1:
            raise ValueError(f"make_decode_model: num_blocks must be >= 1; got {self.num_blocks}")
        if np.dtype(self.dtype) not in SUPPORTED_DTYPES:
            raise ValueError(f"make_decode_model: dtype must be float32, float16 or bfloat16; got {self.dtype}")
        if self.sublayer not in ("matmul", "identity"):
            raise ValueError(f"make_decode_model: sublayer must be 'matmul' or 'identity'; got {self.sublayer!r}")
        if self.constants not in ("node", "initializer"):
            raise ValueError(f"make_decode_model: constants must be 'node' or 'initializer'; got {self.constants!r}")
        if tuple(self.constant_shape) not in ((), (1,)):
            raise ValueError(f"make_decode_model: constant_shape must be () or (1,); got {self.constant_shape}")

    @property
    def ir_dtype(self) -> ir.DataType:
        return ir.DataType.from_numpy(np.dtype(self.dtype))


def _const_literal(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _weight_scale(role: str, cfg: DecodeConfig) -> tuple[float, float]:
    """(mean, std) of a weight's random values: unit-scale activations through the chain."""
    CH = cfg.C * cfg.H
    return {
        "norm": (1.0, 0.1),
        "down": (0.0, CH**-0.5),
        "up": (0.0, 2.0 * cfg.R**-0.5),
        "inject": (0.0, 2.0 * CH**-0.5),
        "packed": (0.0, CH**-0.5),
        "sublayer": (0.0, cfg.H**-0.5),
    }[role]


class _GraphBuilder:
    """Appends nodes in the builder's naming scheme; weights are lazy and seeded by their index."""

    def __init__(self, cfg: DecodeConfig):
        self.cfg = cfg
        self.T = cfg.ir_dtype
        self.nodes: list[ir.Node] = []
        self.initializers: list[ir.Value] = []
        self.weight_inputs: list[ir.Value] = []
        self.constants: dict[str, ir.Value] = {}
        self.weight_sets: dict[tuple, ir.Value] = {}

    def value(self, name: str, dtype: ir.DataType, last: Sequence) -> ir.Value:
        dims = (*self.cfg.leading_dims, *last)
        return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(dims))

    def node(self, op_type, name, inputs, last_dim, *, domain="", **attributes) -> ir.Value:
        out = self.value(f"{name}/output_0", self.T, [last_dim])
        self.nodes.append(ir.node(op_type, inputs, attributes, domain=domain, outputs=[out], name=name))
        return out

    def constant(self, dtype: ir.DataType, value, shape: tuple = ()) -> ir.Value:
        """A shared constant named like the exporter's `/model/constants/{DTYPE}/{value}`."""
        literal = str(list(value)) if isinstance(value, (list, tuple)) else _const_literal(value)
        name = f"/model/constants/{dtype.name}/{literal}"
        if name in self.constants:
            return self.constants[name]
        array = np.array(value, dtype=dtype.numpy()).reshape(shape if not isinstance(value, (list, tuple)) else -1)
        tensor = ir.tensor(array, dtype=dtype, name=name)
        out = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(array.shape))
        if self.cfg.constants == "node" or isinstance(value, (list, tuple)):
            node_name = name.replace("constants", "constant_nodes")
            self.nodes.append(ir.node("Constant", [], {"value": tensor}, outputs=[out], name=node_name))
        else:
            out.const_value = tensor
            self.initializers.append(out)
        self.constants[name] = out
        return out

    def scalar(self, value: float) -> ir.Value:
        return self.constant(self.T, value, tuple(self.cfg.constant_shape))

    def weight(self, name: str, role: str, shape: tuple, index: int) -> ir.Value:
        """A weight shared by the blocks of one weight set; values come from (seed, set index, role)."""
        cfg = self.cfg
        key = (index % cfg.num_weight_sets if cfg.num_weight_sets else index, role)
        if key in self.weight_sets:
            return self.weight_sets[key]
        mean, std = _weight_scale(role, cfg)
        seed = (cfg.seed, *key[:1], sum(map(ord, role)))
        np_dtype = np.dtype(cfg.dtype)

        def make() -> ir.Tensor:
            rng = np.random.default_rng(seed)
            data = rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)
            return ir.tensor(data.astype(np_dtype), name=name)

        val = ir.Value(name=name, type=ir.TensorType(self.T), shape=ir.Shape(shape))
        if cfg.weights_as_inputs:
            self.weight_inputs.append(val)
        else:
            val.const_value = ir.LazyTensor(make, dtype=self.T, shape=ir.Shape(shape), name=name)
            self.initializers.append(val)
        self.weight_sets[key] = val
        return val

    def matmul(self, name: str, x: ir.Value, role: str, shape: tuple, index: int) -> ir.Value:
        w = self.weight(name[1:].replace("/", ".") + ".weight", role, shape, index)
        return self.node("MatMul", name, [x, w], shape[1])

    def block(self, index: int, streams: ir.Value, *, basename: str, combine: bool = True):
        """One hyper-connection mix (10 stock nodes, fewer without Div/Mul). Returns (pre, gate or None)."""
        cfg, C, H, R = self.cfg, self.cfg.C, self.cfg.H, self.cfg.R
        CH = C * H
        norm_name = f"{basename}/hc_norm"
        scale = self.weight(norm_name[1:].replace("/", ".") + ".weight", "norm", (CH,), index)
        norm_attrs = {"num_branches": C} if cfg.epsilon is None else {"epsilon": cfg.epsilon, "num_branches": C}
        hn = self.node(_op.BRANCH_NORM, norm_name, [streams, scale], CH, domain=_op.DOMAIN, **norm_attrs)
        down_name = f"{basename}/input_mix_weight_down/MatMul"
        inject_name = f"{basename}/block_inject_weight/MatMul"
        inject = None
        if combine and cfg.packed:
            packed = self.matmul(f"{basename}/input_mix_down_block_inject/MatMul", hn, "packed", (CH, R + C), index)
            down = self.value(f"{down_name}/output_0", self.T, [R])
            inject = self.value(f"{inject_name}/output_0", self.T, [C])
            sizes = self.constant(ir.DataType.INT64, [R, C])
            split_name = f"{basename}/input_mix_down_block_inject/Split"
            self.nodes.append(
                ir.node("Split", [packed, sizes], {"axis": -1}, outputs=[down, inject], name=split_name)
            )
        else:
            down = self.matmul(down_name, hn, "down", (CH, R), index)
            if combine:
                inject = self.matmul(inject_name, hn, "inject", (CH, C), index)
        silu = self.node(
            _op.SCALED_SILU, f"{basename}/input_mix_weight_down/SiLU", [down], R, domain=_op.DOMAIN, alpha=cfg.silu_alpha
        )
        up = self.matmul(f"{basename}/input_mix_weight_up/MatMul", silu, "up", (R, CH), index)
        g = self.node("Sigmoid", f"{basename}/input_mix_weight_up/Sigmoid", [up], CH)
        pre = self.node(
            _op.PRE_MIX, f"{basename}/mixed/Mean", [hn, g], H, domain=_op.DOMAIN,
            num_branches=C, reduction_scale=cfg.reduction_scale,
        )
        if not combine:
            return pre, None
        x = inject
        if cfg.gate_div != 1:
            x = self.node("Div", f"{basename}/block_inject_weight/Div", [x, self.scalar(cfg.gate_div)], C)
        x = self.node("Sigmoid", f"{basename}/block_inject_weight/Sigmoid", [x], C)
        if cfg.gate_mul != 1:
            x = self.node("Mul", f"{basename}/block_inject_weight/Mul", [x, self.scalar(cfg.gate_mul)], C)
        return pre, x

    def sublayer(self, index: int, layer: int, location: str, pre: ir.Value) -> ir.Value:
        proj = "attn/o_proj" if location == "attn" else "mlp/down_proj"
        name = f"/model/layers.{layer}/{proj}/MatMul"
        if self.cfg.sublayer == "identity":
            return self.node("Identity", name.replace("MatMul", "Identity"), [pre], self.cfg.H)
        return self.matmul(name, pre, "sublayer", (self.cfg.H, self.cfg.H), index)


def build_decode_model(num_blocks: int, **options) -> ir.Model:
    """Same as make_decode_model, as an onnx_ir.Model whose weights are lazy (nothing generated yet)."""
    cfg = DecodeConfig(num_blocks, **options)
    b = _GraphBuilder(cfg)
    C, H = cfg.C, cfg.H
    if cfg.tile_embeddings:
        embeds = b.value("inputs_embeds", b.T, [H])
        repeats = b.constant(ir.DataType.INT64, [1] * len(cfg.leading_dims) + [C])
        streams = b.node("Tile", "/model/hyper_connection/Tile", [embeds, repeats], C * H)
    else:
        embeds = streams = b.value("hyper_states", b.T, [C * H])
    for k in range(num_blocks):
        layer, location = divmod(k, 2)
        location = ("attn", "mlp")[location]
        basename = f"/model/layers.{layer}/{location}_hyper_connection"
        if k in cfg.extra_add_before:
            # An extra residual Add in front of the norm (the builder's per-layer-embedding layers):
            # this block then has no prologue and the previous PostMix stays.
            extra = b.weight(f"model.layers.{layer}.ple.residual", "norm", (C * H,), k)
            streams = b.node("Add", f"/model/layers.{layer}/ple/residual/Add", [streams, extra], C * H)
        pre, gate = b.block(k, streams, basename=basename)
        block_output = b.sublayer(k, layer, location, pre)
        streams = b.node(
            _op.POST_MIX, f"{basename}/injection", [streams, block_output, gate], C * H,
            domain=_op.DOMAIN, num_branches=C,
        )
    if cfg.final_mix:
        layer = (num_blocks + 1) // 2
        streams, _ = b.block(num_blocks, streams, basename=f"/model/layers.{layer}/final_hyper_connection", combine=False)
    out = streams
    out.name = "hidden_states"
    graph = ir.Graph(
        [embeds, *b.weight_inputs], [out], nodes=b.nodes, initializers=b.initializers,
        opset_imports={"": _op.ONNX_OPSET, _op.DOMAIN: 1}, name="qwen_decode_hyper_connections",
    )
    return ir.Model(graph, ir_version=_op.IR_VERSION, producer_name="hcfuse.models")


def make_decode_model(
    num_blocks: int,
    *,
    C: int = _Q["num_branches"],
    H: int = _Q["hidden"],
    R: int = _Q["rank"],
    dtype=np.float32,
    packed: bool = True,
    leading_dims: Sequence = ("batch", "seq"),
    sublayer: str = "matmul",
    gate_div: float = _Q["gate_div"],
    gate_mul: float = _Q["gate_mul"],
    epsilon: float | None = _Q["epsilon"],
    reduction_scale: float = _Q["reduction_scale"],
    silu_alpha: float = _Q["silu_alpha"],
    num_weight_sets: int | None = None,
    seed: int = 0,
    final_mix: bool = False,
    constants: str = "node",
    constant_shape: tuple = (),
    weights_as_inputs: bool = False,
    extra_add_before: Sequence[int] = (),
    tile_embeddings: bool = True,
) -> onnx.ModelProto:
    """A decode graph with `num_blocks` stock hyper-connection blocks (ir_version 10, opset 21 + com.microsoft 1).

    Input `inputs_embeds` (*leading_dims, H) is tiled into C streams (as the exporter does); output `hidden_states` is the
    streams after the last injection (or the final mix's output with final_mix=True).

    packed: the exporter's packed [C*H, R+C] down/inject MatMul + Split (else separate MatMuls).
    leading_dims: ("batch", "seq"), ("rows",), concrete ints, ... (symbols or ints).
    sublayer: "matmul" (an H x H MatMul stand-in) or "identity" between blocks.
    gate_div / gate_mul: the Div / Mul constants (1 leaves the node out).
    epsilon: BranchwiseRMSNorm's epsilon (None leaves the attribute out: the op's default 1e-5).
    num_weight_sets: blocks cycle through this many weight sets (benchmarks); None: one per block.
    final_mix: append the final mix without the inject half (the builder's `final_hyper_connection`).
    constants: "node" (Constant nodes, as the exporter) or "initializer"; constant_shape () or (1,).
    weights_as_inputs: the weights become graph inputs instead of initializers.
    extra_add_before: block indices whose norm input goes through an extra Add (no prologue there).
    tile_embeddings: False makes the C streams the graph input `hyper_states` (*leading_dims, C*H)
        instead of tiling `inputs_embeds` (ORT's CPU Tile has no bfloat16 kernel).
    """
    model = build_decode_model(
        num_blocks, C=C, H=H, R=R, dtype=dtype, packed=packed, leading_dims=tuple(leading_dims),
        sublayer=sublayer, gate_div=gate_div, gate_mul=gate_mul, epsilon=epsilon,
        reduction_scale=reduction_scale, silu_alpha=silu_alpha, num_weight_sets=num_weight_sets,
        seed=seed, final_mix=final_mix, constants=constants, constant_shape=tuple(constant_shape),
        weights_as_inputs=weights_as_inputs, extra_add_before=tuple(extra_add_before),
        tile_embeddings=tile_embeddings,
    )
    return ir.to_proto(model)


def save_decode_model(path: str | os.PathLike, num_blocks: int, *, external_data: bool = True, **options) -> None:
    """Builds and saves a decode model; with external_data the weights go to `<name>.data` next to it,
    generated one tensor at a time while writing (a full-size 96-block bf16 model is ~2.5 GB)."""
    model = build_decode_model(num_blocks, **options)
    path = os.fspath(path)
    if external_data:
        ir.save(model, path, external_data=os.path.basename(path) + ".data")
    else:
        ir.save(model, path)
