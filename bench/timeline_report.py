"""Where the fast path's CTAs ran and which were late, from the timeline probe's per-CTA dumps.

    hc_fast_timeline --rows 1 4 16 --configs default --dump DIR     # on the GPU machine
    python3 bench/timeline_report.py DIR [more CSVs or folders]     # anywhere

For each CSV (one probe config and row count) and each stage, averaged over the dumped blocks, times in us
after the kernel's first wait return:
- CTAs, the SMs they ran on, and how many of those SMs held 1, 2 or 3+ of the kernel's CTAs;
- late CTAs (started less than LATE_US before the first wait return, too late to have their weights
  streamed ahead: they found no room next to the running kernels): how many, their last wait return and
  end, against the median CTA's end;
- the mean phase marks and end of the CTAs alone on their SM and of those sharing it.
and the SM groups its clusters imply: SMs that ran CTAs of one cluster (of 8) land in one group, a lower
bound on the GPCs. Groups are per dump: across dumps, even of one process, they do not line up (measured on
the H200), so %smid need not name the same SM from one graph to the next.
"""
from __future__ import annotations

import argparse
import csv
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

EVENTS = ("start", "waited", "end", "phase1", "phase2", "phase3", "phase4")
CLUSTER = 8  # CTAs a cluster in the dumped kernels (kHcFastClusterSize)
LATE_US = 1.0  # a CTA that starts less than this before its kernel's first wait return is late


@dataclass(frozen=True)
class Cta:
    block: int
    stage: int
    cta: int
    sm: int
    times: dict  # event -> us from the dump's t0 (missing events absent)


def load(path: Path) -> list[Cta]:
    """The records of one dump CSV (block,stage,cta,sm,start,waited,end,phase1..phase4)."""
    with open(path, newline="") as f:
        return [Cta(int(r["block"]), int(r["stage"]), int(r["cta"]), int(r["sm"]),
                    {e: float(r[e]) for e in EVENTS if r.get(e)}) for r in csv.DictReader(f)]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def stage_report(ctas: list[Cta]) -> dict:
    """Placement and lateness of one stage, averaged over its blocks (ctas: that stage's records)."""
    blocks = defaultdict(list)
    for c in ctas:
        blocks[c.block].append(c)
    rows = []
    for members in blocks.values():
        w0 = min(c.times["waited"] for c in members)
        per_sm = Counter(c.sm for c in members)
        late = [c for c in members if c.times["start"] > w0 - LATE_US]
        ends = sorted(c.times["end"] - w0 for c in members)
        by_share = {}
        for share, group in (("alone", [c for c in members if per_sm[c.sm] == 1]),
                             ("sharing", [c for c in members if per_sm[c.sm] > 1])):
            by_share[share] = {e: _mean([c.times[e] - w0 for c in group if e in c.times]) for e in EVENTS[1:]}
            by_share[share]["ctas"] = len(group)
        rows.append({
            "ctas": len(members), "sms": len(per_sm),
            "sms_holding": Counter(min(n, 3) for n in per_sm.values()),
            "late": len(late),
            "late_wait_max": max((c.times["waited"] - w0 for c in late), default=float("nan")),
            "late_end_max": max((c.times["end"] - w0 for c in late), default=float("nan")),
            "median_end": ends[len(ends) // 2], "last_end": ends[-1], "by_share": by_share,
        })
    n = len(rows)
    holding = Counter()
    for r in rows:
        holding.update(r["sms_holding"])
    avg = {k: _mean([r[k] for r in rows if r[k] == r[k]]) for k in  # NaN (no late CTA) left out
           ("ctas", "sms", "late", "late_wait_max", "late_end_max", "median_end", "last_end")}
    avg["sms_holding"] = {k: v / n for k, v in sorted(holding.items())}
    avg["by_share"] = {share: {k: _mean([r["by_share"][share][k] for r in rows
                                         if r["by_share"][share]["ctas"] > 0])
                               for k in rows[0]["by_share"][share]}
                       for share in ("alone", "sharing")}
    avg["blocks"] = n
    return avg


def sm_groups(ctas: list[Cta], cluster: int = CLUSTER) -> list[list[int]]:
    """SMs that ran CTAs of one cluster, joined transitively (union-find), largest groups first."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    members = defaultdict(list)
    for c in ctas:
        members[c.block, c.stage, c.cta // cluster].append(c.sm)
    for sms in members.values():
        for sm in sms:
            parent[find(sm)] = find(sms[0])
    groups = defaultdict(list)
    for sm in parent:
        groups[find(sm)].append(sm)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: (-len(g), g[0]))


def format_report(name: str, ctas: list[Cta]) -> str:
    groups = sm_groups(ctas)
    lines = [f"## {name}", "", f"SM groups implied by the clusters: {sorted((len(g) for g in groups), reverse=True)} "
             f"({sum(map(len, groups))} SMs seen)", "",
             "| stage | blocks | CTAs | SMs | SMs holding 1 / 2 / 3+ | late CTAs | late: last wait / last end "
             "| median end | last end | alone: n, phase1-4, end | sharing: n, phase1-4, end |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for stage in sorted({c.stage for c in ctas}):
        r = stage_report([c for c in ctas if c.stage == stage])
        hold = " / ".join(f"{r['sms_holding'].get(k, 0):.0f}" for k in (1, 2, 3))

        def share(s: str) -> str:
            b = r["by_share"][s]
            phases = " ".join(f"{b[e]:.2f}" for e in ("phase1", "phase2", "phase3", "phase4"))
            return f"{b['ctas']:.0f}, {phases}, {b['end']:.2f}"

        lines.append(f"| {stage} | {r['blocks']} | {r['ctas']:.0f} | {r['sms']:.0f} | {hold} | {r['late']:.1f} "
                     f"| {r['late_wait_max']:.2f} / {r['late_end_max']:.2f} | {r['median_end']:.2f} "
                     f"| {r['last_end']:.2f} | {share('alone')} | {share('sharing')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="dump CSVs or folders of them")
    args = ap.parse_args()
    files = [f for p in args.paths for f in (sorted(p.glob("*.csv")) if p.is_dir() else [p])]
    for f in files:
        print(format_report(f.stem, load(f)), end="\n\n")


if __name__ == "__main__":
    main()
