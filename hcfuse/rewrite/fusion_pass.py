"""HcLowRankMixFusionPass: the fusion as an onnx-ir pass, to compose with onnx-ir's common passes.

Example (runnable on any model holding the stock chain)::

    import onnx_ir as ir
    from onnx_ir.passes.common import RemoveUnusedNodesPass, TopologicalSortPass

    import hcfuse

    model = ir.load("model.onnx")
    passes = ir.passes.PassManager([hcfuse.HcLowRankMixFusionPass(), RemoveUnusedNodesPass(), TopologicalSortPass()])
    print(passes(model).modified)                      # True when a block was fused

    result = hcfuse.HcLowRankMixFusionPass()(ir.load("model.onnx"))  # alone, its result carries the report
    print(len(result.report.fused), "blocks fused")
    ir.save(result.model, "fused.onnx")

The same rules also work inside onnxscript's rewriter::

    from onnxscript import rewriter

    fused = rewriter.rewrite(ir.load("model.onnx"), pattern_rewrite_rules=hcfuse.hc_lowrank_mix_rules)

Every call keeps its state in the call (hcfuse.rewrite.session): one pass object may run on many
models, in several threads at once.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from hcfuse.rewrite.fuse import fuse_with_report
from hcfuse.rewrite.report import FusionReport


@dataclasses.dataclass
class FusionPassResult(ir.passes.PassResult):
    """A PassResult that also says what was fused and what was left, and why."""

    report: FusionReport = dataclasses.field(default_factory=FusionReport)


class HcLowRankMixFusionPass(ir.passes.InPlacePass):
    """Fuses every stock hyper-connection block into com.microsoft.HyperConnectionLowRankMix, in place.

    Registers the op's schema and the com.microsoft opset import; removes the constants and packed
    weights the fused nodes no longer read; never reads a weight's data. Takes graphs in any node order
    (onnxruntime sorts a main graph itself): a graph where a block fused comes out sorted, any other in
    its own order (hcfuse.rewrite.sort_order).
    """

    def __init__(self, *, debug: bool = False):
        super().__init__()
        self.debug = debug

    def call(self, model: ir.Model) -> FusionPassResult:
        report = fuse_with_report(model, debug=self.debug)
        return FusionPassResult(model, bool(report.fused), report)
