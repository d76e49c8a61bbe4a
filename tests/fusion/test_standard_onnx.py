"""ORT GenAI's standard-ONNX expansion of the hyper-connection block fuses into the same node.

Test models come from hcfuse/models/genai_expansion.py, which writes what microsoft/onnxruntime-genai's
builder writes with its expansions (`builders/expansions/qwen3_8.py`): its node and initializer
names, `/model/constants/...` Constant nodes, value shapes, and both token forms (batch_size,
sequence_length with reshapes by 0, 0; paged num_tokens with reshapes by -1).

Numerics: the expansion rounds where the fused op does not (SimplifiedLayerNormalization, then the Mul
by weight+1; each pre-mix product before ReduceMean; the post-mix product before the Add). Measured
with hcfuse.checking.verification (ORT CPU, random inputs, 3 seeds, 4 rows per symbolic dim), expansion model
vs fused model, at the full Qwen size (C=4, H=2560, R=320) with 8 blocks + the final mix: float32
14.5-23 ulp, float16 2-3 ulp, both token forms; 96 blocks at H=512, R=64: float32 38-46 ulp, float16
8-10 ulp. verify's bounds are 512 (float32) and 32 (float16) ulp, so the block is fused.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import _op
from hcfuse.rewrite import fuse_with_report
from hcfuse.checking.verification import DEFAULT_MAX_ULP, verify
from hcfuse.models.genai_expansion import build_expansion_model, make_expansion_model
from tests._compare import cpu_session

C, H, R = 4, 16, 8
EXPANSION_OPS = {"Reshape", "SimplifiedLayerNormalization", "Unsqueeze", "ReduceMean", "Div", "Sigmoid", "Mul",
                 "Add", "Split", *_op.CHAIN_CONTRIB_OPS}
CONTRIB = set(_op.CHAIN_CONTRIB_OPS)
# Largest gap (ulp, hcfuse.checking.verification's measure) seen at the test sizes below, with margin.
SMALL_BOUND = {np.float32: 64.0, np.float16: 4.0}


def _model(num_blocks: int = 3, **options) -> ir.Model:
    return build_expansion_model(num_blocks, **{"C": C, "H": H, "R": R, "final_mix": True, **options})


def _ops(model: ir.Model) -> collections.Counter:
    return collections.Counter(node.op_type for node in model.graph)


def _node(model: ir.Model, name: str) -> ir.Node:
    return next(n for n in model.graph if n.name == name)


def _fuse(model: ir.Model):
    original = ir.to_proto(model)
    report = fuse_with_report(model)
    return original, report


def _gap(original, model: ir.Model, dtype=np.float32, seed=0) -> float:
    result = verify(original, ir.to_proto(model), providers=["CPUExecutionProvider"], seed=seed, rows=3)
    assert result.status == "passed", result.summary()
    return result.outputs[0].max_ulp


def _reasons(report) -> dict[str, str]:
    return {item.anchor: item.reason for item in report.rejected}


# ---- the builder's output ----------------------------------------------------------------------


@pytest.mark.parametrize("paged", [False, True], ids=["batch_sequence", "paged"])
def test_models_are_shaped_like_the_builders_output(paged):
    model = _model(1, paged=paged, final_mix=False, dtype=np.float16)
    b = "/model/layers.0/attn_hyper_connection"
    lead = "[-1, " if paged else "[0, 0, "
    grouped, flat = f"/model/constants/INT64/{lead}{C}, {H}]", f"/model/constants/INT64/{lead}{C * H}]"
    t, w = "/model/hyper_connection/Tile/output_0", "model.layers.0.attn_hyper_connection"
    sc, mm = f"{b}/hc_norm", "MatMul"
    silu, up, mean, inj, inject = (f"{b}/input_mix_weight_down/SiLU", f"{b}/input_mix_weight_up", f"{b}/mixed/Mean",
                                   f"{b}/injection", f"{b}/block_inject_weight")
    f16 = "/model/constants/FLOAT16"
    expected = [  # (node, op, inputs) in the builder's order, block 0 of the attention layer
        ("/model/hyper_connection/Tile", "Tile", None),
        (f"{sc}/Reshape", "Reshape", [t, grouped]),
        (f"{sc}/SimplifiedLayerNormalization", "SimplifiedLayerNormalization",
         [f"{sc}/Reshape/output_0", f"{w}.hc_norm.norm_scale"]),
        (f"{sc}/Flatten", "Reshape", [f"{sc}/SimplifiedLayerNormalization/output_0", flat]),
        (f"{sc}/Scale", "Mul", [f"{sc}/Flatten/output_0", f"{w}.hc_norm.weight"]),
        (f"{b}/input_mix_down_block_inject/MatMul", mm, [f"{sc}/Scale/output_0",
                                                         f"{w}.input_mix_down_block_inject.MatMul.weight"]),
        (f"{b}/input_mix_down_block_inject/Split", "Split", None),
        (f"{silu}/Div", "Div", [f"{b}/input_mix_weight_down/MatMul/output_0", f"{f16}/4"]),
        (f"{silu}/Sigmoid", "Sigmoid", [f"{silu}/Div/output_0"]),
        (silu, "Mul", [f"{silu}/Div/output_0", f"{silu}/Sigmoid/output_0"]),
        (f"{up}/MatMul", mm, [f"{silu}/output_0", f"{w}.input_mix_weight_up.MatMul.weight"]),
        (f"{up}/Sigmoid", "Sigmoid", None),
        (f"{mean}/streams/Reshape", "Reshape", [f"{sc}/Scale/output_0", grouped]),
        (f"{mean}/pre_mix/Reshape", "Reshape", [f"{up}/Sigmoid/output_0", grouped]),
        (f"{mean}/Mul", "Mul", None),
        (mean, "ReduceMean", [f"{mean}/Mul/output_0", "/model/constants/INT64/[-2]"]),
        (f"{inject}/Div", "Div", [f"{inject}/MatMul/output_0", f"{f16}/4"]),
        (f"{inject}/Sigmoid", "Sigmoid", None),
        (f"{inject}/Mul", "Mul", [f"{inject}/Sigmoid/output_0", f"{f16}/2"]),
        ("/model/layers.0/attn/o_proj/MatMul", mm, None),
        (f"{inj}/output/Unsqueeze", "Unsqueeze", ["/model/layers.0/attn/o_proj/MatMul/output_0",
                                                 "/model/constants/INT64/[-2]"]),
        (f"{inj}/weight/Unsqueeze", "Unsqueeze", [f"{inject}/Mul/output_0", "/model/constants/INT64/[-1]"]),
        (f"{inj}/Mul", "Mul", None),
        (f"{inj}/Reshape", "Reshape", [f"{inj}/Mul/output_0", flat]),
        (inj, "Add", [t, f"{inj}/Reshape/output_0"]),
    ]
    nodes = [n for n in model.graph if n.op_type != "Constant"]
    assert [(n.name, n.op_type) for n in nodes] == [(name, op) for name, op, _ in expected]
    for node, (_, _, inputs) in zip(nodes, expected):
        if inputs is not None:
            assert [v.name for v in node.inputs] == inputs, node.name
    constants = {n.outputs[0].name: n for n in model.graph if n.op_type == "Constant"}
    assert all(n.name == name.replace("constants", "constant_nodes") for name, n in constants.items())
    sln = _node(model, f"{b}/hc_norm/SimplifiedLayerNormalization")
    expected_attributes = {"axis": -1, "epsilon": pytest.approx(1e-6), "stash_type": 1}
    assert {k: a.value for k, a in sln.attributes.items()} == expected_attributes
    assert _node(model, f"{b}/mixed/Mean").attributes["keepdims"].value == 0
    tokens = ["num_tokens"] if paged else ["batch_size", "sequence_length"]
    assert [str(d) for d in sln.outputs[0].shape] == [*tokens, str(C), str(H)]
    assert np.all(model.graph.initializers[f"{w}.hc_norm.norm_scale"].const_value.numpy() == 1)


# ---- fusion and numerics ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("paged", [False, True], ids=["batch_sequence", "paged"])
def test_expansion_fuses_into_one_node_per_block(hcfuse_lib, dtype, paged):
    model = _model(3, dtype=dtype, paged=paged)
    original, report = _fuse(model)
    assert len(report.fused) == 4 and report.rejected == [], report.to_dict()
    assert not EXPANSION_OPS & set(_ops(model)), _ops(model)
    assert _ops(model) == {_op.OP_TYPE: 4, "MatMul": 3, "Tile": 1, "Constant": 1}  # the sublayers stay
    fused = [n for n in model.graph if n.op_type == _op.OP_TYPE]
    names = [f"/model/layers.0/{loc}_hyper_connection/{_op.OP_TYPE}" for loc in ("attn", "mlp")]
    assert [n.name for n in fused[:2]] == names
    assert [len(n.inputs) for n in fused] == [5, 7, 7, 7]  # every prologue (the post-mix expansion) absorbed
    attrs = {k: v.value for k, v in fused[0].attributes.items()}
    assert attrs == {"num_branches": C, "epsilon": pytest.approx(1e-6), "reduction_scale": 0.25,
                     "silu_alpha": 0.25, "gate_div": 4.0, "gate_mul": 2.0}
    assert fused[0].inputs[1].name == "model.layers.0.attn_hyper_connection.hc_norm.weight"  # weight + 1, in place
    b0, b1 = "/model/layers.0/attn_hyper_connection", "/model/layers.0/mlp_hyper_connection"
    assert {f"{b1}/hc_norm", f"{b1}/input_mix_weight_down/SiLU", f"{b1}/mixed/Mean", f"{b0}/injection"} <= set(
        report.fused[1].replaced)  # the contrib nodes the expansions became, named after them
    assert not any(name.endswith("norm_scale") for name in model.graph.initializers)  # the ones are gone
    assert _gap(original, model, dtype) <= SMALL_BOUND[dtype]


@pytest.mark.parametrize("branches", [3, 4])
def test_other_branch_counts(hcfuse_lib, branches):
    """C=3: Div by 3 and a mean over 3 are not exact reciprocals (alpha = 1/3, reduction_scale = 1/3)."""
    model = build_expansion_model(3, C=branches, H=H, R=R, final_mix=True, dtype=np.float16)
    original, report = _fuse(model)
    assert len(report.fused) == 4 and not EXPANSION_OPS & set(_ops(model))
    assert _gap(original, model, np.float16) <= SMALL_BOUND[np.float16]


def test_deep_chain(hcfuse_lib):
    """24 blocks fuse to 24 nodes plus the final mix, all 23 prologues absorbed. Measured at 96 blocks
    + the final mix, H=512, R=64 (ORT CPU, 3 seeds, both token forms): float32 38-46 ulp, float16 8-10
    ulp: the residual streams carry the extra roundings from block to block, slowly."""
    model = _model(24, dtype=np.float16, H=32, R=8, num_weight_sets=3)  # blocks share weights (and norm weights)
    original, report = _fuse(model)
    assert len(report.fused) == 25 and report.rejected == []
    assert sum(len(n.inputs) == 7 for n in model.graph if n.op_type == _op.OP_TYPE) == 24
    assert _gap(original, model, np.float16) <= SMALL_BOUND[np.float16]


def test_reduce_mean_with_axes_attribute():
    """Before opset 18 ReduceMean takes its axes as an attribute."""
    model = _model(2)
    model.opset_imports[""] = model.graph.opset_imports[""] = 17
    for node in [n for n in model.graph if n.op_type == "ReduceMean"]:
        node.resize_inputs(1)
        node.attributes["axes"] = ir.AttrInt64s("axes", [-2])
    original, report = _fuse(model)
    assert len(report.fused) == 3 and not EXPANSION_OPS & set(_ops(model))
    _gap(original, model)


def test_last_injection_without_a_next_block_stays():
    """The last block's post-mix feeds no further block: no fused node can absorb it, so it stays."""
    model = _model(2, final_mix=False)
    original, report = _fuse(model)
    assert len(report.fused) == 2 and not CONTRIB & set(_ops(model))
    assert _ops(model)["Unsqueeze"] == 2 and _ops(model)["Add"] == 1
    [(anchor, reason)] = _reasons(report).items()
    assert anchor == "/model/layers.0/mlp_hyper_connection/injection" and "no block's norm reads its output" in reason
    _gap(original, model)


def test_bfloat16_fuses():
    """ORT's CPU runs no bfloat16 MatMul: this checks the rewrite only (numerics need a GPU)."""
    import ml_dtypes

    model = _model(3, dtype=ml_dtypes.bfloat16)
    report = fuse_with_report(model)
    assert len(report.fused) == 4 and not EXPANSION_OPS & set(_ops(model))


def test_unnamed_nodes_fuse():
    model = _model(3)
    for node in model.graph:
        node.name = ""
    assert len(fuse_with_report(model).fused) == 4 and not EXPANSION_OPS & set(_ops(model))


# ---- what does not fuse stays exactly as it was, with a reason --------------------------------

B1 = "/model/layers.0/mlp_hyper_connection"  # block 1 of the 3-block model


def _signature(model: ir.Model, prefix: str) -> list[tuple]:
    """The nodes under prefix but its injection (block 2's prologue): name, op, input names, attributes."""
    return [(n.name, n.op_type, [v.name if v else "" for v in n.inputs], sorted(n.attributes))
            for n in model.graph if n.name.startswith(prefix) and not n.name.startswith(f"{B1}/injection")]


def _expect_block_left(model: ir.Model, *, group: str, reason: str, fused: int = 3, feeds=None):
    """Fuses model; block 1 stays in its standard form (unchanged) with reason on group; numerics hold."""
    before = _signature(model, B1) + _signature(model, "/model/layers.0/attn_hyper_connection/injection")
    original, report = _fuse(model)
    assert len(report.fused) == fused, report.to_dict()
    assert not CONTRIB & set(_ops(model)), "a rewritten expansion was left outside a fused node"
    assert _signature(model, B1) + _signature(model, "/model/layers.0/attn_hyper_connection/injection") == before
    reasons = _reasons(report)
    assert reason in reasons.get(group, ""), report.to_dict()
    assert "its block did not fuse" in reasons[f"{B1}/input_mix_weight_down/SiLU"] or group.endswith("SiLU")
    if feeds is None:
        _gap(original, model)
    return original, report


def _initializer(model: ir.Model, name: str, array: np.ndarray, as_input: bool = False) -> ir.Value:
    value = ir.Value(name=name, type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), shape=ir.Shape(array.shape),
                     const_value=ir.tensor(array))
    model.graph.register_initializer(value)
    if as_input:
        model.graph.inputs.append(value)
    return value


def test_changed_norm_scale_constant():
    model = _model(3)
    sln = _node(model, f"{B1}/hc_norm/SimplifiedLayerNormalization")
    scale = np.ones(H, np.float32)
    scale[3] = 2.0
    sln.replace_input_with(1, _initializer(model, "other_scale", scale))
    _expect_block_left(model, group=f"{B1}/hc_norm", reason=f"must be ones of shape ({H},)")


def test_changed_silu_divisor_shape():
    model = _model(3)
    div = _node(model, f"{B1}/input_mix_weight_down/SiLU/Div")
    div.replace_input_with(1, _initializer(model, "divisor_vector", np.full(R, 4.0, np.float32)))
    _expect_block_left(model, group=f"{B1}/input_mix_weight_down/SiLU", reason="must be a scalar of shape [] or [1]")


def test_a_norm_the_fusion_refuses_is_not_rewritten():
    """A valid norm over 2 groups of 2H rewrites as BranchwiseRMSNorm(num_branches=2), but the pre-mix
    has 4: the trial fusion refuses the block, so the norm stays in its standard form."""
    model = _model(3)
    reshape = _node(model, f"{B1}/hc_norm/Reshape")
    reshape.replace_input_with(1, _initializer(model, "two_groups", np.array([0, 0, 2, 2 * H], np.int64)))
    _node(model, f"{B1}/hc_norm/SimplifiedLayerNormalization").replace_input_with(
        1, _initializer(model, "ones_2h", np.ones(2 * H, np.float32)))
    _expect_block_left(model, group=f"{B1}/hc_norm",
                       reason="its block did not fuse with it (block '/model/layers.0/mlp_hyper_connection/hc_norm'): "
                              "num_branches differs: BranchwiseRMSNorm 2, HyperConnectionPreMix 4")


def test_non_constant_silu_divisor():
    model = _model(3)
    divisor = ir.Value(name="silu_divisor", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([]))
    model.graph.inputs.append(divisor)
    _node(model, f"{B1}/input_mix_weight_down/SiLU/Div").replace_input_with(1, divisor)
    _expect_block_left(model, group=f"{B1}/input_mix_weight_down/SiLU",
                       reason="graph input 'silu_divisor'")


def test_overridable_norm_scale_is_not_read_and_its_override_is_followed(hcfuse_lib):
    model = _model(3)
    sln = _node(model, f"{B1}/hc_norm/SimplifiedLayerNormalization")
    sln.replace_input_with(1, _initializer(model, "overridable_ones", np.ones(H, np.float32), as_input=True))
    original, report = _expect_block_left(model, group=f"{B1}/hc_norm", feeds=True, reason="is not a true constant")
    reason = _reasons(report)[f"{B1}/hc_norm"]
    assert "'overridable_ones'" in reason and "overridable" in reason
    rng = np.random.default_rng(1)
    feeds = {"inputs_embeds": rng.standard_normal((2, 3, H)).astype(np.float32),
             "overridable_ones": np.linspace(0.5, 2.0, H).astype(np.float32)}
    expected = cpu_session(original).run(None, feeds)[0]
    actual = cpu_session(ir.to_proto(model), hcfuse_lib).run(None, feeds)[0]
    assert np.abs(actual - expected).max() <= 1e-4 * np.abs(expected).max()
    assert np.abs(expected - cpu_session(original).run(None, {"inputs_embeds": feeds["inputs_embeds"]})[0]).max() > 0.01


def test_intermediate_graph_output():
    model = _model(3)
    model.graph.outputs.append(_node(model, f"{B1}/hc_norm/SimplifiedLayerNormalization").outputs[0])
    _expect_block_left(model, group=f"{B1}/hc_norm", reason="is a graph output")


def test_extra_consumer():
    model = _model(3)
    z = _node(model, f"{B1}/input_mix_weight_down/SiLU/Div").outputs[0]
    spy = ir.node("Identity", [z], name="spy")
    model.graph.append(spy)
    model.graph.outputs.append(spy.outputs[0])
    spy.outputs[0].name, spy.outputs[0].type, spy.outputs[0].shape = "spy_out", z.type, z.shape
    _expect_block_left(model, group=f"{B1}/input_mix_weight_down/SiLU", reason="is also consumed by Identity 'spy'")


def test_broadcast_post_gate_is_not_a_post_mix():
    """A (1, 1, C) post gate broadcasts in the expansion; HyperConnectionPostMix would refuse it. The
    post-mix stays, block 1 fuses without its prologue."""
    model = _model(3)
    weight = _node(model, "/model/layers.0/attn_hyper_connection/injection/weight/Unsqueeze")
    weight.replace_input_with(0, _initializer(model, "fixed_gate", np.full((1, 1, C), 0.5, np.float32)))
    original, report = _fuse(model)
    assert len(report.fused) == 4 and not CONTRIB & set(_ops(model))
    reasons = _reasons(report)
    assert "do not provably share their leading dims" in reasons["/model/layers.0/attn_hyper_connection/injection"]
    assert _ops(model)["Add"] == 1
    _gap(original, model)


def test_without_value_info_nothing_changes_unproved(hcfuse_lib):
    """Without value shapes the reshapes cannot be proved: every block is fused or left with a reason,
    and nothing rewritten is left outside a fused node."""
    model = _model(3, value_info=False)
    original, report = _fuse(model)
    assert not CONTRIB & set(_ops(model))
    if len(report.fused) < 4:
        assert report.rejected and all(item.reason for item in report.rejected)
    _gap(original, model)


def test_a_trial_that_fuses_nothing_leaves_the_model_as_it_was():
    from hcfuse.rewrite.standard_onnx import canonicalize_standard_onnx

    model = _model(3)
    before = ir.to_proto(model).SerializeToString()
    report = canonicalize_standard_onnx(model, trial=lambda work: None)
    assert report.canonicalized == [] and len(report.rejected) == 3 * 4 + 3  # 4 expansions a block, 3 in the final mix
    starts = ("its block did not fuse with it", "the next block (")
    assert all(item.reason.startswith(starts) for item in report.rejected)
    assert ir.to_proto(model).SerializeToString() == before


def test_a_model_without_expansions_is_not_tried():
    from hcfuse.rewrite.standard_onnx import canonicalize_standard_onnx
    from hcfuse.models.qwen_decode import build_decode_model

    def no_trial(model):
        raise AssertionError("a model without expansions needs no trial")

    report = canonicalize_standard_onnx(build_decode_model(2, C=C, H=H, R=R), trial=no_trial)
    assert report.canonicalized == [] and report.rejected == []


def test_an_expansion_in_a_subgraph_is_left_with_a_reason(hcfuse_lib):
    from onnx import TensorProto, helper

    def branch(tag):
        nodes = [helper.make_node("Div", ["x", "four"], [f"z_{tag}"], name=f"{tag}/SiLU/Div"),
                 helper.make_node("Sigmoid", [f"z_{tag}"], [f"s_{tag}"], name=f"{tag}/SiLU/Sigmoid"),
                 helper.make_node("Mul", [f"z_{tag}", f"s_{tag}"], [f"y_{tag}"], name=f"{tag}/SiLU")]
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"y_{tag}", TensorProto.FLOAT, [2, R])])

    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], name="if", then_branch=branch("then"), else_branch=branch("else"))],
        "g", [helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, R])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, R])],
        [helper.make_tensor("four", TensorProto.FLOAT, [], [4.0])])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    report = fuse_with_report(model)
    assert report.fused == [] and _ops(model) == {"If": 1}
    assert {item.anchor: item.reason for item in report.rejected} == {
        f"{tag}/SiLU": "inside a model-local function or a subgraph: expansions are rewritten in the main graph only"
        for tag in ("then", "else")}


def test_expansions_a_fused_block_does_not_absorb_stay():
    """A fusion that absorbs no prologue (here: one that cannot see HyperConnectionPostMix) fuses the
    blocks but leaves every rewritten post-mix outside: those are dropped and tried again, and the
    model keeps its post-mix expansions while the rest is rewritten."""
    from hcfuse.rewrite.standard_onnx import canonicalize_standard_onnx

    calls = []

    def fusion_without_prologues(work):
        calls.append(collections.Counter(n.op_type for n in work.graph)[_op.POST_MIX])
        hidden = [n for n in work.graph if n.op_type == _op.POST_MIX]
        for node in hidden:
            node.domain = "hidden"
        report = fuse_with_report(work)
        for node in hidden:
            node.domain = _op.DOMAIN
        return report

    model = _model(3)
    report = canonicalize_standard_onnx(model, trial=fusion_without_prologues)
    assert calls == [3, 0]  # the second trial, without the post-mixes, absorbs everything it was given
    assert _ops(model)[_op.BRANCH_NORM] == 4 and _ops(model)[_op.POST_MIX] == 0 and _ops(model)["Unsqueeze"] == 6
    left = _reasons(report)
    assert sorted(left) == sorted(f"/model/layers.{i // 2}/{('attn', 'mlp')[i % 2]}_hyper_connection/injection"
                                  for i in range(3))
    assert all(reason.startswith("the next block (") and reason.endswith("did not absorb it as its prologue")
               for reason in left.values()), left
    assert len(report.canonicalized) == 4 * 3


def test_overridable_norm_weight_fuses_and_its_override_is_followed(hcfuse_lib):
    """The Mul's weight + 1 becomes the fused node's norm_scale input as it is (nothing is folded), so
    an overridable one still fuses, and a value fed at run time reaches the fused node."""
    model = _model(3)
    weight = model.graph.initializers[f"{B1.lstrip('/').replace('/', '.')}.hc_norm.weight"]
    model.graph.inputs.append(weight)
    original, report = _fuse(model)
    assert len(report.fused) == 4 and report.rejected == []
    assert weight in [n.inputs[1] for n in model.graph if n.op_type == _op.OP_TYPE]
    rng = np.random.default_rng(2)
    feeds = {"inputs_embeds": rng.standard_normal((2, 3, H)).astype(np.float32),
             weight.name: rng.uniform(0.5, 1.5, C * H).astype(np.float32)}
    expected = cpu_session(original).run(None, feeds)[0]
    actual = cpu_session(ir.to_proto(model), hcfuse_lib).run(None, feeds)[0]
    assert np.abs(actual - expected).max() <= 1e-4 * np.abs(expected).max()


def test_constants_declared_as_scalars_like_the_builder_does(hcfuse_lib):
    """The builder's make_constant declares every constant's shape as [] (lists included): the rules
    read the constants' tensors, not those declarations."""
    model = _model(3)
    for node in model.graph:
        if node.op_type == "Constant":
            node.outputs[0].shape = ir.Shape([])
    original, report = _fuse(model)
    assert len(report.fused) == 4 and report.rejected == []
    _gap(original, model)


def test_shapes_come_from_the_given_shape_function():
    """shapes= replaces the declared shapes the rules prove with (the fusion's derived shape facts can
    be plugged in there): a function that knows no shape proves nothing, and nothing changes."""
    from hcfuse.rewrite.standard_onnx import canonicalize_standard_onnx

    model = _model(2)
    before = ir.to_proto(model).SerializeToString()
    report = canonicalize_standard_onnx(model, trial=fuse_with_report, shapes=lambda m: (lambda value: None))
    assert report.canonicalized == [] and ir.to_proto(model).SerializeToString() == before
    assert any("is unknown" in item.reason for item in report.rejected)
