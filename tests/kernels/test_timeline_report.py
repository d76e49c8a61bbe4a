"""bench/timeline_report.py, the timeline probe's dump report, on a dump written by hand: which CTAs it
counts as late, how it counts SMs shared by a kernel's CTAs, and the SM groups its clusters imply."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "timeline_report.py"
HEADER = "block,stage,cta,sm,start,waited,end,phase1,phase2,phase3,phase4\n"


@pytest.fixture(scope="module")
def report():
    if not SCRIPT.is_file():
        pytest.skip("bench/ is not beside tests/ (a copy of tests/ run against an installed wheel)")
    spec = importlib.util.spec_from_file_location("timeline_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while it is defined
    spec.loader.exec_module(module)
    return module


def _dump(tmp_path: Path) -> Path:
    """One block: stage 1 is one cluster of 8 CTAs on SMs 0-6 (CTAs 6 and 7 share SM 6), resident 3 us
    before the wait; stage 2 is two clusters, the second (CTAs 8-15, SMs 10-17) starting 0.5 us before
    the first wait return (at 0.5), so late, and ending 2 us after the others. Stage 1's CTA 7 has no
    phase marks."""
    rows = []
    for cta in range(8):
        phases = "" if cta == 7 else "1.0,1.5,2.0,3.0"
        rows.append(f"0,1,{cta},{min(cta, 6)},-3.0,{0.25 * (cta == 7)},4.0,{phases or ',,,'}")
    for cta in range(16):
        late = cta >= 8
        sm = 10 + cta - 8 if late else cta
        rows.append(f"0,2,{cta},{sm},{0.0 if late else -5.0},{1.0 if late else 0.5},{7.0 if late else 5.0},"
                    "1.0,1.2,1.8,3.0")
    path = tmp_path / "cluster_rows1.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


def test_late_ctas_and_shared_sms(report, tmp_path):
    ctas = report.load(_dump(tmp_path))
    stage1 = report.stage_report([c for c in ctas if c.stage == 1])
    assert (stage1["ctas"], stage1["sms"], stage1["late"]) == (8, 7, 0)
    assert stage1["sms_holding"] == {1: 6, 2: 1}
    assert stage1["by_share"]["sharing"]["ctas"] == 2 and stage1["by_share"]["alone"]["ctas"] == 6
    assert stage1["by_share"]["sharing"]["phase4"] == pytest.approx(3.0)  # CTA 7 has no marks: CTA 6's
    assert stage1["by_share"]["sharing"]["waited"] == pytest.approx(0.125)

    stage2 = report.stage_report([c for c in ctas if c.stage == 2])
    # times after the first wait return (0.5): the late cluster's wait at 0.5, its end at 6.5
    assert (stage2["ctas"], stage2["sms"], stage2["late"]) == (16, 16, 8)
    assert stage2["late_wait_max"] == pytest.approx(0.5) and stage2["late_end_max"] == pytest.approx(6.5)
    assert stage2["median_end"] == pytest.approx(6.5) and stage2["last_end"] == pytest.approx(6.5)
    assert stage2["sms_holding"] == {1: 16}


def test_sm_groups_join_the_sms_of_a_cluster(report, tmp_path):
    groups = report.sm_groups(report.load(_dump(tmp_path)))
    # stage 1's cluster joins SMs 0-6 and stage 2's first cluster SMs 0-7; its second cluster SMs 10-17
    assert groups == [list(range(8)), list(range(10, 18))]


def test_the_report_names_each_stage(report, tmp_path):
    text = report.format_report("cluster_rows1", report.load(_dump(tmp_path)))
    assert "SM groups implied by the clusters: [8, 8] (16 SMs seen)" in text
    stages = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith(("| 1 ", "| 2 "))]
    assert stages == ["1", "2"]
