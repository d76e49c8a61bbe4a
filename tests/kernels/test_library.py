"""The custom-op library in real onnxruntime sessions: loading, registration next to ORT's own
com.microsoft contrib ops, one-node sessions per provider and type, and every run-time validation
answered by an ORT error carrying our text (never a crash)."""

from __future__ import annotations

import os
import pathlib
import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import hcfuse
from hcfuse import reference
from hcfuse._library import (METADATA_KEY, kernel_source_metadata, missing_library_message,
                             registered_library)
from hcfuse._op import BRANCH_NORM, DOMAIN, INPUTS, IR_VERSION, ONNX_OPSET, OP_TYPE
from hcfuse.api import inference_session
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights
from tests._compare import BFLOAT16, assert_bitwise_equal, run_bound
from tests.kernels.test_kernels_cpu import assert_matches_reference

C, H, R, ROWS = 2, 5, 3, 4
DTYPES = [np.float32, np.float16, BFLOAT16]
DTYPE_IDS = ["float32", "float16", "bfloat16"]


def test_library_path_and_register(hcfuse_lib):
    assert os.path.isfile(hcfuse_lib)
    assert hcfuse.get_library_path() == hcfuse_lib
    so = ort.SessionOptions()
    assert hcfuse.register(so) is so
    assert isinstance(hcfuse.register(), ort.SessionOptions)


def test_registering_twice_in_one_process(hcfuse_lib, rng):
    """Each SessionOptions gets its own domain; both sessions work."""
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32)
    feeds = {**random_weights(C, H, R, np.float32, rng), **random_activations((ROWS,), C, H, np.float32, rng)}
    outs = []
    for _ in range(2):
        sess = ort.InferenceSession(model.SerializeToString(), hcfuse.register(), providers=["CPUExecutionProvider"])
        outs.append(sess.run(None, feeds))
    for a, b in zip(*outs):
        assert_bitwise_equal(a, b)


def test_registering_twice_on_one_session_options_is_a_no_op(hcfuse_lib, rng):
    """A second hcfuse.register on the same options would add com.microsoft twice ("Domain already set in
    registry" at session creation): the options record the library and the second call returns them."""
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32)
    feeds = {**random_weights(C, H, R, np.float32, rng), **random_activations((ROWS,), C, H, np.float32, rng)}
    options = ort.SessionOptions()
    assert registered_library(options) is None
    assert hcfuse.register(options) is options and hcfuse.register(options) is options
    assert registered_library(options) == hcfuse_lib
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert_matches_reference(sess.run(None, feeds)[0], reference.hc_lowrank_mix(**feeds, num_branches=C)[0],
                             "pre_output", "pre_output")


def test_registering_another_hcfuse_library_on_the_same_options_names_both(hcfuse_lib, tmp_path, monkeypatch):
    copy = tmp_path / os.path.basename(hcfuse_lib)
    copy.write_bytes(pathlib.Path(hcfuse_lib).read_bytes())
    options = hcfuse.register(ort.SessionOptions())
    monkeypatch.setenv("HCFUSE_LIBRARY", str(copy))
    with pytest.raises(ValueError, match=re.escape(hcfuse_lib) + ".*" + re.escape(str(copy)) + ".*twice"):
        hcfuse.register(options)


def test_a_fused_model_run_without_the_library_gets_hcfuse_s_instruction(rng):
    """onnxruntime's own error (1.32: no implementation; 1.31: no schema) read by hcfuse into one line
    naming hcfuse.register; hcfuse.inference_session on the same model runs it."""
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32)
    with pytest.raises(Exception) as raised:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    message = missing_library_message(raised.value)
    assert message is not None and "\n" not in message
    assert "hcfuse.register(session_options)" in message and OP_TYPE in message
    assert missing_library_message(raised.value, "/x/libhcfuse_ops.so") != message  # registered: another cause
    assert missing_library_message(ValueError("unrelated")) is None


def test_inference_session_registers_the_library_once(hcfuse_lib, rng):
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32)
    feeds = {**random_weights(C, H, R, np.float32, rng), **random_activations((ROWS,), C, H, np.float32, rng)}
    options = hcfuse.register(ort.SessionOptions())  # the caller registered already: no second domain
    sess = inference_session(model, options)
    assert_matches_reference(sess.run(None, feeds)[0], reference.hc_lowrank_mix(**feeds, num_branches=C)[0],
                             "pre_output", "pre_output")


def test_kernel_source_metadata_reaches_onnxruntime_s_model_metadata(hcfuse_lib):
    """What a fused model carries (the fusion pass writes it): onnxruntime shows it to whoever opens it."""
    entry = kernel_source_metadata()
    assert list(entry) == [METADATA_KEY]
    assert hcfuse.__version__ in entry[METADATA_KEY] and "hcfuse.register(session_options)" in entry[METADATA_KEY]
    assert "\n" not in entry[METADATA_KEY]
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32)
    helper.set_model_props(model, entry)
    sess = inference_session(model)
    assert sess.get_modelmeta().custom_metadata_map == entry


def test_loads_next_to_builtin_contrib_ops(make_session, rng):
    """Our op and ORT's own BranchwiseRMSNorm (same com.microsoft domain) in one session."""
    fused = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32)
    norm = helper.make_node(BRANCH_NORM, ["streams"], ["normed"], domain=DOMAIN, num_branches=C)
    fused.graph.node.append(norm)
    fused.graph.output.append(helper.make_tensor_value_info("normed", 1, None))
    feeds = {**random_weights(C, H, R, np.float32, rng), **random_activations((ROWS,), C, H, np.float32, rng)}
    out = make_session(fused).run(None, feeds)
    assert out[2].shape == (ROWS, C * H)
    want = reference.hc_lowrank_mix(**feeds, num_branches=C)
    assert_matches_reference(out[0], want[0], "pre_output", "pre_output")  # float32: the CPU kernel's FMA bound


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_one_node_session_per_provider(make_session, providers, dtype, rng):
    """The three typed registrations of one name coexist; each provider runs each type."""
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True)
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((ROWS,), C, H, dtype, rng, prologue=True)}
    for provider in providers:
        sess = make_session(model, provider)
        out = run_bound(sess, feeds, device="cuda" if provider.startswith("CUDA") else "cpu")
        assert [out[n].shape for n in out] == [(ROWS, H), (ROWS, C), (ROWS, C * H)], provider
        assert all(v.dtype == np.dtype(dtype) for v in out.values()), provider


# --- errors -------------------------------------------------------------------------------------


def _untyped_model(n_inputs: int = 5, n_outputs: int = 2, dtype=np.float32, **attrs):
    """A fused node whose graph inputs have no shapes, so only the kernel sees what is fed."""
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=n_inputs == 7, streams_out=n_outputs == 3,
                                  **attrs)
    node = model.graph.node[0]
    names = list(INPUTS[:n_inputs])
    del node.input[:]
    node.input.extend(names)
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.ClearField("shape")
    existing = {vi.name for vi in model.graph.input}
    for name in names:
        if name not in existing:
            model.graph.input.append(helper.make_tensor_value_info(name, 1, None))
    return model


def _good_feeds(rng, prologue=False):
    return {**random_weights(C, H, R, np.float32, rng),
            **random_activations((ROWS,), C, H, np.float32, rng, prologue=prologue)}


WIDTH = C * H
BAD_SHAPES = [  # (input changed, its new shape, expected text)
    ("norm_scale", (WIDTH + 1,), r"norm_scale must be \(C\*H,\) = \(10,\); got \(11,\)"),
    ("norm_scale", (C, H), r"norm_scale must be \(C\*H,\) = \(10,\); got \(2, 5\)"),
    ("down_weight", (WIDTH, R, 1), r"down_weight must be \(C\*H, R\) = \(10, R\) with R >= 1; got \(10, 3, 1\)"),
    ("down_weight", (WIDTH + 2, R), r"down_weight must be \(C\*H, R\) = \(10, R\) with R >= 1; got \(12, 3\)"),
    ("down_weight", (WIDTH, 0), r"down_weight must be \(C\*H, R\) = \(10, R\) with R >= 1; got \(10, 0\)"),
    ("up_weight", (R + 1, WIDTH), r"up_weight must be \(R, C\*H\) = \(3, 10\); got \(4, 10\)"),
    ("inject_weight", (WIDTH, C + 1), r"inject_weight must be \(C\*H, C\) = \(10, 2\); got \(10, 3\)"),
    ("streams", (ROWS, WIDTH + 1), r"the last dim of streams \(C\*H = 11\) must be a positive multiple of num_branches = 2"),
    ("streams", (ROWS, 0), r"the last dim of streams \(C\*H = 0\) must be a positive multiple"),
    ("streams", (), r"streams must have rank >= 1 \(\.\.\., C\*H\); got a scalar"),
]


def _expect_ort_error(fn, text: str):
    with pytest.raises(Exception, match=text) as info:
        fn()
    assert OP_TYPE in str(info.value)
    return info.value


@pytest.mark.parametrize(("name", "shape", "text"), BAD_SHAPES, ids=[f"{n}{s}" for n, s, _ in BAD_SHAPES])
def test_bad_shapes_give_our_error(make_session, rng, name, shape, text):
    sess = make_session(_untyped_model())
    feeds = _good_feeds(rng)
    feeds[name] = np.ones(shape, np.float32)
    err = _expect_ort_error(lambda: sess.run(None, feeds), text)
    assert isinstance(err, ort.capi.onnxruntime_pybind11_state.InvalidArgument)
    # the session survives a rejected run
    assert sess.run(None, _good_feeds(rng))[0].shape == (ROWS, H)


@pytest.mark.parametrize(("name", "shape", "text"), [
    ("prev_block_output", (ROWS, H + 1), r"prev_block_output must be \(\.\.\., H\) = \(4, 5\) \(the leading dims"),
    ("prev_block_output", (1, H), r"prev_block_output must be \(\.\.\., H\) = \(4, 5\) .*; got \(1, 5\)"),
    ("prev_post_gate", (ROWS, C, 1), r"prev_post_gate must be \(\.\.\., C\) = \(4, 2\) .*; got \(4, 2, 1\)"),
    ("prev_post_gate", (ROWS + 1, C), r"prev_post_gate must be \(\.\.\., C\) = \(4, 2\)"),
])
def test_bad_prologue_shapes_give_our_error(make_session, rng, name, shape, text):
    sess = make_session(_untyped_model(n_inputs=7))
    feeds = _good_feeds(rng, prologue=True)
    feeds[name] = np.ones(shape, np.float32)
    _expect_ort_error(lambda: sess.run(None, feeds), text)


def test_only_one_prologue_input(make_session, rng):
    sess = make_session(_untyped_model(n_inputs=6))
    feeds = _good_feeds(rng, prologue=True)
    del feeds["prev_post_gate"]
    _expect_ort_error(lambda: sess.run(None, feeds),
                      "prev_block_output and prev_post_gate must be given together or not at all; got only "
                      "prev_block_output")


def test_empty_named_optional_input(make_session, rng):
    model = _untyped_model()
    model.graph.node[0].input.extend(["", ""])
    sess = make_session(model)
    _expect_ort_error(lambda: sess.run(None, _good_feeds(rng)), "input 5 is given as an empty name")


def test_empty_named_streams_out_is_not_produced(make_session, rng):
    model = _untyped_model()
    model.graph.node[0].output.append("")
    out = make_session(model).run(None, _good_feeds(rng))
    assert [o.shape for o in out] == [(ROWS, H), (ROWS, C)]


@pytest.mark.parametrize("value", [0, -2])
def test_non_positive_num_branches(make_session, rng, value):
    model = _untyped_model()
    model.graph.node[0].attribute[0].i = value
    sess = make_session(model)
    _expect_ort_error(lambda: sess.run(None, _good_feeds(rng)),
                      f"attribute num_branches must be a positive integer; got {value}")


def test_missing_num_branches_fails_at_session_creation(make_session):
    model = _untyped_model()
    attrs = model.graph.node[0].attribute
    keep = [a for a in attrs if a.name != "num_branches"]
    del attrs[:]
    attrs.extend(keep)
    _expect_ort_error(lambda: make_session(model), "node 'hc_lowrank_mix': attribute num_branches .* is required")


def test_float_attribute_given_as_int(make_session):
    model = _untyped_model()
    model.graph.node[0].attribute.append(helper.make_attribute("gate_mul", 2))
    _expect_ort_error(lambda: make_session(model), "attribute gate_mul must be a float; got the int 2")


def test_int_attribute_given_as_float(make_session):
    model = _untyped_model()
    attrs = model.graph.node[0].attribute
    keep = [a for a in attrs if a.name != "num_branches"]
    del attrs[:]
    attrs.extend(keep + [helper.make_attribute("num_branches", float(C))])
    _expect_ort_error(lambda: make_session(model), "attribute num_branches must be an int; got the float 2")


@pytest.mark.parametrize(("attribute", "expected"), [
    (helper.make_attribute("num_branches", "2"), 'attribute num_branches must be an int; got the string "2"'),
    (helper.make_attribute("num_branches", [2, 2]), "attribute num_branches must be an int; got a list of 2 ints"),
    (helper.make_attribute("epsilon", "1e-5"), 'attribute epsilon must be a float; got the string "1e-5"'),
    (helper.make_attribute("gate_div", [4.0]), "attribute gate_div must be a float; got a list of 1 floats"),
], ids=["num_branches-string", "num_branches-ints", "epsilon-string", "gate_div-floats"])
def test_attribute_of_another_type_is_named_with_what_it_holds(make_session, attribute, expected):
    model = _untyped_model()
    attrs = model.graph.node[0].attribute
    keep = [a for a in attrs if a.name != attribute.name]
    del attrs[:]
    attrs.extend(keep + [attribute])
    _expect_ort_error(lambda: make_session(model), re.escape(expected))


def test_mixed_element_types_rejected_by_ort(make_session, rng):
    """T binds every input: ORT itself refuses a float16 weight next to float32 streams."""
    sess = make_session(_untyped_model())
    feeds = _good_feeds(rng)
    feeds["norm_scale"] = feeds["norm_scale"].astype(np.float16)
    with pytest.raises(Exception, match="(?i)type"):
        sess.run(None, feeds)


def test_missing_required_input(make_session, rng):
    """ORT does not check a custom op's arity at session creation; the kernel does at run time."""
    model = _untyped_model()
    del model.graph.node[0].input[4:]
    del model.graph.input[4]
    feeds = _good_feeds(rng)
    del feeds["inject_weight"]
    _expect_ort_error(lambda: make_session(model).run(None, feeds),
                      "needs the 5 inputs streams, norm_scale, down_weight, up_weight, inject_weight; the node has 4")


def test_model_helper_ir_and_opsets():
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float16)
    assert model.ir_version == IR_VERSION
    assert {(o.domain, o.version) for o in model.opset_import} == {("", ONNX_OPSET), (DOMAIN, 1)}


# ---- the environment variables the library reads

DOCUMENTED_VARIABLES = {"HCFUSE_FORCE_PATH", "HCFUSE_DEBUG"}
KERNELS = pathlib.Path(__file__).resolve().parents[2] / "kernels"


def _lines_outside_dev_knobs(text: str):
    """The source lines a build without HCFUSE_DEV_KNOBS compiles, as far as HCFUSE_DEV_KNOBS decides:
    lines under `#if`/`#ifdef` naming HCFUSE_DEV_KNOBS (not negated) are left out, up to its #else/#endif."""
    stack: list[bool] = []  # per open conditional: whether its current branch is dev-only
    for line in text.splitlines():
        directive = line.strip().replace(" ", "")
        if directive.startswith("#ifndef"):
            stack.append(False)
        elif directive.startswith("#if"):  # #if and #ifdef
            stack.append("HCFUSE_DEV_KNOBS" in directive and "!defined(HCFUSE_DEV_KNOBS)" not in directive)
        elif directive.startswith(("#else", "#elif")) and stack:
            stack[-1] = False
        elif directive.startswith("#endif") and stack:
            stack.pop()
        elif not any(stack):
            yield line


def test_default_build_reads_only_documented_variables():
    """Outside HCFUSE_DEV_KNOBS blocks every getenv in kernels/src takes a literal name of a documented
    variable (HCFUSE_FORCE_PATH, HCFUSE_DEBUG), and the CMake option is off by default."""
    sources = [p for p in (KERNELS / "src").rglob("*") if p.suffix in {".cc", ".cu", ".h", ".cuh", ".inc"}]
    if not sources:
        pytest.skip("the kernels' sources are not beside tests/ (a copy of tests/ run against an installed wheel)")
    read = set()
    for path in sources:
        code = "\n".join(_lines_outside_dev_knobs(path.read_text()))
        for call in re.finditer(r"getenv\s*\(\s*([^)]*)\)", code):
            arg = call.group(1).strip()
            assert re.fullmatch(r'"[A-Z0-9_]+"', arg), f"{path.relative_to(KERNELS)}: getenv({arg}) outside HCFUSE_DEV_KNOBS"
            read.add(arg.strip('"'))
    assert read == DOCUMENTED_VARIABLES, f"the default build reads {sorted(read)}"
    assert re.search(r'option\(HCFUSE_DEV_KNOBS "[^"]*" OFF\)', (KERNELS / "CMakeLists.txt").read_text())
