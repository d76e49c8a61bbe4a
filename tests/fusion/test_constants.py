"""Constants: the gate constants fold whether Constant nodes or initializers (and go with the nodes that
read them); only true constants are folded.

An initializer that is also listed among the graph inputs is an overridable default: a caller may feed
another value. Each value the rewrite reads at fuse time (Div/Mul constants, ScaledSiLU's scale input,
Split sizes, a (C, H) or (H) norm scale it reshapes, a packed weight it slices) is made overridable
here; the block is then left unfused with a reason naming that value, or fused with the value as the
fused node's input. Either way the optimized model, fed another value for it in onnxruntime, gives the
stock model's result."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse import _op
from hcfuse.models.qwen_decode import make_decode_model
from hcfuse.rewrite import fuse_with_report
from tests._compare import cpu_session
from tests.fusion._chain import (
    OVERRIDABLE, C, H, R, assert_same_outputs, fused_nodes, initializer, node, ops, reasons, stock_chain,
)


@pytest.mark.parametrize("constants", ["node", "initializer"])
@pytest.mark.parametrize("shape", [(), (1,)], ids=["0d", "1d"])
def test_gate_constants_as_nodes_or_initializers(hcfuse_lib, constants, shape):
    original = make_decode_model(2, C=C, H=H, R=R, constants=constants, constant_shape=shape, final_mix=True)
    fused = ir.from_proto(original)
    assert len(fuse_with_report(fused).fused) == 3
    for fused_node in fused_nodes(fused)[:2]:
        assert fused_node.attributes["gate_div"].value == 4.0 and fused_node.attributes["gate_mul"].value == 2.0
    # the shared constants and the packed weights are gone with the nodes that read them
    assert ops(fused)["Constant"] == 1  # the Tile repeats
    names = set(fused.graph.initializers)
    assert not any(n.startswith("/model/constants/FLOAT/") or n.endswith("block_inject.MatMul.weight") for n in names)
    assert_same_outputs(original, ir.to_proto(fused), hcfuse_lib)


# ---- overridable defaults ------------------------------------------------------------------------


def _overridable(m: ir.Model, value: ir.Value) -> ir.Value:
    """Lists an initializer among the graph inputs (registering it first when it is not one yet)."""
    if not value.is_initializer():
        m.graph.register_initializer(value)
    m.graph.inputs.append(value)
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


def _only_final_mix_fused(report) -> str:
    """The reason of the one block left unfused (block 0 of a 1-block model; its final mix is fused)."""
    assert len(report.fused) == 1, report.to_dict()
    [reason] = reasons(report).values()
    return reason


def test_overridable_gate_div_is_not_folded(hcfuse_lib):
    m = stock_chain(2, constants="initializer")
    divisor = _overridable(m, node(m, "Div", 0).inputs[1])  # shared by both blocks
    report, _ = _assert_follows_override(m, hcfuse_lib, {divisor.name: np.array(3.0, np.float32)})
    assert len(report.fused) == 1  # only the final mix, which has no Div
    found = reasons(report)
    assert len(found) == 2
    assert all(f"gate_div (initializer {divisor.name!r}, {OVERRIDABLE})" in r for r in found.values()), found


def test_overridable_gate_mul_stays_a_mul(hcfuse_lib):
    m = stock_chain(2, constants="initializer")
    mul = _overridable(m, node(m, "Mul", 0).inputs[1])
    report, fused = _assert_follows_override(m, hcfuse_lib, {mul.name: np.array(1.5, np.float32)})
    # the blocks are fused without their Mul, which stays and reads the graph input at run time
    assert len(report.fused) == 3
    assert all("gate Mul not fused" in r and OVERRIDABLE in r for r in reasons(report).values())
    assert [n.attributes["gate_mul"].value for n in fused_nodes(fused)] == [1.0, 1.0, 1.0]


def test_overridable_split_sizes_are_not_read(hcfuse_lib):
    m = stock_chain(1)
    split = node(m, "Split", 0)
    sizes = _overridable(m, initializer(m.graph, "split_sizes", np.array([R, C], np.int64)))
    split.replace_input_with(1, sizes)
    fused = m.clone()
    report = fuse_with_report(fused)
    reason = _only_final_mix_fused(report)
    assert f"Split sizes (initializer 'split_sizes', {OVERRIDABLE}) are not a constant" in reason
    # other sizes would not fit the rest of the stock block: the default runs in both models
    expected, actual = _run_both(m, fused, hcfuse_lib, {})
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-5)


# (what is made overridable, the override fed, the reason) for a 1-block model whose block is left


def _silu_scale(m):
    silu = node(m, _op.SCALED_SILU)
    scale = _overridable(m, initializer(m.graph, "silu_scale", np.array(0.5, np.float32)))
    silu.resize_inputs(2)
    silu.replace_input_with(1, scale)
    return scale, np.array(2.0, np.float32), f"non-constant scale input (initializer 'silu_scale', {OVERRIDABLE})"


def _norm_scale(layout):
    def make(m):
        norm = node(m, _op.BRANCH_NORM, 0)
        flat = norm.inputs[1].const_value.numpy()
        array = flat.reshape(C, H) if layout == "grouped" else flat[:H]
        scale = _overridable(m, initializer(m.graph, f"scale_{layout}", np.ascontiguousarray(array)))
        norm.replace_input_with(1, scale)
        override = (np.asarray(array) * 1.5 + 0.25).astype(np.float32)
        reason = f"norm scale (initializer {scale.name!r}, {OVERRIDABLE}) must be ({C * H},), or a constant"
        return scale, override, reason
    return make


def _packed_weight(m):
    packed = _overridable(m, node(m, "MatMul", 0).inputs[1])
    assert packed.shape.dims == (C * H, R + C)
    override = np.random.default_rng(5).standard_normal((C * H, R + C)).astype(np.float32) * 0.2
    reason = f"packed weight initializer {packed.name!r}, {OVERRIDABLE}: it cannot be split at fuse time"
    return packed, override, reason


LEFT = {"scaled-silu-scale": _silu_scale, "norm-scale-grouped": _norm_scale("grouped"),
        "norm-scale-shared": _norm_scale("shared"), "packed-weight": _packed_weight}


@pytest.mark.parametrize("make", LEFT.values(), ids=LEFT.keys())
def test_overridable_value_the_rewrite_would_read_leaves_the_block(hcfuse_lib, make):
    m = stock_chain(1)
    value, override, reason = make(m)
    report, _ = _assert_follows_override(m, hcfuse_lib, {value.name: override})
    assert reason in _only_final_mix_fused(report)


@dataclasses.dataclass(frozen=True)
class AsInput:
    id: str
    options: dict
    overrides: Callable[[ir.Model], dict[str, np.ndarray]]  # makes values overridable; the overrides to feed


def _flat_norm_scale(m):
    scale = _overridable(m, node(m, _op.BRANCH_NORM, 1).inputs[1])
    return {scale.name: np.linspace(0.5, 1.5, C * H).astype(np.float32)}


def _separate_weights(m):
    down = _overridable(m, node(m, "MatMul", 0).inputs[1])
    inject = _overridable(m, node(m, "MatMul", 1).inputs[1])
    assert down.shape.dims == (C * H, R) and inject.shape.dims == (C * H, C)
    rng = np.random.default_rng(9)
    return {down.name: rng.standard_normal((C * H, R)).astype(np.float32) * 0.3,
            inject.name: rng.standard_normal((C * H, C)).astype(np.float32) * 0.3}


AS_INPUTS = [AsInput("flat-norm-scale", {}, _flat_norm_scale),
             AsInput("separate-weights", {"packed": False}, _separate_weights)]


@pytest.mark.parametrize("case", AS_INPUTS, ids=[c.id for c in AS_INPUTS])
def test_overridable_value_read_at_run_time_is_a_fused_input(hcfuse_lib, case):
    m = stock_chain(2, **case.options)
    report, _ = _assert_follows_override(m, hcfuse_lib, case.overrides(m))
    assert len(report.fused) == 3 and report.rejected == []
