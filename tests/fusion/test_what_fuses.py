"""What fuses: every variant of the stock block, the forms exporters write it in, and whole models
(96 blocks, shared weights, shuffled nodes, external data); the fused model matches the stock one in
onnxruntime (CPU, optimizations off)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest

from hcfuse import _op
from hcfuse.models.qwen_decode import make_decode_model, save_decode_model
from hcfuse.reference import hc_lowrank_mix
from hcfuse.rewrite import fuse_with_report
from tests._compare import assert_ulp_close, cpu_session, run_bound
from tests.fusion._chain import (
    BF16, CHAIN_OPS, C, H, R, assert_same_outputs, fused_nodes, initializer, node, ops, stock_chain,
)

# ---- the variants of the block -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@pytest.mark.parametrize("gate_div", [4.0, 1.0], ids=["div", "nodiv"])
@pytest.mark.parametrize("gate_mul", [2.0, 1.0], ids=["mul", "nomul"])
def test_variants_fuse_and_match_the_stock_chain(hcfuse_lib, dtype, packed, gate_div, gate_mul):
    # 3 blocks: block 0 without prologue, blocks 1-2 and the final mix (no inject half) with one
    original = make_decode_model(3, C=C, H=H, R=R, dtype=dtype, packed=packed, gate_div=gate_div,
                                 gate_mul=gate_mul, final_mix=True)
    fused = ir.from_proto(original)
    report = fuse_with_report(fused)
    assert len(report.fused) == 4 and report.rejected == []
    rules = report.counts_by_rule()
    assert rules.get(next(r for r in rules if "Prologue" not in r), 0) == 1
    assert sum(n for r, n in rules.items() if "NoInject" in r) == 1
    assert not CHAIN_OPS & set(ops(fused)), ops(fused)
    assert ops(fused)["MatMul"] == 3  # only the stand-in sublayers are left
    nodes = fused_nodes(fused)
    assert [len(n.inputs) for n in nodes] == [5, 7, 7, 7]
    assert [len(n.outputs) for n in nodes] == [2, 3, 3, 2]  # S of blocks 1-2 feeds the next prologue
    attrs = {k: v.value for k, v in nodes[0].attributes.items()}
    assert attrs["num_branches"] == C and attrs["gate_div"] == gate_div and attrs["gate_mul"] == gate_mul
    assert attrs["silu_alpha"] == 0.25 and attrs["reduction_scale"] == 0.25
    assert attrs["epsilon"] == pytest.approx(1e-6)
    assert fused.opset_imports[_op.DOMAIN] == 1
    assert_same_outputs(original, ir.to_proto(fused), hcfuse_lib)


@pytest.mark.parametrize("leading", [("batch", "seq"), ("rows",), ("num_tokens",), (2, 3)], ids=str)
def test_leading_dims_forms(hcfuse_lib, leading):
    original = make_decode_model(2, C=C, H=H, R=R, leading_dims=leading, final_mix=True)
    fused = ir.from_proto(original)
    assert len(fuse_with_report(fused).fused) == 3
    concrete = tuple(d if isinstance(d, int) else 3 for d in leading)
    assert_same_outputs(original, ir.to_proto(fused), hcfuse_lib, leading=concrete)


def test_zero_rows(hcfuse_lib):
    fused = stock_chain(2, leading_dims=("rows",))
    assert len(fuse_with_report(fused).fused) == 3
    feeds = {"inputs_embeds": np.zeros((0, H), np.float32)}
    assert cpu_session(ir.to_proto(fused), hcfuse_lib).run(None, feeds)[0].shape == (0, H)


# ---- forms of the block that fuse all the same: (blocks, build options, edit, fused, then) ----------


def _constant_first_in_mul(m: ir.Model) -> None:
    mul = node(m, "Mul", 1)
    gate, two = mul.inputs
    mul.replace_input_with(0, two)
    mul.replace_input_with(1, gate)


def _norm_scale_as(layout: str) -> Callable[[ir.Model], None]:
    def edit(m: ir.Model) -> None:
        norm = node(m, _op.BRANCH_NORM, 1)
        scale = norm.inputs[1]
        flat = scale.const_value.numpy()
        array = flat.reshape(C, H) if layout == "grouped" else flat[:H]
        norm.replace_input_with(1, initializer(m.graph, f"{scale.name}.{layout}", array))
    return edit


def _scaled_silu_scale_input(m: ir.Model) -> None:
    silu = node(m, _op.SCALED_SILU)
    scale = initializer(m.graph, "silu_scale", np.array(0.5, np.float32))
    silu.resize_inputs(2)
    silu.replace_input_with(1, scale)


@dataclasses.dataclass(frozen=True)
class Form:
    id: str
    blocks: int
    options: dict
    edit: Callable[[ir.Model], None] | None
    fused: int
    then: Callable[[ir.Model], bool]  # on the fused model


FORMS = [
    Form("mul-constant-first", 2, {}, _constant_first_in_mul, 3, lambda m: "Mul" not in ops(m)),
    Form("norm-scale-grouped", 2, {}, _norm_scale_as("grouped"), 3,
         lambda m: fused_nodes(m)[1].inputs[1].shape.dims == (C * H,)),
    Form("norm-scale-shared", 2, {}, _norm_scale_as("shared"), 3,
         lambda m: fused_nodes(m)[1].inputs[1].shape.dims == (C * H,)),
    Form("scaled-silu-constant-scale-input", 1, {}, _scaled_silu_scale_input, 2,
         lambda m: fused_nodes(m)[0].attributes["silu_alpha"].value == 0.5),
    Form("weights-as-graph-inputs", 2, {"packed": False, "weights_as_inputs": True}, None, 3, lambda m: True),
    Form("epsilon-absent", 1, {"epsilon": None}, None, 2,  # the norm's default epsilon
         lambda m: fused_nodes(m)[0].attributes["epsilon"].value == pytest.approx(_op.BRANCH_NORM_DEFAULT_EPSILON)),
]


@pytest.mark.parametrize("form", FORMS, ids=[f.id for f in FORMS])
def test_forms_of_the_block_fuse(hcfuse_lib, form):
    original = stock_chain(form.blocks, **form.options)
    if form.edit:
        form.edit(original)
    fused = original.clone()
    report = fuse_with_report(fused)
    assert len(report.fused) == form.fused and report.rejected == [], report.to_dict()
    assert form.then(fused)
    assert_same_outputs(ir.to_proto(original), ir.to_proto(fused), hcfuse_lib)


def test_bfloat16_chain_matches_the_reference(hcfuse_lib):
    """ORT's CPU has no bfloat16 MatMul: the fused model (identity sublayers) runs with our library and
    is compared with hcfuse.reference applied block by block to the original model's weights."""
    original = make_decode_model(3, C=C, H=H, R=R, dtype=ml_dtypes.bfloat16, sublayer="identity",
                                 final_mix=True, tile_embeddings=False, leading_dims=("rows",))
    fused = ir.from_proto(original)
    assert len(fuse_with_report(fused).fused) == 4
    x = np.random.default_rng(3).standard_normal((5, C * H)).astype(BF16)
    actual = run_bound(cpu_session(ir.to_proto(fused), hcfuse_lib), {"hyper_states": x})["hidden_states"]
    assert_ulp_close(actual, _reference_chain(ir.from_proto(original), x), max_ulps=2, what="hidden_states")


def _reference_chain(stock: ir.Model, streams: np.ndarray) -> np.ndarray:
    """hcfuse.reference over the blocks of a stock model (identity sublayers), in graph order."""
    attrs = dict(num_branches=C, epsilon=1e-6, reduction_scale=0.25, silu_alpha=0.25, gate_div=4.0, gate_mul=2.0)
    pre = gate = None
    norms = [n for n in stock.graph if n.op_type == _op.BRANCH_NORM]
    silus = [n for n in stock.graph if n.op_type == _op.SCALED_SILU]
    for norm, silu in zip(norms, silus, strict=True):
        scale = norm.inputs[1].const_value.numpy()
        first = next(user for user, _ in norm.outputs[0].uses() if user.op_type == "MatMul")
        down_inject = first.inputs[1].const_value.numpy()  # packed [C*H, R+C], or down alone in the final mix
        up = next(iter(silu.outputs[0].uses()))[0].inputs[1].const_value.numpy()
        down, inject = down_inject[:, :R], down_inject[:, R:]
        if inject.shape[1] == 0:  # the final mix
            inject = np.zeros((C * H, C), BF16)
        prologue = {} if pre is None else {"prev_block_output": pre, "prev_post_gate": gate}
        pre, gate, streams = hc_lowrank_mix(streams, scale, down, up, inject, **prologue, **attrs)
    return pre


# ---- whole models ------------------------------------------------------------------------------


def test_96_block_chain_gives_96_fused_nodes():
    fused = stock_chain(96, H=8, R=4, final_mix=False)
    report = fuse_with_report(fused)
    assert len(report.fused) == 96 and report.rejected == []
    assert not CHAIN_OPS - {_op.POST_MIX} & set(ops(fused))
    assert ops(fused)[_op.POST_MIX] == 1  # the last injection: no block follows it
    onnx.checker.check_model(ir.to_proto(fused))


def test_extra_add_before_a_block_keeps_its_postmix():
    fused = stock_chain(4, extra_add_before=(2,))
    report = fuse_with_report(fused)
    assert len(report.fused) == 5 and report.rejected == []
    assert ops(fused)[_op.POST_MIX] == 1 and ops(fused)["Add"] == 1
    assert sum(n for rule, n in report.counts_by_rule().items() if "Prologue" not in rule) == 2  # blocks 0 and 2


def test_report_says_which_blocks_absorbed_their_prologue():
    report = fuse_with_report(stock_chain(4, extra_add_before=(2,))).to_dict()
    prologues = [block["prologue"] for block in report["fused"]]
    assert prologues == [False, True, False, True, True]  # blocks 0 and 2 (after the extra Add) have none
    assert all(block["anchor"] and block["node"] for block in report["fused"])


def test_shared_weight_sets_split_once(hcfuse_lib):
    original = make_decode_model(6, C=C, H=H, R=R, num_weight_sets=2, final_mix=True)
    fused = ir.from_proto(original)
    assert len(fuse_with_report(fused).fused) == 7
    halves = [n for n in fused.graph.initializers if n.endswith((".down", ".inject"))]
    assert len(halves) == 4, halves
    assert_same_outputs(original, ir.to_proto(fused), hcfuse_lib)


def test_shuffled_node_order(hcfuse_lib):
    original = make_decode_model(4, C=C, H=H, R=R, final_mix=True)
    shuffled = onnx.ModelProto()
    shuffled.CopyFrom(original)
    nodes = list(shuffled.graph.node)
    random.Random(7).shuffle(nodes)
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(nodes)
    fused = ir.from_proto(shuffled)
    assert len(fuse_with_report(fused).fused) == 5
    proto = ir.to_proto(fused)
    onnx.checker.check_model(proto)  # topologically sorted again
    assert_same_outputs(original, proto, hcfuse_lib)


def test_external_data_round_trip(hcfuse_lib, tmp_path):
    path = tmp_path / "chain.onnx"
    save_decode_model(path, 3, external_data=True, C=C, H=H, R=R, final_mix=True)
    assert (tmp_path / "chain.onnx.data").stat().st_size > 0
    fused = ir.load(path)
    assert len(fuse_with_report(fused).fused) == 4
    external = [v.const_value for v in fused.graph.initializers.values() if isinstance(v.const_value, ir.ExternalTensor)]
    assert external and all(t.raw is None for t in external)  # fusing read no weight
    halves = [v.const_value for name, v in fused.graph.initializers.items() if name.endswith((".down", ".inject"))]
    assert len(halves) == 6 and all(isinstance(t, ir.LazyTensor) for t in halves)  # read when saved
    out = tmp_path / "fused.onnx"
    ir.save(fused, out, external_data="fused.onnx.data")
    onnx.checker.check_model(str(out))
    assert_same_outputs(onnx.load(str(path)), onnx.load(str(out)), hcfuse_lib)
