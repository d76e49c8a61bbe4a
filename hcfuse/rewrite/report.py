"""What a fusion pass did: the blocks it fused and the candidates it left, each with its reason."""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass(frozen=True)
class FusedBlock:
    """One fused block: the rule that matched, the new node and the stock nodes it replaced."""

    rule: str
    node: str
    replaced: tuple[str, ...]
    anchor: str = ""  # the block's BranchwiseRMSNorm
    prologue: bool = False  # the block absorbed its prologue (the HyperConnectionPostMix in front of it)

    def to_dict(self) -> dict:
        return {"rule": self.rule, "node": self.node, "anchor": self.anchor, "prologue": self.prologue,
                "replaced": list(self.replaced)}


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A candidate (named by its BranchwiseRMSNorm) left unfused, or fused without its prologue."""

    rule: str
    anchor: str
    reason: str

    def to_dict(self) -> dict:
        return {"rule": self.rule, "node": self.anchor, "anchor": self.anchor, "reason": self.reason}


@dataclasses.dataclass
class FusionReport:
    fused: list[FusedBlock] = dataclasses.field(default_factory=list)
    rejected: list[Rejection] = dataclasses.field(default_factory=list)

    def counts_by_rule(self) -> dict[str, int]:
        return dict(collections.Counter(block.rule for block in self.fused))

    def to_dict(self) -> dict:
        return {
            "fused_count": len(self.fused),
            "counts_by_rule": self.counts_by_rule(),
            "fused": [block.to_dict() for block in self.fused],
            "rejected": [item.to_dict() for item in self.rejected],
        }
