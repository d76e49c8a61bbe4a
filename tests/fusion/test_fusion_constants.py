"""Only true constants are folded (issue 10 item 2).

An initializer that is also listed among the graph inputs is an overridable default: a caller may feed
another value. Each value the rewrite reads at fuse time (Div/Mul constants, ScaledSiLU's scale input,
Split sizes, a (C, H) or (H) norm scale it reshapes, a packed weight it slices) is made overridable
here; the block is then left unfused with a reason naming that value, or fused with the value as the
fused node's input. Either way the optimized model, fed another value for it in onnxruntime, gives the
stock model's result."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import _op
from hcfuse.rewrite import fuse_with_report
from tests._compare import cpu_session
from tests.fusion.test_fusion import C, H, R, _fused_nodes, _model, _node

OVERRIDABLE = "which is also a graph input (an overridable default)"


def _overridable(model: ir.Model, value: ir.Value) -> ir.Value:
    """Lists an initializer among the graph inputs (registering it first when it is not one yet)."""
    if not value.is_initializer():
        model.graph.register_initializer(value)
    model.graph.inputs.append(value)
    return value


def _new_initializer(model: ir.Model, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.tensor(array))
    model.graph.register_initializer(value)
    return value


def _run_both(original, fused, library, override: dict[str, np.ndarray], seed=0):
    """Outputs of the stock and the optimized model on the same feeds, override included."""
    rng = np.random.default_rng(seed)
    feeds = {"inputs_embeds": rng.standard_normal((2, 3, H)).astype(np.float32), **override}
    expected = cpu_session(ir.to_proto(original), None).run(None, feeds)[0]
    actual = cpu_session(ir.to_proto(fused), library).run(None, feeds)[0]
    return expected, actual


def _assert_follows_override(original: ir.Model, library: str, override: dict[str, np.ndarray]):
    fused = original.clone()
    report = fuse_with_report(fused)
    expected, actual = _run_both(original, fused, library, override)
    default = {name: original.graph.initializers[name].const_value.numpy() for name in override}
    expected_default, _ = _run_both(original, fused, library, default)
    assert np.abs(expected - expected_default).max() > 1e-3, "the override must change the stock result"
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-5)
    return report, fused


def _reasons(report) -> dict[str, str]:
    return {item.anchor: item.reason for item in report.rejected}


def _only_final_mix_fused(report) -> str:
    """The reason of the one block left unfused (block 0 of a 1-block model; its final mix is fused)."""
    assert len(report.fused) == 1, report.to_dict()
    [reason] = _reasons(report).values()
    return reason


def test_overridable_gate_div_is_not_folded(hcfuse_lib):
    model = _model(2, constants="initializer")
    divisor = _overridable(model, _node(model, "Div", 0).inputs[1])  # shared by both blocks
    report, fused = _assert_follows_override(model, hcfuse_lib, {divisor.name: np.array(3.0, np.float32)})
    assert len(report.fused) == 1  # only the final mix, which has no Div
    reasons = _reasons(report)
    assert len(reasons) == 2
    assert all(f"gate_div (initializer {divisor.name!r}, {OVERRIDABLE})" in r for r in reasons.values()), reasons


def test_overridable_gate_mul_stays_a_mul(hcfuse_lib):
    model = _model(2, constants="initializer")
    mul = _overridable(model, _node(model, "Mul", 0).inputs[1])
    report, fused = _assert_follows_override(model, hcfuse_lib, {mul.name: np.array(1.5, np.float32)})
    # the blocks are fused without their Mul, which stays and reads the graph input at run time
    assert len(report.fused) == 3
    assert all("gate Mul not fused" in r and OVERRIDABLE in r for r in _reasons(report).values())
    assert [node.attributes["gate_mul"].value for node in _fused_nodes(fused)] == [1.0, 1.0, 1.0]


def test_overridable_scaled_silu_scale_is_not_folded(hcfuse_lib):
    model = _model(1)
    silu = _node(model, _op.SCALED_SILU)
    scale = _overridable(model, _new_initializer(model, "silu_scale", np.array(0.5, np.float32)))
    silu.resize_inputs(2)
    silu.replace_input_with(1, scale)
    report, fused = _assert_follows_override(model, hcfuse_lib, {"silu_scale": np.array(2.0, np.float32)})
    reason = _only_final_mix_fused(report)
    assert f"non-constant scale input (initializer 'silu_scale', {OVERRIDABLE})" in reason


def test_overridable_split_sizes_are_not_read(hcfuse_lib):
    model = _model(1)
    split = _node(model, "Split", 0)
    sizes = _overridable(model, _new_initializer(model, "split_sizes", np.array([R, C], np.int64)))
    split.replace_input_with(1, sizes)
    fused = model.clone()
    report = fuse_with_report(fused)
    reason = _only_final_mix_fused(report)
    assert f"Split sizes (initializer 'split_sizes', {OVERRIDABLE}) are not a constant" in reason
    # other sizes would not fit the rest of the stock block: the default runs in both models
    expected, actual = _run_both(model, fused, hcfuse_lib, {})
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("layout", ["grouped", "shared"])
def test_overridable_norm_scale_of_another_layout_is_not_reshaped(hcfuse_lib, layout):
    model = _model(1)
    norm = _node(model, _op.BRANCH_NORM, 0)
    flat = norm.inputs[1].const_value.numpy()
    array = flat.reshape(C, H) if layout == "grouped" else flat[:H]
    scale = _overridable(model, _new_initializer(model, f"scale_{layout}", np.ascontiguousarray(array)))
    norm.replace_input_with(1, scale)
    override = (np.asarray(array) * 1.5 + 0.25).astype(np.float32)
    report, fused = _assert_follows_override(model, hcfuse_lib, {scale.name: override})
    reason = _only_final_mix_fused(report)
    assert f"norm scale (initializer {scale.name!r}, {OVERRIDABLE}) must be ({C * H},), or a constant" in reason


def test_overridable_packed_weight_is_not_sliced(hcfuse_lib):
    model = _model(1)
    packed = _overridable(model, _node(model, "MatMul", 0).inputs[1])
    assert packed.shape.dims == (C * H, R + C)
    override = np.random.default_rng(5).standard_normal((C * H, R + C)).astype(np.float32) * 0.2
    report, fused = _assert_follows_override(model, hcfuse_lib, {packed.name: override})
    reason = _only_final_mix_fused(report)
    assert f"packed weight initializer {packed.name!r}, {OVERRIDABLE}: it cannot be split at fuse time" in reason


def test_overridable_flat_norm_scale_is_a_fused_input(hcfuse_lib):
    model = _model(2)
    scale = _overridable(model, _node(model, _op.BRANCH_NORM, 1).inputs[1])
    override = np.linspace(0.5, 1.5, C * H).astype(np.float32)
    report, fused = _assert_follows_override(model, hcfuse_lib, {scale.name: override})
    assert len(report.fused) == 3 and report.rejected == []


def test_overridable_separate_weights_are_fused_inputs(hcfuse_lib):
    model = _model(2, packed=False)
    down = _overridable(model, _node(model, "MatMul", 0).inputs[1])
    inject = _overridable(model, _node(model, "MatMul", 1).inputs[1])
    assert down.shape.dims == (C * H, R) and inject.shape.dims == (C * H, C)
    rng = np.random.default_rng(9)
    override = {down.name: rng.standard_normal((C * H, R)).astype(np.float32) * 0.3,
                inject.name: rng.standard_normal((C * H, C)).astype(np.float32) * 0.3}
    report, fused = _assert_follows_override(model, hcfuse_lib, override)
    assert len(report.fused) == 3 and report.rejected == []
