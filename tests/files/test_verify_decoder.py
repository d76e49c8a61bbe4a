"""verify on decoder-shaped models: sizes and inputs derived from the graph (a KV cache's
total = past + sequence, masks, positions, token ids, shape inputs), sizes by name, and the inputs
verify cannot make, through the Python API and ``hcfuse optimize --verify [--dim NAME=SIZE]``."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import hcfuse
from hcfuse import _op
from hcfuse.checking import feeds, verification
from hcfuse.cli import EXIT_ERROR, EXIT_NOT_VERIFIED, EXIT_OK, main
from hcfuse.models.qwen_decode import make_decode_model

C, H, R = 4, 16, 8
HEADS, HEAD = 2, 8
VOCAB, MAX_POSITIONS = 50, 64
CPU = ["CPUExecutionProvider"]
I64, F32 = TensorProto.INT64, TensorProto.FLOAT


def _tensor(name: str, shape, scale: float = 0.3, seed: int = 0) -> onnx.TensorProto:
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return onnx.numpy_helper.from_array(data, name)


def decoder_model(*, key_shape_input: bool = True) -> onnx.ModelProto:
    """An onnxruntime-genai-shaped decoder around hcfuse's stock hyper-connection blocks.

    input_ids [batch_size, sequence_length] -> token embedding + Gather(position_ids) -> the blocks
    (hidden_states); one attention head pair with a KV cache: present.0.key [.., total, ..] =
    Concat(past_key_values.0.key [.., past, ..], key [.., sequence, ..]), scores + the attention mask
    [batch_size, total_sequence_length]. The key's Reshape takes its shape from the int64 input
    key_shape (or from a constant).
    """
    model = make_decode_model(2, C=C, H=H, R=R, leading_dims=("batch_size", "sequence_length"))
    graph = model.graph
    [embeds] = [v for v in graph.input if v.name == "inputs_embeds"]
    graph.input.remove(embeds)
    batch, seq, past, total = "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"
    inputs = [
        helper.make_tensor_value_info("input_ids", I64, [batch, seq]),
        helper.make_tensor_value_info("attention_mask", I64, [batch, total]),
        helper.make_tensor_value_info("position_ids", I64, [batch, seq]),
        helper.make_tensor_value_info("past_key_values.0.key", F32, [batch, HEADS, past, HEAD]),
    ]
    if key_shape_input:
        inputs.append(helper.make_tensor_value_info("key_shape", I64, [4]))
    key_shape = "key_shape" if key_shape_input else "key_shape_constant"
    initializers = [
        _tensor("embed_tokens", [VOCAB, H]), _tensor("embed_positions", [MAX_POSITIONS, H], seed=1),
        _tensor("k_proj", [H, HEADS * HEAD], seed=2), _tensor("q_proj", [H, HEADS * HEAD], seed=3),
        onnx.numpy_helper.from_array(np.array([0, 0, HEADS, HEAD], np.int64), "key_shape_constant"),
        onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "mask_axes"),
    ]
    nodes = [
        helper.make_node("Gather", ["embed_tokens", "input_ids"], ["tokens"], name="embed_tokens/Gather"),
        helper.make_node("Gather", ["embed_positions", "position_ids"], ["positions"], name="embed_positions/Gather"),
        helper.make_node("Add", ["tokens", "positions"], ["inputs_embeds"], name="embed/Add"),
        helper.make_node("MatMul", ["inputs_embeds", "k_proj"], ["k_flat"], name="k_proj/MatMul"),
        helper.make_node("Reshape", ["k_flat", key_shape], ["k_heads"], name="k_proj/Reshape"),
        helper.make_node("Transpose", ["k_heads"], ["key"], name="k_proj/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["past_key_values.0.key", "key"], ["present.0.key"], name="attn/Concat", axis=2),
        helper.make_node("MatMul", ["inputs_embeds", "q_proj"], ["q_flat"], name="q_proj/MatMul"),
        helper.make_node("Reshape", ["q_flat", "key_shape_constant"], ["q_heads"], name="q_proj/Reshape"),
        helper.make_node("Transpose", ["q_heads"], ["query"], name="q_proj/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["present.0.key"], ["key_t"], name="attn/Transpose", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["query", "key_t"], ["qk"], name="attn/MatMul"),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], name="attn/mask/Cast", to=F32),
        helper.make_node("Unsqueeze", ["mask_f", "mask_axes"], ["mask_4d"], name="attn/mask/Unsqueeze"),
        helper.make_node("Add", ["qk", "mask_4d"], ["attn_scores"], name="attn/Add"),
    ]
    existing = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *existing])
    graph.input.extend(inputs)
    graph.initializer.extend(initializers)
    graph.value_info.append(helper.make_tensor_value_info("k_heads", F32, [batch, seq, HEADS, HEAD]))
    graph.output.extend([
        helper.make_tensor_value_info("present.0.key", F32, [batch, HEADS, total, HEAD]),
        helper.make_tensor_value_info("attn_scores", F32, [batch, HEADS, seq, total]),
    ])
    onnx.checker.check_model(model)
    return model


def gqa_decoder_model() -> onnx.ModelProto:
    """The attention as onnxruntime-genai's builder writes it: GroupQueryAttention reads the KV cache
    (no Concat), seqlens_k and total_sequence_length come from the attention mask; only the dim names
    relate present [.., total_sequence_length, ..] to past [.., past_sequence_length, ..]."""
    model = make_decode_model(2, C=C, H=H, R=R, leading_dims=("batch_size", "sequence_length"))
    graph = model.graph
    [embeds] = [v for v in graph.input if v.name == "inputs_embeds"]
    graph.input.remove(embeds)
    batch, seq, past, total = "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"
    inputs = [helper.make_tensor_value_info("input_ids", I64, [batch, seq]),
              helper.make_tensor_value_info("attention_mask", I64, [batch, total])]
    outputs = [helper.make_tensor_value_info("attn_output", F32, [batch, seq, HEADS * HEAD])]
    for kind in ("key", "value"):
        inputs.append(helper.make_tensor_value_info(f"past_key_values.0.{kind}", F32, [batch, 1, past, HEAD]))
        outputs.append(helper.make_tensor_value_info(f"present.0.{kind}", F32, [batch, 1, total, HEAD]))
    initializers = [
        _tensor("embed_tokens", [VOCAB, H]), _tensor("q_proj", [H, HEADS * HEAD], seed=2),
        _tensor("k_proj", [H, HEAD], seed=3), _tensor("v_proj", [H, HEAD], seed=4),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "axis_1"),
        onnx.numpy_helper.from_array(np.array(1, np.int64), "one"),
    ]
    node = helper.make_node
    nodes = [
        node("Gather", ["embed_tokens", "input_ids"], ["inputs_embeds"], name="embed_tokens/Gather"),
        *(node("MatMul", ["inputs_embeds", f"{p}_proj"], [p], name=f"{p}_proj/MatMul") for p in "qkv"),
        node("ReduceSum", ["attention_mask", "axis_1"], ["mask_sum"], name="mask/ReduceSum", keepdims=0),
        node("Sub", ["mask_sum", "one"], ["seqlens_k_64"], name="mask/Sub"),
        node("Cast", ["seqlens_k_64"], ["seqlens_k"], name="mask/Cast", to=TensorProto.INT32),
        node("Shape", ["attention_mask"], ["mask_shape"], name="mask/Shape"),
        node("Gather", ["mask_shape", "one"], ["total_64"], name="mask/Gather", axis=0),
        node("Cast", ["total_64"], ["total_length"], name="mask/Cast_total", to=TensorProto.INT32),
        node("GroupQueryAttention", ["q", "k", "v", "past_key_values.0.key", "past_key_values.0.value", "seqlens_k",
                                     "total_length"], ["attn_output", "present.0.key", "present.0.value"],
             name="attn/GroupQueryAttention", domain=_op.DOMAIN, num_heads=HEADS, kv_num_heads=1),
    ]
    existing = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *existing])
    graph.input.extend(inputs)
    graph.initializer.extend(initializers)
    graph.output.extend(outputs)
    return model


def with_input(model: onnx.ModelProto, value: onnx.ValueInfoProto, node: onnx.NodeProto,
               output: onnx.ValueInfoProto) -> onnx.ModelProto:
    """model with one more input, consumed by node, whose result is one more output."""
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    extended.graph.input.append(value)
    extended.graph.node.append(node)
    extended.graph.output.append(output)
    return extended


@pytest.fixture(scope="module")
def decoder() -> onnx.ModelProto:
    return decoder_model()


@pytest.fixture(scope="module")
def fused_decoder(decoder) -> onnx.ModelProto:
    fused = hcfuse.optimize(decoder)
    assert sum(n.op_type == _op.OP_TYPE for n in fused.graph.node) == 2
    return fused


# --- sizes and inputs from the graph


def test_decoder_with_kv_cache_verifies(hcfuse_lib, decoder, fused_decoder):
    result = hcfuse.verify(decoder, fused_decoder, providers=CPU)
    assert result.status == verification.PASSED, result.summary()
    dims = result.dims
    assert dims["total_sequence_length"] == dims["past_sequence_length"] + dims["sequence_length"]
    assert result.input_shapes["attention_mask"] == [dims["batch_size"], dims["total_sequence_length"]]
    assert {g.name for g in result.outputs} == {"hidden_states", "present.0.key", "attn_scores"}


def test_decoder_feeds_are_consistent(decoder):
    model = ir.from_proto(decoder)
    sizes = feeds.resolve_dims(model, {"past_sequence_length": 5, "sequence_length": 2}, rows=3)
    assert sizes == {"batch_size": 3, "sequence_length": 2, "total_sequence_length": 7, "past_sequence_length": 5}
    data = feeds.make_feeds(model, sizes, 3, np.random.default_rng(0))
    np.testing.assert_array_equal(data["attention_mask"], np.ones((3, 7)))
    np.testing.assert_array_equal(data["position_ids"], [[5, 6]] * 3)  # after the 5 past tokens
    np.testing.assert_array_equal(data["key_shape"], [3, 2, HEADS, HEAD])  # the Reshape's declared output
    assert data["input_ids"].dtype == np.int64 and 0 <= data["input_ids"].min() and data["input_ids"].max() < VOCAB
    assert data["past_key_values.0.key"].shape == (3, HEADS, 5, HEAD)


@pytest.mark.parametrize("given, derived", [
    ({"batch_size": 1, "past_sequence_length": 5, "sequence_length": 2}, {"total_sequence_length": 7}),
    ({"total_sequence_length": 9, "sequence_length": 1}, {"past_sequence_length": 8, "batch_size": 3}),
    ({"total_sequence_length": 4}, {"past_sequence_length": 3, "sequence_length": 1}),  # a decode step
])
def test_dims_by_name(hcfuse_lib, decoder, fused_decoder, given, derived):
    result = hcfuse.verify(decoder, fused_decoder, providers=CPU, dims=given)
    assert result.status == verification.PASSED, result.summary()
    assert result.dims == {**result.dims, **given, **derived}


@pytest.mark.parametrize("given, message", [
    ({"total_sequence_length": 9, "sequence_length": 1, "past_sequence_length": 2},
     r"total_sequence_length = 9, but Concat node 'attn/Concat' makes it"),
    ({"batch": 2}, r"dims \['batch'\] are not dims of the model; its inputs use \['batch_size', "),
    ({"total_sequence_length": 1, "sequence_length": 2}, r"makes past_sequence_length = -1"),
])
def test_dims_that_contradict_the_graph_are_refused(decoder, fused_decoder, given, message):
    with pytest.raises(ValueError, match=message):
        hcfuse.verify(decoder, fused_decoder, providers=CPU, dims=given)


def test_genai_decoder_with_group_query_attention_verifies(hcfuse_lib):
    """A decode step by default (GroupQueryAttention refuses several new tokens after a past unless the
    batch is 1); sizes that onnxruntime refuses make the model not verified, with its reason."""
    model = gqa_decoder_model()
    fused = hcfuse.optimize(model)
    result = hcfuse.verify(model, fused, providers=CPU)
    assert result.status == verification.PASSED, result.summary()
    assert result.dims == {"batch_size": 3, "sequence_length": 1, "past_sequence_length": 3,
                           "total_sequence_length": 4}
    prefill = {"batch_size": 1, "sequence_length": 5, "past_sequence_length": 2}
    assert hcfuse.verify(model, fused, providers=CPU, dims=prefill).status == verification.PASSED
    refused = hcfuse.verify(model, fused, providers=CPU, dims={"batch_size": 2, "sequence_length": 2})
    assert refused.status == verification.NOT_VERIFIED
    assert "GroupQueryAttention" in refused.reason and "batch_size must be 1" in refused.reason
    assert "--dim NAME=VALUE" in refused.reason


def test_genai_dim_names_relate_without_a_concat():
    """The builder's GroupQueryAttention reads the KV cache without a Concat: its names carry total = past + seq."""
    names = ("batch_size", "sequence_length"), ("batch_size", "total_sequence_length")
    values = [helper.make_tensor_value_info(n, I64, list(s)) for n, s in zip(("input_ids", "attention_mask"), names)]
    past = ["batch_size", 2, "past_sequence_length", 4]
    values.append(helper.make_tensor_value_info("past_key_values.0.key", F32, past))
    outputs = [helper.make_tensor_value_info(f"{v.name}_out", v.type.tensor_type.elem_type, None) for v in values]
    nodes = [helper.make_node("Identity", [v.name], [o.name]) for v, o in zip(values, outputs)]
    model = ir.from_proto(helper.make_model(helper.make_graph(nodes, "g", values, outputs)))
    assert feeds.resolve_dims(model, {"past_sequence_length": 6, "sequence_length": 1}, rows=3) == {
        "past_sequence_length": 6, "sequence_length": 1, "total_sequence_length": 7, "batch_size": 3}


def test_a_dim_written_as_an_expression():
    """optimum writes dims such as 'past_sequence_length + 1'."""
    mask = helper.make_tensor_value_info("attention_mask", I64, ["batch", "past_sequence_length + 1"])
    past = helper.make_tensor_value_info("past", F32, ["batch", "past_sequence_length"])
    outputs = [helper.make_tensor_value_info(f"{n}_out", t, None) for n, t in (("attention_mask", I64), ("past", F32))]
    nodes = [helper.make_node("Identity", [n], [f"{n}_out"]) for n in ("attention_mask", "past")]
    model = ir.from_proto(helper.make_model(helper.make_graph(nodes, "g", [mask, past], outputs)))
    sizes = feeds.resolve_dims(model, {"past_sequence_length": 4}, rows=3)
    data = feeds.make_feeds(model, sizes, 3, np.random.default_rng(0))
    assert data["attention_mask"].shape == (3, 5) and data["past"].shape == (3, 4)


def test_an_input_onnxruntime_refuses_is_not_verified_until_sized(hcfuse_lib):
    """x [n] reshaped to [2, 2] runs only for n = 4: the default size is refused by onnxruntime, and
    verify says so (not verified, naming --dim) instead of raising; dims makes it run."""
    x = helper.make_tensor_value_info("x", F32, ["n"])
    y = helper.make_tensor_value_info("y", F32, [2, 2])
    shape = onnx.numpy_helper.from_array(np.array([2, 2], np.int64), "shape")
    model = helper.make_model(helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g", [x], [y],
                                                [shape]), opset_imports=[helper.make_opsetid("", 21)],
                          ir_version=_op.IR_VERSION)  # onnxruntime 1.31 reads IR 13 at most; onnx writes its newest
    result = hcfuse.verify(model, model, providers=CPU)
    assert result.status == verification.NOT_VERIFIED and not result.passed
    assert "could not run the original model" in result.reason and "--dim" in result.reason
    assert result.summary().startswith("verify: not verified:")
    assert hcfuse.verify(model, model, providers=CPU, dims={"n": 4}).status == verification.PASSED


def test_an_optimized_model_that_does_not_run_fails(hcfuse_lib, decoder, fused_decoder):
    broken = onnx.ModelProto()
    broken.CopyFrom(fused_decoder)
    node = next(n for n in broken.graph.node if n.op_type == _op.OP_TYPE)
    node.attribute.append(helper.make_attribute("no_such_attribute", 1))
    node.op_type = "NoSuchOp"
    result = hcfuse.verify(decoder, broken, providers=CPU)
    assert result.status == verification.FAILED
    assert "the original model runs but onnxruntime (CPUExecutionProvider) could not run the optimized" in result.reason


# --- inputs verify cannot make


def _string_input(model):
    return with_input(model, helper.make_tensor_value_info("prompt", TensorProto.STRING, [1]),
                      helper.make_node("Identity", ["prompt"], ["prompt_out"]),
                      helper.make_tensor_value_info("prompt_out", TensorProto.STRING, [1]))


def _sequence_input(model):
    sequence = helper.make_tensor_sequence_value_info("cache_list", F32, None)
    return with_input(model, sequence, helper.make_node("SequenceLength", ["cache_list"], ["cache_count"]),
                      helper.make_tensor_value_info("cache_count", I64, []))


def _shapeless_input(model):
    return with_input(model, helper.make_tensor_value_info("extra", F32, None),
                      helper.make_node("Identity", ["extra"], ["extra_out"]),
                      helper.make_tensor_value_info("extra_out", F32, None))


def _undeclared_shape_input(model):
    """key_shape feeding a Reshape whose output has no declared shape: nothing says what it should hold."""
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    del extended.graph.value_info[:]
    return extended


@pytest.mark.parametrize("make, reason", [
    (_string_input, "graph input 'prompt' is a string tensor"),
    (_sequence_input, "graph input 'cache_list' is a SequenceType"),
    (_shapeless_input, "graph input 'extra' has no shape"),
    (_undeclared_shape_input, "graph input 'key_shape' is the shape of Reshape node 'k_proj/Reshape'"),
])
def test_inputs_verify_cannot_make_are_not_verified(hcfuse_lib, decoder, make, reason):
    model = make(decoder)
    result = hcfuse.verify(model, hcfuse.optimize(model), providers=CPU)
    assert result.status == verification.NOT_VERIFIED
    assert reason in result.reason


# --- the command line


@pytest.fixture
def decoder_file(tmp_path, decoder) -> str:
    path = str(tmp_path / "decoder.onnx")
    onnx.save(decoder, path)
    return path


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_verifies_a_decoder_with_dims(hcfuse_lib, decoder_file, tmp_path, capsys):
    dst = str(tmp_path / "fused.onnx")
    code, out, err = run_cli(capsys, "optimize", decoder_file, "-o", dst, "--verify",
                             "--dim", "batch_size=1", "--dim", "past_sequence_length=6", "--dim", "sequence_length=3")
    assert code == EXIT_OK, out + err
    assert "PASSED" in out
    assert "batch_size=1" in out and "past_sequence_length=6" in out and "total_sequence_length=9" in out
    times = dict(part.rsplit(" ", 2)[:2] for part in out.split("time: ")[1].splitlines()[0].split(", "))
    assert set(times) == {"fuse", "verify", "total"}  # the total includes the verification
    # each time is printed rounded to 0.01 s: the sum of two may exceed the rounded total by 0.01
    assert float(times["total"]) >= float(times["fuse"]) + float(times["verify"]) - 0.0101
    assert os.path.exists(dst)


@pytest.mark.parametrize("argv, message", [
    (["--verify", "--dim", "batch=1"], "dims ['batch'] are not dims of the model"),
    (["--dim", "batch_size=1"], "--dim sets the sizes --verify runs on; give --verify too"),
    (["--verify", "--dim", "batch_size"], "expected NAME=SIZE"),
    (["--verify", "--dim", "batch_size=-1"], "expected NAME=SIZE"),
])
def test_cli_bad_dims(hcfuse_lib, decoder_file, tmp_path, capsys, argv, message):
    dst = str(tmp_path / "fused.onnx")
    try:
        code = main(["optimize", decoder_file, "-o", dst, *argv])
    except SystemExit as e:  # a usage error, found by the parser
        code = e.code
    err = capsys.readouterr().err
    assert code == EXIT_ERROR and message in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(dst)


@pytest.mark.parametrize("make, reason", [(_string_input, "string tensor"), (_sequence_input, "SequenceType")])
def test_cli_not_verified_has_its_own_exit_status(hcfuse_lib, decoder, tmp_path, capsys, make, reason):
    src, dst = str(tmp_path / "in.onnx"), str(tmp_path / "fused.onnx")
    onnx.save(make(decoder), src)
    code, out, err = run_cli(capsys, "optimize", src, "-o", dst, "--verify")
    assert code == EXIT_NOT_VERIFIED and code != EXIT_OK
    assert "verify: not verified:" in out
    [line] = err.strip().splitlines()
    assert line.startswith(f"hcfuse optimize: NOT VERIFIED: wrote {dst}, but could not verify it: ") and reason in line
    assert sum(n.op_type == _op.OP_TYPE for n in onnx.load(dst).graph.node) == 2  # written, as the line says
