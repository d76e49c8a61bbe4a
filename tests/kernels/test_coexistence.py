"""hcfuse next to an onnxruntime that defines the op itself (1.32's CPU wheel ships its schema and its
symbolic shape handler, no kernel) and one that does not (1.31): which schema and which kernel a session
uses, and what it says without hcfuse's library (docs/COEXISTENCE.md)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

import hcfuse
from hcfuse import reference
from hcfuse._library import missing_library_message
from hcfuse._op import DOMAIN, OP_TYPE
from hcfuse.models.hc_block import make_fused_node_model, random_activations, random_weights
from tests._compare import BFLOAT16, run_bound
from tests.kernels.test_kernels_cpu import assert_matches_reference

C, H, R, ROWS = 4, 8, 3, 5
CPU = ["CPUExecutionProvider"]


def _ort_schema():
    """onnxruntime's own schema of the op, or None (1.31 and older define only the stock chain)."""
    found = [s for s in ort_state.get_all_operator_schema() if s.name == OP_TYPE and s.domain == DOMAIN]
    return found[0] if found else None


ORT_SCHEMA = _ort_schema()
needs_ort_schema = pytest.mark.skipif(ORT_SCHEMA is None, reason=f"this onnxruntime does not define {OP_TYPE}")


@needs_ort_schema
def test_hcfuse_schema_and_onnxruntime_s_agree_field_for_field():
    """hcfuse registers its schema with the onnx package (checker, shape inference, onnxscript);
    onnxruntime's is compiled into onnxruntime. Two registries that never meet: they must say the same."""
    ours = onnx.defs.get_schema(OP_TYPE, domain=DOMAIN)
    theirs = ORT_SCHEMA
    assert (ours.since_version, ours.domain) == (theirs.since_version, theirs.domain)

    def params(ps, type_attr):
        return [(p.name, str(p.option).split(".")[-1], getattr(p, type_attr)) for p in ps]

    assert params(ours.inputs, "type_str") == params(theirs.inputs, "typeStr")
    assert params(ours.outputs, "type_str") == params(theirs.outputs, "typeStr")
    assert {k: (str(a.type).split(".")[-1], a.required, a.default_value.SerializeToString())
            for k, a in ours.attributes.items()} == {
        k: (str(a.type).split(".")[-1], a.required, a._default_value) for k, a in theirs.attributes.items()}
    assert [(t.type_param_str, sorted(t.allowed_type_strs)) for t in ours.type_constraints] == [
        (t.type_param_str, sorted(t.allowed_type_strs)) for t in theirs.type_constraints]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_without_the_library_onnxruntime_has_no_kernel(dtype):
    """1.32: its schema resolves the node, no execution provider has a kernel (worded two ways); 1.31: no
    schema at all."""
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype)
    with pytest.raises(Exception) as raised:
        ort.InferenceSession(model.SerializeToString(), providers=CPU)
    text = str(raised.value)
    if ORT_SCHEMA is not None:
        assert re.search(rf"(Could not find an implementation for |Failed to find kernel for {DOMAIN}\.){OP_TYPE}\(1\)",
                         text), text
    else:
        assert f"{DOMAIN}:{OP_TYPE}(-1) is not a registered function/op" in text
    assert "hcfuse.register(session_options)" in missing_library_message(raised.value)


def test_with_the_library_its_schema_resolves_the_node():
    """onnxruntime searches a session's custom-op registries before its own schemas, so with hcfuse's
    library the node resolves against the library's schema (attributes unchecked, checked by the kernel)
    and not onnxruntime's, which refuses an attribute it does not know."""
    model = make_fused_node_model(C=C, H=H, R=R, dtype=np.float32)
    model.graph.node[0].attribute.append(helper.make_attribute("not_in_the_schema", 1))
    ort.InferenceSession(model.SerializeToString(), hcfuse.register(), providers=CPU)  # loads
    if ORT_SCHEMA is not None:
        with pytest.raises(Exception, match="Unrecognized attribute: not_in_the_schema"):
            ort.InferenceSession(model.SerializeToString(), providers=CPU)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16], ids=["float32", "float16", "bfloat16"])
def test_with_the_library_its_kernel_runs_at_the_contract_bounds(dtype, rng):
    """The only CPU kernel there is: bitwise the reference in 16 bits, within the float32 bound."""
    model = make_fused_node_model(C=C, H=H, R=R, dtype=dtype, prologue=True, streams_out=True, gate_div=3.0,
                                  gate_mul=1.7)
    feeds = {**random_weights(C, H, R, dtype, rng), **random_activations((ROWS,), C, H, dtype, rng, prologue=True)}
    got = run_bound(ort.InferenceSession(model.SerializeToString(), hcfuse.register(), providers=CPU), feeds)
    want = reference.hc_lowrank_mix(**feeds, num_branches=C, gate_div=3.0, gate_mul=1.7)
    for (name, value), expected in zip(got.items(), want):
        assert_matches_reference(value, expected, name, f"{name} ({np.dtype(dtype).name})")
