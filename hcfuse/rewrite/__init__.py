"""Fusion of the stock hyper-connection chain into com.microsoft.HyperConnectionLowRankMix."""

from hcfuse.rewrite.fuse import fuse_hc_lowrank_mix, fuse_with_report
from hcfuse.rewrite.fusion_pass import FusionPassResult, HcLowRankMixFusionPass
from hcfuse.rewrite.hc_lowrank_mix import (
    HcLowRankMixFusion,
    hc_lowrank_mix_rules,
    hc_lowrank_mix_ruleset,
    make_rules,
    make_ruleset,
)
from hcfuse.rewrite.report import FusedBlock, FusionReport, Rejection
from hcfuse.rewrite.session import FusionSession

__all__ = [
    "FusedBlock",
    "FusionPassResult",
    "FusionReport",
    "FusionSession",
    "HcLowRankMixFusion",
    "HcLowRankMixFusionPass",
    "Rejection",
    "fuse_hc_lowrank_mix",
    "fuse_with_report",
    "hc_lowrank_mix_rules",
    "hc_lowrank_mix_ruleset",
    "make_rules",
    "make_ruleset",
]
