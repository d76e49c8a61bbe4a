"""The fusion as an onnx-ir pass and as onnxscript rules, with per-call state: no leak between calls,
and threads get the reports sequential calls get."""

from __future__ import annotations

import concurrent.futures
import re
import textwrap
import gc
import weakref

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import NameFixPass, RemoveUnusedNodesPass, TopologicalSortPass
from onnxscript import rewriter

import hcfuse
from hcfuse import _op
from hcfuse.rewrite import fuse_with_report, hc_lowrank_mix_rules
from hcfuse.rewrite.fusion_pass import FusionPassResult
from hcfuse.models.qwen_decode import make_decode_model
from tests.fusion._chain import CHAIN_OPS, C, H, R, assert_same_outputs, ops


def _proto(num_blocks=3, **options) -> onnx.ModelProto:
    return make_decode_model(num_blocks, C=C, H=H, R=R, final_mix=True, **options)


def test_pass_in_a_pass_manager_with_common_passes(hcfuse_lib):
    original = _proto()
    model = ir.from_proto(original)
    manager = ir.passes.PassManager(
        [hcfuse.HcLowRankMixFusionPass(), RemoveUnusedNodesPass(), TopologicalSortPass(), NameFixPass()])
    result = manager(model)
    assert result.modified and result.model is model
    assert ops(model)[_op.OP_TYPE] == 4 and not CHAIN_OPS & set(ops(model))
    assert_same_outputs(original, ir.to_proto(model), hcfuse_lib)


def test_pass_result_carries_the_report():
    fusion = hcfuse.HcLowRankMixFusionPass()
    result = fusion(ir.from_proto(_proto()))
    assert isinstance(result, FusionPassResult) and result.modified
    assert len(result.report.fused) == 4 and result.report.rejected == []
    again = fusion(result.model)  # nothing left to fuse: not modified, an empty report (nothing carried over)
    assert not again.modified and again.report.fused == [] and again.report.rejected == []


def test_exported_rules_in_onnxscript_rewrite(hcfuse_lib):
    original = _proto()
    fused = rewriter.rewrite(original, pattern_rewrite_rules=hc_lowrank_mix_rules)
    assert isinstance(fused, onnx.ModelProto)
    counts = ops(ir.from_proto(fused))
    assert counts[_op.OP_TYPE] == 4 and not CHAIN_OPS & set(counts)
    assert not any(i.name.endswith("down_block_inject.MatMul.weight") for i in fused.graph.initializer)  # packed: gone
    assert_same_outputs(original, fused, hcfuse_lib)
    # the same rule objects on another model: the same result (nothing kept from the first call)
    again = rewriter.rewrite(_proto(), pattern_rewrite_rules=hc_lowrank_mix_rules)
    assert ops(ir.from_proto(again)) == counts


def test_rules_keep_nothing_of_a_model_after_a_call():
    model = ir.from_proto(_proto())
    graph = weakref.ref(model.graph)
    rewriter.rewrite(model, pattern_rewrite_rules=hc_lowrank_mix_rules)
    fuse_with_report(ir.from_proto(_proto()))
    del model
    gc.collect()
    assert graph() is None, "a rule or module keeps the model alive"


def _variants():
    return [dict(num_blocks=4), dict(num_blocks=3, packed=False), dict(num_blocks=5, leading_dims=(2, 3)),
            dict(num_blocks=2, dtype=np.float16), dict(num_blocks=6, num_weight_sets=2, extra_add_before=(3,))]


def _optimize(options) -> dict:
    proto = _proto(**options)
    model = ir.from_proto(proto)
    model.graph.outputs.append(next(n for n in model.graph if n.op_type == "Sigmoid").outputs[0])  # one rejection
    return fuse_with_report(model).to_dict()


def test_concurrent_optimizations_give_the_sequential_reports():
    variants = _variants() * 2
    sequential = [_optimize(v) for v in variants]
    assert all(r["fused_count"] and r["rejected"] for r in sequential)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        concurrent_reports = list(pool.map(_optimize, variants))
    assert concurrent_reports == sequential


def test_concurrent_rewrites_with_the_shared_exported_rules():
    protos = [_proto(**v) for v in _variants()]
    sequential = [ops(ir.from_proto(rewriter.rewrite(p, pattern_rewrite_rules=hc_lowrank_mix_rules)))
                  for p in protos]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: rewriter.rewrite(p, pattern_rewrite_rules=hc_lowrank_mix_rules),
                                protos * 2))
    assert [ops(ir.from_proto(p)) for p in results] == sequential * 2


def test_the_pass_docstring_example_runs(tmp_path, monkeypatch, capsys):
    from hcfuse.rewrite import fusion_pass

    ir.save(ir.from_proto(_proto()), tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"::\n\n((?:    .*\n|\n)+)", fusion_pass.__doc__)
    assert len(blocks) == 2
    namespace: dict = {}
    exec(compile("\n".join(textwrap.dedent(b) for b in blocks), "fusion_pass example", "exec"), namespace)
    assert capsys.readouterr().out == "True\n4 blocks fused\n"
    assert ops(namespace["model"])[_op.OP_TYPE] == 4 and ops(namespace["fused"])[_op.OP_TYPE] == 4
    assert (tmp_path / "fused.onnx").exists()
