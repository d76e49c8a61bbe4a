"""Per-call state of one fusion: what the rules record, the shape facts, the names in use.

A FusionSession lives for one call (fuse_with_report, the pass, or a single match when the exported
rules run inside onnxscript.rewriter.rewrite): nothing survives the call, and two calls (or two
threads) never share one.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from hcfuse.rewrite.derived_weights import DerivedWeights
from hcfuse.rewrite.shape_facts import ShapeFacts


@dataclasses.dataclass(frozen=True)
class CheckFailure:
    rule: str
    anchor: str
    reason: str
    prologue_only: bool  # a condition of the prologue alone: the rule without prologue may still fuse


@dataclasses.dataclass(frozen=True)
class Fusion:
    rule: str
    node: str
    replaced: tuple[str, ...]
    anchor: str
    prologue: bool


class FusionSession:
    def __init__(self, model: ir.Model):
        self.facts = ShapeFacts()
        self.weights = DerivedWeights(model)
        self.names = self.weights.names
        self.failures: list[CheckFailure] = []
        self.fused: list[Fusion] = []
        self.maybe_dead: list[ir.Value] = []  # constants the fused nodes no longer read
