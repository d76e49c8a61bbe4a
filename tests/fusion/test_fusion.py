"""The fusion pass: every variant of the stock block is fused (count, no chain op left, numerics in
onnxruntime CPU with optimizations off), every condition leaves its candidate unfused with its reason,
and whole models (96 blocks, shuffled nodes, external data) come out right."""

from __future__ import annotations

import collections
import random

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

C, H, R = 4, 16, 8
BF16 = np.dtype(ml_dtypes.bfloat16)
CHAIN_OPS = {*_op.CHAIN_CONTRIB_OPS, "Sigmoid", "Div", "Mul", "Split"}
# Largest |fused - stock| over max(1, |stock|) through a short chain: fp32 is accumulation order only;
# fp16 differs where the contract rounds once (post_gate) and the stock chain three times.
TOLERANCE = {np.dtype(np.float32): 2e-5, np.dtype(np.float16): 8e-3}


def _model(num_blocks: int = 3, **options) -> ir.Model:
    options = {"C": C, "H": H, "R": R, "final_mix": True, **options}
    return ir.from_proto(make_decode_model(num_blocks, **options))


def _ops(model: ir.Model) -> collections.Counter:
    return collections.Counter(node.op_type for node in model.graph)


def _node(model: ir.Model, op_type: str, index: int = 0) -> ir.Node:
    return [n for n in model.graph if n.op_type == op_type][index]


def _fused_nodes(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == _op.OP_TYPE and n.domain == _op.DOMAIN]


def _feeds(proto: onnx.ModelProto, leading: tuple, rng) -> dict[str, np.ndarray]:
    """Random values for every graph input (activations of unit scale, weights scaled like the builder's)."""
    feeds = {}
    for value in ir.from_proto(proto).graph.inputs:
        dims = [d if isinstance(d, int) else None for d in value.shape.dims]
        shape = (*leading, dims[-1]) if value.name in ("inputs_embeds", "hyper_states") else tuple(dims)
        scale = 1.0 if len(shape) != 2 else shape[0] ** -0.5
        array = rng.standard_normal(shape).astype(np.float32) * scale
        if value.name.endswith("hc_norm.weight"):
            array += 1.0
        feeds[value.name] = array.astype(value.dtype.numpy())
    return feeds


def _assert_same_outputs(original: onnx.ModelProto, fused: onnx.ModelProto, library: str, leading=(2, 3), seed=0):
    feeds = _feeds(original, leading, np.random.default_rng(seed))
    expected = cpu_session(original, None).run(None, feeds)[0]
    actual = cpu_session(fused, library).run(None, feeds)[0]
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    gap = np.abs(actual.astype(np.float32) - expected.astype(np.float32)).max(initial=0.0)
    bound = TOLERANCE[expected.dtype] * max(1.0, float(np.abs(expected.astype(np.float32)).max(initial=0.0)))
    assert gap <= bound, f"fused differs from the stock chain by {gap} (bound {bound}), shape {expected.shape}"


def _reasons(report) -> dict[str, str]:
    return {item.anchor: item.reason for item in report.rejected}


# ---- positive variants -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@pytest.mark.parametrize("gate_div", [4.0, 1.0], ids=["div", "nodiv"])
@pytest.mark.parametrize("gate_mul", [2.0, 1.0], ids=["mul", "nomul"])
def test_variants_fuse_and_match_the_stock_chain(hcfuse_lib, dtype, packed, gate_div, gate_mul):
    # 3 blocks: block 0 without prologue, blocks 1-2 and the final mix (no inject half) with one
    original = make_decode_model(3, C=C, H=H, R=R, dtype=dtype, packed=packed, gate_div=gate_div,
                                 gate_mul=gate_mul, final_mix=True)
    model = ir.from_proto(original)
    report = fuse_with_report(model)
    assert len(report.fused) == 4 and report.rejected == []
    rules = report.counts_by_rule()
    assert rules.get(next(r for r in rules if "Prologue" not in r), 0) == 1
    assert sum(n for r, n in rules.items() if "NoInject" in r) == 1
    assert not CHAIN_OPS & set(_ops(model)), _ops(model)
    assert _ops(model)["MatMul"] == 3  # only the stand-in sublayers are left
    fused = _fused_nodes(model)
    assert [len(n.inputs) for n in fused] == [5, 7, 7, 7]
    assert [len(n.outputs) for n in fused] == [2, 3, 3, 2]  # S of blocks 1-2 feeds the next prologue
    attrs = {k: v.value for k, v in fused[0].attributes.items()}
    assert attrs["num_branches"] == C and attrs["gate_div"] == gate_div and attrs["gate_mul"] == gate_mul
    assert attrs["silu_alpha"] == 0.25 and attrs["reduction_scale"] == 0.25
    assert attrs["epsilon"] == pytest.approx(1e-6)
    assert model.opset_imports[_op.DOMAIN] == 1
    _assert_same_outputs(original, ir.to_proto(model), hcfuse_lib)


def test_mul_with_the_constant_first(hcfuse_lib):
    original = make_decode_model(2, C=C, H=H, R=R, final_mix=True)
    model = ir.from_proto(original)
    mul = _node(model, "Mul", 1)
    gate, two = mul.inputs
    mul.replace_input_with(0, two)
    mul.replace_input_with(1, gate)
    changed = ir.to_proto(model)
    report = fuse_with_report(model)
    assert len(report.fused) == 3 and "Mul" not in _ops(model)
    _assert_same_outputs(changed, ir.to_proto(model), hcfuse_lib)


@pytest.mark.parametrize("leading", [("batch", "seq"), ("rows",), ("num_tokens",), (2, 3)], ids=str)
def test_leading_dims_forms(hcfuse_lib, leading):
    original = make_decode_model(2, C=C, H=H, R=R, leading_dims=leading, final_mix=True)
    model = ir.from_proto(original)
    assert len(fuse_with_report(model).fused) == 3
    concrete = tuple(d if isinstance(d, int) else 3 for d in leading)
    _assert_same_outputs(original, ir.to_proto(model), hcfuse_lib, leading=concrete)


def test_zero_rows(hcfuse_lib):
    original = make_decode_model(2, C=C, H=H, R=R, leading_dims=("rows",), final_mix=True)
    model = ir.from_proto(original)
    assert len(fuse_with_report(model).fused) == 3
    feeds = {"inputs_embeds": np.zeros((0, H), np.float32)}
    assert cpu_session(ir.to_proto(model), hcfuse_lib).run(None, feeds)[0].shape == (0, H)


@pytest.mark.parametrize("constants", ["node", "initializer"])
@pytest.mark.parametrize("shape", [(), (1,)], ids=["0d", "1d"])
def test_gate_constants_as_nodes_or_initializers(hcfuse_lib, constants, shape):
    original = make_decode_model(2, C=C, H=H, R=R, constants=constants, constant_shape=shape, final_mix=True)
    model = ir.from_proto(original)
    assert len(fuse_with_report(model).fused) == 3
    for node in _fused_nodes(model)[:2]:
        assert node.attributes["gate_div"].value == 4.0 and node.attributes["gate_mul"].value == 2.0
    # the shared constants and the packed weights are gone with the nodes that read them
    assert _ops(model)["Constant"] == 1  # the Tile repeats
    names = set(model.graph.initializers)
    assert not any(n.startswith("/model/constants/FLOAT/") or n.endswith("block_inject.MatMul.weight") for n in names)
    _assert_same_outputs(original, ir.to_proto(model), hcfuse_lib)


def test_weights_as_graph_inputs(hcfuse_lib):
    original = make_decode_model(2, C=C, H=H, R=R, packed=False, weights_as_inputs=True, final_mix=True)
    model = ir.from_proto(original)
    assert len(fuse_with_report(model).fused) == 3
    _assert_same_outputs(original, ir.to_proto(model), hcfuse_lib)


def test_packed_weight_as_graph_input_is_left_with_a_reason():
    model = _model(2, packed=True, weights_as_inputs=True)
    report = fuse_with_report(model)
    assert len(report.fused) == 1  # only the final mix, whose down weight is a separate MatMul
    reasons = _reasons(report)
    assert len(reasons) == 2 and all("not an initializer: it cannot be split" in r for r in reasons.values())


def test_epsilon_absent_takes_the_norms_default():
    model = _model(1, epsilon=None)
    fuse_with_report(model)
    assert _fused_nodes(model)[0].attributes["epsilon"].value == pytest.approx(_op.BRANCH_NORM_DEFAULT_EPSILON)


@pytest.mark.parametrize("layout", ["grouped", "shared"])
def test_norm_scale_of_other_accepted_shapes_is_flattened(hcfuse_lib, layout):
    original = make_decode_model(2, C=C, H=H, R=R, final_mix=True)
    model = ir.from_proto(original)
    norm = _node(model, _op.BRANCH_NORM, 1)
    scale = norm.inputs[1]
    flat = scale.const_value.numpy()
    array = flat.reshape(C, H) if layout == "grouped" else flat[:H]
    new = ir.Value(name=f"{scale.name}.{layout}", shape=ir.Shape(array.shape), type=scale.type,
                   const_value=ir.tensor(array))
    model.graph.register_initializer(new)
    norm.replace_input_with(1, new)
    changed = ir.to_proto(model)
    report = fuse_with_report(model)
    assert len(report.fused) == 3 and report.rejected == []
    assert _fused_nodes(model)[1].inputs[1].shape.dims == (C * H,)
    _assert_same_outputs(changed, ir.to_proto(model), hcfuse_lib)


def test_scaled_silu_constant_scale_input_replaces_alpha(hcfuse_lib):
    model = _model(1)
    silu = _node(model, _op.SCALED_SILU)
    scale = ir.Value(name="silu_scale", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.FLOAT),
                     const_value=ir.tensor(np.array(0.5, np.float32)))
    model.graph.register_initializer(scale)
    silu.resize_inputs(2)
    silu.replace_input_with(1, scale)
    changed = ir.to_proto(model)
    assert len(fuse_with_report(model).fused) == 2
    assert _fused_nodes(model)[0].attributes["silu_alpha"].value == 0.5
    _assert_same_outputs(changed, ir.to_proto(model), hcfuse_lib)


def test_bfloat16_chain_matches_the_reference(hcfuse_lib):
    """ORT's CPU has no bfloat16 MatMul: the fused model (identity sublayers) runs with our library and
    is compared with hcfuse.reference applied block by block to the original model's weights."""
    original = make_decode_model(3, C=C, H=H, R=R, dtype=ml_dtypes.bfloat16, sublayer="identity",
                                 final_mix=True, tile_embeddings=False, leading_dims=("rows",))
    model = ir.from_proto(original)
    assert len(fuse_with_report(model).fused) == 4
    x = np.random.default_rng(3).standard_normal((5, C * H)).astype(BF16)
    actual = run_bound(cpu_session(ir.to_proto(model), hcfuse_lib), {"hyper_states": x})["hidden_states"]
    assert_ulp_close(actual, _reference_chain(ir.from_proto(original), x), max_ulps=2, what="hidden_states")


def _reference_chain(model: ir.Model, streams: np.ndarray) -> np.ndarray:
    """hcfuse.reference over the blocks of a stock model (identity sublayers), in graph order."""
    attrs = dict(num_branches=C, epsilon=1e-6, reduction_scale=0.25, silu_alpha=0.25, gate_div=4.0, gate_mul=2.0)
    pre = gate = None
    norms = [n for n in model.graph if n.op_type == _op.BRANCH_NORM]
    silus = [n for n in model.graph if n.op_type == _op.SCALED_SILU]
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


# ---- conditions: each leaves its candidate unfused (or fused without prologue) with its reason ----


def _set_attr(node: ir.Node, name: str, value) -> None:
    node.attributes[name] = ir.convenience.convert_attribute(name, value)


def _graph_input(model: ir.Model, name: str, dtype: ir.DataType, dims) -> ir.Value:
    value = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(dims))
    model.graph.inputs.append(value)
    return value


def _expect(model: ir.Model, *, fused: int, anchor_index: int, reason: str, prefix: str = ""):
    anchor = _node(model, _op.BRANCH_NORM, anchor_index).name
    report = fuse_with_report(model)
    assert len(report.fused) == fused, report.to_dict()
    reasons = _reasons(report)
    assert anchor in reasons, report.to_dict()
    assert reason in reasons[anchor], reasons[anchor]
    assert reasons[anchor].startswith(prefix) and ("not fused: " in reasons[anchor]) == bool(prefix)
    assert len(reasons) == 1, reasons
    return report


def test_extra_consumer_of_hn():
    model = _model()
    hn = _node(model, _op.BRANCH_NORM, 1).outputs[0]
    model.graph.append(ir.node("Identity", [hn], name="spy"))
    _expect(model, fused=3, anchor_index=1, reason="is also consumed by Identity 'spy'")


def test_intermediate_as_graph_output():
    model = _model()
    model.graph.outputs.append(_node(model, "Sigmoid", 2).outputs[0])  # block 1's up Sigmoid (g)
    _expect(model, fused=3, anchor_index=1, reason="is a graph output")


def test_unnamed_nodes_get_one_report_entry_each():
    """Exporters may leave nodes unnamed: each candidate still has its own anchor and reason."""
    model = _model()
    for node in model.graph:
        node.name = ""
    model.graph.outputs.append(_node(model, "Sigmoid", 2).outputs[0])  # block 1's up Sigmoid (g)
    report = fuse_with_report(model)
    assert len(report.fused) == 3 and len({block.anchor for block in report.fused}) == 3
    assert len({block.node for block in report.fused}) == 3
    [rejected] = report.rejected
    assert "is a graph output" in rejected.reason
    assert rejected.anchor == _node(model, _op.BRANCH_NORM, 0).name and rejected.anchor
    assert rejected.anchor not in {block.anchor for block in report.fused}


def test_mismatched_num_branches_premix():
    model = _model()
    _set_attr(_node(model, _op.PRE_MIX, 1), "num_branches", 2)
    _expect(model, fused=3, anchor_index=1, reason="num_branches differs: BranchwiseRMSNorm 4, HyperConnectionPreMix 2")


def test_norm_without_num_branches():
    model = _model()
    del _node(model, _op.BRANCH_NORM, 2).attributes["num_branches"]
    _expect(model, fused=3, anchor_index=2, reason="has no num_branches")


def test_postmix_branch_count_fuses_without_prologue():
    model = _model()
    _set_attr(_node(model, _op.POST_MIX, 0), "num_branches", 2)  # the prologue of block 1
    _expect(model, fused=4, anchor_index=1, reason="HyperConnectionPostMix 2", prefix="prologue not fused: ")
    assert _ops(model)[_op.POST_MIX] == 1 and len(_fused_nodes(model)[0].inputs) == 5


def test_postmix_with_stream_mix_fuses_without_prologue():
    model = _model()
    post = _node(model, _op.POST_MIX, 1)
    post.resize_inputs(4)
    post.replace_input_with(3, _graph_input(model, "stream_mix", ir.DataType.FLOAT, ["batch", "seq", C, C]))
    _expect(model, fused=4, anchor_index=2, reason="has a stream_mix input", prefix="prologue not fused: ")
    assert _ops(model)[_op.POST_MIX] == 1


def test_postmix_with_per_feature_post_mix_fuses_without_prologue():
    model = _model()
    post = _node(model, _op.POST_MIX, 0)
    post.replace_input_with(2, _graph_input(model, "post_mix", ir.DataType.FLOAT, ["batch", "seq", C, H]))
    _expect(model, fused=4, anchor_index=1, reason=f"must be (..., {C})", prefix="prologue not fused: ")


@pytest.mark.parametrize("which, reason", [("prev_block_output", f"must be (..., {H})"), ("post_mix", f"must be (..., {C})")])
def test_postmix_scalar_inputs_fuse_without_prologue(which, reason):
    """A rank-0 shape on a prologue input is refused with a reason (it was an IndexError in check)."""
    model = _model()
    post = _node(model, _op.POST_MIX, 0)
    post.replace_input_with(1 if which == "prev_block_output" else 2, _graph_input(model, which, ir.DataType.FLOAT, []))
    _expect(model, fused=4, anchor_index=1, reason=reason, prefix="prologue not fused: ")


def test_wrong_inject_weight_shape():
    model = _model(packed=False)
    inject = _node(model, "MatMul", 1)  # block 0: down, inject, up
    assert "block_inject" in inject.name
    weight = ir.Value(name="bad_inject", shape=ir.Shape([C * H, C + 1]), type=ir.TensorType(ir.DataType.FLOAT),
                      const_value=ir.tensor(np.zeros((C * H, C + 1), np.float32)))
    model.graph.register_initializer(weight)
    inject.replace_input_with(1, weight)
    _expect(model, fused=3, anchor_index=0, reason=f"must be ({C * H}, {C}); got ({C * H}, {C + 1})")


def test_wrong_up_weight_shape():
    model = _model()
    up = _node(model, "MatMul", 1)
    assert "input_mix_weight_up" in up.name
    weight = ir.Value(name="bad_up", shape=ir.Shape([R, C * H - 1]), type=ir.TensorType(ir.DataType.FLOAT),
                      const_value=ir.tensor(np.zeros((R, C * H - 1), np.float32)))
    model.graph.register_initializer(weight)
    up.replace_input_with(1, weight)
    _expect(model, fused=3, anchor_index=0, reason="up_weight 'bad_up' must be")


def test_non_constant_gate_div():
    model = _model()
    _node(model, "Div", 1).replace_input_with(1, _graph_input(model, "divisor", ir.DataType.FLOAT, []))
    _expect(model, fused=3, anchor_index=1, reason="gate_div (graph input 'divisor') must be a constant scalar")


def test_gate_mul_of_two_values():
    model = _model(constants="initializer")
    two = ir.Value(name="two_muls", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT),
                   const_value=ir.tensor(np.array([2.0, 2.0], np.float32)))
    model.graph.register_initializer(two)
    _node(model, "Mul", 0).replace_input_with(1, two)
    # the block is fused without its Mul, which stays and scales post_gate
    _expect(model, fused=4, anchor_index=0, reason="gate_mul (initializer 'two_muls') must be a constant scalar",
            prefix="gate Mul not fused: ")
    assert _ops(model)["Mul"] == 1


def test_non_constant_scaled_silu_scale():
    model = _model()
    silu = _node(model, _op.SCALED_SILU, 1)
    silu.resize_inputs(2)
    silu.replace_input_with(1, _graph_input(model, "silu_scale", ir.DataType.FLOAT, []))
    _expect(model, fused=3, anchor_index=1, reason="has a non-constant scale input")


def test_norm_scale_of_another_type():
    model = _model(dtype=np.float16)
    norm = _node(model, _op.BRANCH_NORM, 0)
    scale = ir.Value(name="scale32", shape=ir.Shape([C * H]), type=ir.TensorType(ir.DataType.FLOAT),
                     const_value=ir.tensor(np.ones(C * H, np.float32)))
    model.graph.register_initializer(scale)
    norm.replace_input_with(1, scale)
    _expect(model, fused=3, anchor_index=0, reason="inputs must share one element type T")


def test_non_constant_norm_scale_of_width_h():
    model = _model()
    norm = _node(model, _op.BRANCH_NORM, 1)
    norm.replace_input_with(1, _graph_input(model, "scale_h", ir.DataType.FLOAT, [H]))
    _expect(model, fused=3, anchor_index=1, reason=f"must be ({C * H},), or a constant")


def test_split_on_another_axis():
    model = _model()
    _set_attr(_node(model, "Split", 1), "axis", 0)
    _expect(model, fused=3, anchor_index=1, reason="Split must cut the last axis")


def test_matmulnbits_up_projection_is_left_with_a_reason():
    model = _model()
    up = _node(model, "MatMul", 4)  # block 1: packed, up
    assert "input_mix_weight_up" in up.name
    quantized = ir.node("MatMulNBits", list(up.inputs), {"K": R, "N": C * H, "bits": 4, "block_size": 32},
                        domain=_op.DOMAIN, name=up.name + "NBits")
    up.outputs[0].replace_all_uses_with(quantized.outputs[0])
    model.graph.insert_after(up, quantized)
    model.graph.remove(up, safe=True)
    _expect(model, fused=3, anchor_index=1, reason="expected MatMul, got MatMulNBits")


# ---- whole models ------------------------------------------------------------------------------


def test_96_block_chain_gives_96_fused_nodes():
    model = _model(96, H=8, R=4, final_mix=False)
    report = fuse_with_report(model)
    assert len(report.fused) == 96 and report.rejected == []
    assert not CHAIN_OPS - {_op.POST_MIX} & set(_ops(model))
    assert _ops(model)[_op.POST_MIX] == 1  # the last injection: no block follows it
    onnx.checker.check_model(ir.to_proto(model))


def test_extra_add_before_a_block_keeps_its_postmix():
    model = _model(4, extra_add_before=(2,))
    report = fuse_with_report(model)
    assert len(report.fused) == 5 and report.rejected == []
    assert _ops(model)[_op.POST_MIX] == 1 and _ops(model)["Add"] == 1
    assert sum(n for rule, n in report.counts_by_rule().items() if "Prologue" not in rule) == 2  # blocks 0 and 2


def test_shared_weight_sets_split_once(hcfuse_lib):
    original = make_decode_model(6, C=C, H=H, R=R, num_weight_sets=2, final_mix=True)
    model = ir.from_proto(original)
    assert len(fuse_with_report(model).fused) == 7
    halves = [n for n in model.graph.initializers if n.endswith((".down", ".inject"))]
    assert len(halves) == 4, halves
    _assert_same_outputs(original, ir.to_proto(model), hcfuse_lib)


def test_shuffled_node_order(hcfuse_lib):
    original = make_decode_model(4, C=C, H=H, R=R, final_mix=True)
    shuffled = onnx.ModelProto()
    shuffled.CopyFrom(original)
    nodes = list(shuffled.graph.node)
    random.Random(7).shuffle(nodes)
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(nodes)
    model = ir.from_proto(shuffled)
    assert len(fuse_with_report(model).fused) == 5
    fused = ir.to_proto(model)
    onnx.checker.check_model(fused)  # topologically sorted again
    _assert_same_outputs(original, fused, hcfuse_lib)


def test_external_data_round_trip(hcfuse_lib, tmp_path):
    path = tmp_path / "chain.onnx"
    save_decode_model(path, 3, external_data=True, C=C, H=H, R=R, final_mix=True)
    assert (tmp_path / "chain.onnx.data").stat().st_size > 0
    model = ir.load(path)
    assert len(fuse_with_report(model).fused) == 4
    external = [v.const_value for v in model.graph.initializers.values() if isinstance(v.const_value, ir.ExternalTensor)]
    assert external and all(t.raw is None for t in external)  # fusing read no weight
    halves = [v.const_value for name, v in model.graph.initializers.items() if name.endswith((".down", ".inject"))]
    assert len(halves) == 6 and all(isinstance(t, ir.LazyTensor) for t in halves)  # read when saved
    out = tmp_path / "fused.onnx"
    ir.save(model, out, external_data="fused.onnx.data")
    onnx.checker.check_model(str(out))
    _assert_same_outputs(onnx.load(str(path)), onnx.load(str(out)), hcfuse_lib)


def test_report_says_which_blocks_absorbed_their_prologue():
    model = _model(4, extra_add_before=(2,))
    report = fuse_with_report(model).to_dict()
    prologues = [block["prologue"] for block in report["fused"]]
    assert prologues == [False, True, False, True, True]  # blocks 0 and 2 (after the extra Add) have none
    assert all(block["anchor"] and block["node"] for block in report["fused"])


def test_a_block_fused_without_prologue_and_gate_mul_names_both_reasons():
    model = _model()
    _node(model, "Mul", 1).replace_input_with(1, _graph_input(model, "scale_by", ir.DataType.FLOAT, []))
    post = _node(model, _op.POST_MIX, 0)  # the prologue of block 1
    post.resize_inputs(4)
    post.replace_input_with(3, _graph_input(model, "stream_mix", ir.DataType.FLOAT, ["batch", "seq", C, C]))
    report = _expect(model, fused=4, anchor_index=1, reason="has a stream_mix input", prefix="prologue not fused: ")
    [rejected] = report.rejected
    assert rejected.reason.endswith("; gate Mul not fused: gate_mul (graph input 'scale_by') must be a constant "
                                    "scalar of shape [] or [1]"), rejected.reason
    assert _ops(model)["Mul"] == 1 and _ops(model)[_op.POST_MIX] == 1
