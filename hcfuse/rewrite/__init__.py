"""Fusion of the stock hyper-connection chain into com.microsoft.HyperConnectionLowRankMix."""

from hcfuse.rewrite.fuse import fuse_hc_lowrank_mix, fuse_with_report
from hcfuse.rewrite.hc_lowrank_mix import HcLowRankMixFusion, hc_lowrank_mix_rules, hc_lowrank_mix_ruleset
from hcfuse.rewrite.report import FusedBlock, FusionReport, Rejection

__all__ = [
    "FusedBlock",
    "FusionReport",
    "HcLowRankMixFusion",
    "Rejection",
    "fuse_hc_lowrank_mix",
    "fuse_with_report",
    "hc_lowrank_mix_rules",
    "hc_lowrank_mix_ruleset",
]
