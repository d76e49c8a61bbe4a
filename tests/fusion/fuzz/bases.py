"""Valid chains the fuzz mutates: 1-4 blocks at tiny sizes, float or float16 (bfloat16: see run.py), and
the locator of each block's nodes and values.

Forms (random_form): the stock contrib-op chain of models/qwen_decode.py's builder (separate or packed
MatMul + Split, with and without a prologue in front of block 0), the same blocks as onnxruntime-genai's
standard-ONNX expansion (models/genai_expansion.py), or as onnxruntime's mobius exporter writes them
(models/mobius_block.py: opset 24, the float32 norm, a PLE Add, a token mask), or the contrib-op chain
quantized as onnxruntime-genai's int4 builds are (models/quantized.py: MatMulNBits projections, some left
dense, some of a block quantized otherwise than the rest). The block mutations act on the contrib-op form
(the nbits ones on the quantized form's MatMulNBits); the whole-model ones (shapes stripped, functions, If, names, a second chain, the node
order) on every form."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from hcfuse import _op
from hcfuse.models.genai_expansion import BATCH_SEQUENCE, PAGED, build_expansion_model
from hcfuse.models.mobius_block import OPSET as MOBIUS_OPSET
from hcfuse.models.mobius_block import TOKENS as MOBIUS_TOKENS
from hcfuse.models.mobius_block import build_mobius_model
from hcfuse.models.qwen_decode import make_decode_model

DTYPES = (np.float32, np.float16)
CONTRIB, GENAI_EXPANSION, MOBIUS, QUANTIZED = "contrib", "genai_expansion", "mobius", "quantized"
FORMS = {CONTRIB: 0.78, QUANTIZED: 0.12, GENAI_EXPANSION: 0.05, MOBIUS: 0.05}  # form -> share of the mutants
PROJECTION = "_hyper_connection/"  # in the name of every projection MatMul of a block (models/quantized.py)
MOBIUS_OPTIONS = ("epsilon", "final_mix", "premix_in", "ple_before", "token_mask")


@dataclasses.dataclass(frozen=True)
class Base:
    """The options of one base chain (all that is needed to rebuild it) and its concrete feed dims."""

    num_blocks: int
    C: int
    H: int
    R: int
    dtype: type
    packed: bool
    leading_dims: tuple  # as declared: ints or symbols
    lead: tuple  # the concrete leading dims fed at run time
    options: dict  # the remaining make_decode_model options
    prologue_first: bool  # block 0 gets a prologue reading graph inputs
    opset: int = 21  # of the default domain (Split takes its sizes as an input from 13 on)
    form: str = CONTRIB
    quant: tuple = ()  # the quantized form's quantize_model passes: (options, seed of the projections it takes)

    def describe(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return (f"{self.form} {self.num_blocks} blocks C={self.C} H={self.H} R={self.R} {np.dtype(self.dtype).name} "
                f"{'packed' if self.packed else 'separate'} lead={self.leading_dims}->{self.lead} "
                f"{'prologue-first ' if self.prologue_first else ''}opset {self.opset} {opts}"
                + "".join(f"; quantized {','.join(f'{k}={v}' for k, v in o.items())}" for o, _ in self.quant))


def random_base(rng: np.random.Generator) -> Base:
    """A random valid chain: every shape, form and option the builder offers, at tiny sizes."""
    C = int(rng.choice([4, 4, 4, 2]))
    H = int(rng.choice([8, 16, 16, 32, C]))  # H == C makes (..., C) and (..., H) shapes collide
    R = int(rng.choice([4, 8, C]))
    forms = [("rows",), ("batch", "seq"), (2,), (1, 3), ("num_tokens",)]
    leading = forms[int(rng.integers(len(forms)))]
    lead = tuple(d if isinstance(d, int) else int(rng.integers(1, 4)) for d in leading)
    num_blocks = int(rng.integers(1, 5))
    options = {
        "gate_div": float(rng.choice([4.0, 4.0, 1.0])),
        "gate_mul": float(rng.choice([2.0, 2.0, 1.0])),
        "epsilon": None if rng.random() < 0.2 else float(rng.choice([1e-6, 1e-5, 1e-2])),
        "reduction_scale": float(rng.choice([0.25, 1.0])),
        "silu_alpha": float(rng.choice([0.25, 1.0, 1.5])),
        "constants": str(rng.choice(["node", "initializer"])),
        "constant_shape": ((), (1,))[int(rng.integers(2))],
        "sublayer": str(rng.choice(["matmul", "identity"])),
        "final_mix": bool(rng.random() < 0.3),
        "tile_embeddings": bool(rng.random() < 0.7),
        "weights_as_inputs": bool(rng.random() < 0.1),
    }
    if num_blocks > 2 and rng.random() < 0.3:
        options["num_weight_sets"] = 1  # every block reads the same weights
    if num_blocks > 1 and rng.random() < 0.15:
        options["extra_add_before"] = (int(rng.integers(1, num_blocks)),)
    dtype, packed, prologue_first = DTYPES[int(rng.integers(len(DTYPES)))], bool(rng.random() < 0.6), bool(rng.random() < 0.3)
    if rng.random() < 0.08 and any(isinstance(d, str) for d in leading):
        first = next(i for i, d in enumerate(leading) if isinstance(d, str))
        lead = tuple(0 if i == first else d for i, d in enumerate(lead))  # zero rows
    opset = int(rng.choice([21, 21, 21, 18, 17, 13]))
    return Base(num_blocks, C, H, R, dtype, packed, leading, lead, options, prologue_first, opset)


_EXPANSION_OPTIONS = ("epsilon", "sublayer", "final_mix", "num_weight_sets", "constants")


def random_form(base: Base, rng: np.random.Generator) -> Base:
    """base in a form drawn by FORMS (from its own generator: the contrib bases stay as they were). The
    expansion keeps base's sizes, type and options it has (its constants are the builder's for C)."""
    form = str(rng.choice(list(FORMS), p=list(FORMS.values())))
    if form == CONTRIB:
        return base
    if form == QUANTIZED:
        # a second pass: not over shared weights (the quantizer names B after the weight, so the passes' collide)
        second = rng.random() < 0.25 and "num_weight_sets" not in base.options
        passes = (_quantizer_options(rng), *([_quantizer_options(rng)] if second else ()))
        options = {**base.options, "weights_as_inputs": False}  # the quantizer takes initializer weights only
        return dataclasses.replace(base, options=options, form=form,
                                   quant=tuple((o, int(rng.integers(2**31))) for o in passes))
    if form == MOBIUS:
        lead = tuple(int(rng.integers(1, 4)) for _ in MOBIUS_TOKENS)
        options = {"epsilon": base.options.get("epsilon") or 1e-6, "final_mix": True,
                   "premix_in": str(rng.choice(["float", "T"])),
                   "ple_before": tuple(k for k in range(1, base.num_blocks) if rng.random() < 0.3),
                   "token_mask": bool(rng.random() < 0.5)}
        return dataclasses.replace(base, packed=False, leading_dims=MOBIUS_TOKENS, lead=lead, options=options,
                                   prologue_first=False, opset=MOBIUS_OPSET, form=form)
    paged = bool(rng.random() < 0.5)
    leading = PAGED if paged else BATCH_SEQUENCE
    lead = tuple(int(rng.integers(1, 4)) for _ in leading)
    options = {k: v for k, v in base.options.items() if k in _EXPANSION_OPTIONS}
    C = base.C
    # the builder's constants for C; with the final mix, as it writes it (every post-mix then has a next block)
    options.update(gate_div=float(C), gate_mul=2.0, silu_alpha=1.0 / C, reduction_scale=1.0 / C, final_mix=True)
    return dataclasses.replace(base, packed=True, leading_dims=leading, lead=lead, options=options,
                               prologue_first=False, opset=max(base.opset, 18), form=form)


def _quantizer_options(rng: np.random.Generator) -> dict:
    """quantize_model's options: onnxruntime's CPU MatMulNBits takes zero points of T with 4 bits only."""
    bits, symmetric = int(rng.choice([4, 8])), bool(rng.random() < 0.5)
    return {"bits": bits, "block_size": int(rng.choice([16, 32, 64])), "symmetric": symmetric,
            "zp_form": "T" if not symmetric and bits == 4 and rng.random() < 0.4 else None,
            "accuracy_level": int(rng.choice([0, 4]))}


def _quantize(model: ir.Model, base: Base) -> ir.Model:
    """base's quantize_model passes over model: each takes the projections its seed draws among those still
    MatMul (the first pass leaves about one in six dense, a second pass quantizes about half of what the first
    took otherwise); the sublayer's MatMul goes with the first pass."""
    from hcfuse.models.quantized import quantize_model

    names = sorted(n.name for n in model.graph if n.op_type == "MatMul" and PROJECTION in n.name)
    proto = ir.to_proto(model)
    dense = set(names)
    for k, (options, seed) in enumerate(base.quant):
        rng = np.random.default_rng(seed)
        share = 5 / 6 if k == 0 else 1.0
        taken = {n for n in names if rng.random() < share} & dense
        if k == 0 and len(base.quant) > 1:
            taken = {n for n in taken if rng.random() < 0.5}  # the second pass's share, quantized otherwise
        proto = quantize_model(proto, exclude=sorted(set(names) - taken), **options)
        dense -= taken
    return ir.from_proto(proto)


def quantized_unfusable(model) -> int:
    """Blocks of a quantized base (an onnx model) that the pass leaves unfused by docs/QUANTIZED.md: separate
    down and inject with only one of them quantized, or quantized projections disagreeing on bits, block_size
    or accuracy_level."""
    by_block: dict[str, list] = {}
    for node in model.graph.node:
        if PROJECTION in node.name and node.op_type in ("MatMul", "MatMulNBits"):
            by_block.setdefault(node.name.split(PROJECTION)[0], []).append(node)
    unfusable = 0
    for nodes in by_block.values():
        nbits = [n for n in nodes if n.op_type == "MatMulNBits"]
        attrs = {tuple(next((a.i for a in n.attribute if a.name == name), default)
                       for name, default in (("bits", 4), ("block_size", 0), ("accuracy_level", 0))) for n in nbits}
        halves = [n.op_type for n in nodes if "input_mix_weight_down/" in n.name or "block_inject_weight/" in n.name]
        unfusable += len(attrs) > 1 or len(set(halves)) > 1
    return unfusable


def build(base: Base) -> ir.Model:
    if base.form == MOBIUS:
        options = {k: v for k, v in base.options.items() if k in MOBIUS_OPTIONS}
        return build_mobius_model(base.num_blocks, C=base.C, H=base.H, R=base.R, dtype=base.dtype, **options)
    if base.form == GENAI_EXPANSION:
        fixed = ("gate_div", "gate_mul", "silu_alpha", "reduction_scale")  # the builder's, from C
        options = {k: v for k, v in base.options.items() if k not in fixed}
        model = build_expansion_model(base.num_blocks, C=base.C, H=base.H, R=base.R, dtype=base.dtype,
                                      paged=base.leading_dims == PAGED, **options)
        model.opset_imports[""] = model.graph.opset_imports[""] = base.opset
        return model
    proto = make_decode_model(base.num_blocks, C=base.C, H=base.H, R=base.R, dtype=base.dtype, packed=base.packed,
                              leading_dims=base.leading_dims, **base.options)
    model = ir.from_proto(proto)
    model.opset_imports[""] = base.opset
    if base.prologue_first:
        _add_leading_prologue(model, base)
    return _quantize(model, base) if base.quant else model


def _add_leading_prologue(model: ir.Model, base: Base) -> None:
    """HyperConnectionPostMix(streams, prev_block_output, prev_post_gate) in front of block 0, both
    extra inputs graph inputs (a chain cut out of a longer model)."""
    norm = next(n for n in model.graph if n.op_type == _op.BRANCH_NORM)
    T = ir.TensorType(ir.DataType.from_numpy(np.dtype(base.dtype)))
    lead = list(base.leading_dims)
    prev_out = ir.Value(name="prev_block_output", type=T, shape=ir.Shape([*lead, base.H]))
    prev_gate = ir.Value(name="prev_post_gate", type=T, shape=ir.Shape([*lead, base.C]))
    model.graph.inputs.extend([prev_out, prev_gate])
    streams = norm.inputs[0]
    s = ir.Value(name="fuzz/prologue0/output_0", type=T, shape=streams.shape)
    post = ir.node(_op.POST_MIX, [streams, prev_out, prev_gate], {"num_branches": base.C}, domain=_op.DOMAIN,
                   outputs=[s], name="/model/fuzz_prologue0/injection")
    model.graph.insert_before(norm, post)
    for user, index in list(streams.uses()):
        if user is not post:
            user.replace_input_with(index, s)


_PROJECTIONS = ("MatMul", "MatMulNBits")  # a projection of the chain, dense or quantized


def _users(value: ir.Value | None, op_type: str | tuple) -> list[ir.Node]:
    if value is None:
        return []
    types = (op_type,) if isinstance(op_type, str) else op_type
    return [user for user, _ in value.uses() if user.op_type in types]


def _first(nodes: list):
    return nodes[0] if nodes else None


def _out(node: ir.Node | None, index: int = 0) -> ir.Value | None:
    return None if node is None or len(node.outputs) <= index else node.outputs[index]


def _in(node: ir.Node | None, index: int) -> ir.Value | None:
    return None if node is None or len(node.inputs) <= index else node.inputs[index]


def blocks(model: ir.Model) -> list[dict]:
    """Per BranchwiseRMSNorm (graph order), the block's nodes and values by role, best effort: a role a
    mutation already broke is None (or missing). A quantized projection is its MatMulNBits (weight: its B)."""
    found = []
    for norm in model.graph:
        if norm.op_type != _op.BRANCH_NORM:
            continue
        b = {"norm": norm, "hn": _out(norm), "streams": _in(norm, 0), "scale": _in(norm, 1)}
        producer = b["streams"].producer() if b["streams"] is not None else None
        b["post"] = producer if producer is not None and producer.op_type == _op.POST_MIX else None
        matmuls = _users(b["hn"], _PROJECTIONS)
        split = None
        for mm in matmuls:
            split = split or _first(_users(_out(mm), "Split"))
        if split is not None:
            b.update(packed_mm=split.inputs[0].producer(), split=split, packed_w=_in(split.inputs[0].producer(), 1),
                     sizes=_in(split, 1), down=_out(split, 0), inject=_out(split, 1))
        else:
            silu_mm = [mm for mm in matmuls if _users(_out(mm), _op.SCALED_SILU)]
            other = [mm for mm in matmuls if mm not in silu_mm]
            b.update(down_mm=_first(silu_mm), inject_mm=_first(other))
            b.update(down=_out(b["down_mm"]), inject=_out(b["inject_mm"]),
                     down_w=_in(b["down_mm"], 1), inject_w=_in(b["inject_mm"], 1))
        b["silu"] = _first(_users(b["down"], _op.SCALED_SILU))
        b["d"] = _out(b["silu"])
        b["up_mm"] = _first(_users(b["d"], _PROJECTIONS))
        b["up_w"], b["up"] = _in(b["up_mm"], 1), _out(b["up_mm"])
        b["up_sig"] = _first(_users(b["up"], "Sigmoid"))
        b["g"] = _out(b["up_sig"])
        b["premix"] = _first(_users(b["hn"], _op.PRE_MIX))
        b["pre"] = _out(b["premix"])
        b["div"] = _first(_users(b["inject"], "Div"))
        b["gate_div"] = _in(b["div"], 1)
        b["gate_sig"] = _first(_users(_out(b["div"]) if b["div"] else b["inject"], "Sigmoid"))
        b["mul"] = _first(_users(_out(b["gate_sig"]), "Mul"))
        b["gate_mul"] = _in(b["mul"], 1) if b["mul"] is not None else None
        b["gate"] = _out(b["mul"]) if b["mul"] is not None else _out(b["gate_sig"])
        found.append(b)
    return found
