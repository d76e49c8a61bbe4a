"""The CUDA fast path's plan (kernels/src/cuda/fast/hc_fast_plan.{h,cc}) checked on the host, no GPU needed.

HcFastPlanFor is the one place that decides whether the fast path runs a call and how (cluster size,
the real shape's kernels or the generic ones, the kernels' tiling, grids, shared memory, scratch); the
CUDA glue launches from its result. Here
the planner is compiled with the system C++ compiler together with tests/kernels/cpp/fast_plan_probe.cc, which
prints one plan as JSON. The expected figures for the real shape (C=4, H=2560, R=320) are worked out
by hand from the layouts the header documents (comments below).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLANNER = ROOT / "kernels" / "src" / "cuda" / "fast" / "hc_fast_plan.cc"
PROBE = pathlib.Path(__file__).resolve().parent / "cpp" / "fast_plan_probe.cc"
MAX_AUTO_ROWS = 16


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """plan(**settings) -> the probe's JSON (settings: see fast_plan_probe.cc; default: the real shape,
    1 row, an sm_90 device with 227 KiB of opt-in shared memory, 2-byte elements, aligned, not forced)."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) on PATH")
    if not PLANNER.is_file():
        pytest.skip(f"the kernels' sources are not beside tests/ (no {PLANNER.relative_to(ROOT)}): "
                    "a copy of tests/ run against an installed wheel")
    exe = tmp_path_factory.mktemp("fast_plan") / "fast_plan_probe"
    build = subprocess.run(
        [compiler, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "kernels" / "include"),
         "-I", str(ROOT / "kernels" / "src"), str(PROBE), str(PLANNER), "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, f"{compiler} failed:\n{build.stderr}"

    def run(**settings) -> dict:
        out = subprocess.run([str(exe), *(f"{key}={value}" for key, value in settings.items())],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    return run


def align256(n: int) -> int:
    return (n + 255) // 256 * 256


# ---- the real shape (C=4, H=2560, R=320) on sm_90, decode rows

# Stage 1: 32 CTAs per branch (128 / C; 2560 / 32 = 80 features, a multiple of 16; a weight tile of
# 80 rows x 328 elements = 52480 bytes), 128 CTAs in clusters of 8. Its shared memory for rt rows per
# pass: tile 52480 + A 2*(rt+1)*88 + scale 160 + S 4*rt*80 + part sums 4*8*rt + reduction 4*8*rt*48
# (48 columns per rank: the 41 8-column tiles of 324 columns, 6 per rank) = 52816 + 2064 * rt.
# Stage 2: 160 CTAs of 16 features (C*16 = 64 columns, stride 72; tile 320 x 72 x 2 = 46080): tile +
# A 2*rt*328 + hn 2*rt*64 + g 4*rt*64 + the exchange's mbarrier 8 = 46088 + 1040 * rt.
def stage1_bytes(rt: int) -> int:
    return 52816 + 2064 * rt


def stage2_bytes(rt: int) -> int:
    return 46088 + 1040 * rt


@pytest.mark.parametrize("prologue", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16])
def test_real_shape_decode_rows_take_the_real_shape_kernels(plan, rows, prologue):
    p = plan(rows=rows, prologue=int(prologue))
    assert p["ok"] and p["reason"] == "", p
    # clusters of 8 and the real shape's kernels (stage 1's down weights in registers) at every row count
    assert (p["cluster"], p["use_pdl"], p["real_shape_kernels"]) == (8, True, True)
    assert (p["stage1_ctas"], p["stage2_ctas"]) == (128, 160)
    assert p["stage1_shared_bytes"] == stage1_bytes(rows)
    assert p["stage2_shared_bytes"] == stage2_bytes(rows)
    assert p["shared_memory_bytes"] == stage1_bytes(rows)
    d = p["dims"]
    assert (d["rows"], d["rt"], d["cpb"], d["ks"], d["hs"], d["piece"]) == (rows, rows, 32, 80, 16, 8)
    assert (d["groups"], d["g4"], d["per1"], d["per2"], d["has_prologue"]) == (16, 16, 48, 40, prologue)
    # scratch: fp32 partials [rows][R + C][16 groups], then hn [rows][C * H] in 2-byte elements
    partials = align256(rows * 324 * 16 * 4)
    assert p["scratch"] == {"partials": 0, "hn": partials, "total": partials + rows * 10240 * 2}


# HcFastTuning::stage2_max_ctas: the largest valid stage 2 CTA count up to it.
# 80 CTAs of 32 features: C*32 = 128 columns, stride 136; tile 320 x 136 x 2 = 87040 (over the default
# 64 KiB, within the tuned 128 KiB): tile + A 2*rt*328 + hn 2*rt*128 + g 4*rt*128 + mbarrier 8
# = 87048 + 1424 * rt. The real shape's constant-tiling kernels are for 160 CTAs: the generic ones run.
# A limit above 160 allows more CTAs too (1000: 320 CTAs of 8 features).
@pytest.mark.parametrize("requested,ctas", [(80, 80), (100, 80), (159, 80), (160, 160), (1000, 320), (64, 64)])
def test_stage2_cta_limit_picks_the_largest_tiling_up_to_it(plan, requested, ctas):
    p = plan(rows=1, stage2=requested)
    assert p["ok"], p
    assert p["stage2_ctas"] == ctas and p["dims"]["hs"] == 2560 // ctas and p["dims"]["piece"] == 8
    assert p["real_shape_kernels"] == (ctas == 160)
    if ctas == 80:
        assert p["stage2_shared_bytes"] == 87048 + 1424 * 1
    # stage 1 is untouched
    assert p["stage1_ctas"] == 128 and p["stage1_shared_bytes"] == plan(rows=1)["stage1_shared_bytes"]


def test_stage2_cta_limit_too_low_for_any_tile_is_refused(plan):
    # 16 CTAs (the largest multiple of 8 up to 20 dividing 2560 into multiples of 8) take 160 features:
    # a 320 x 648 x 2 tile, over the tuned 128 KiB
    assert plan(stage2=20) == {"ok": False, "reason": "C=4 H=2560 R=320: no stage 2 tiling (4 or 8 features per CTA, "
                                                     "a weight tile of at most 131072 bytes) with clusters of 8"}


def test_more_than_16_rows_goes_to_the_general_path_unless_forced(plan):
    for rows in (MAX_AUTO_ROWS + 1, 32, 1000):
        assert plan(rows=rows) == {"ok": False, "reason": "more than 16 rows"}
        forced = plan(rows=rows, forced=1)
        assert forced["ok"], forced
        # 16 rows per pass whatever the count: the shared memory of 16 rows, scratch for all of them
        assert forced["dims"]["rt"] == 16 and forced["shared_memory_bytes"] == stage1_bytes(16)
        assert forced["scratch"]["total"] == align256(rows * 324 * 16 * 4) + rows * 10240 * 2
    huge = 2**24 + 1
    assert plan(rows=huge, forced=1)["reason"] == "more than 16777216 rows (the kernels count rows in int)"


def test_zero_rows_plan_needs_no_scratch(plan):
    p = plan(rows=0)
    assert p["ok"] and p["scratch"]["total"] == 0 and p["dims"]["rt"] == 1


@pytest.mark.parametrize("settings,reason", [
    ({"elem": 4}, "the fast path runs float16 and bfloat16 only"),
    ({"elem": 4, "sm": 75, "C": 3}, "the fast path runs float16 and bfloat16 only"),  # the type first
    ({"sm": 75}, "compute capability 7.5 is below 8.0"),
    ({"sm": 75, "C": 3}, "compute capability 7.5 is below 8.0"),
    ({"aligned": 0}, "a tensor is not 16-byte aligned"),
    ({"smem": 48 * 1024}, "it needs 54880 bytes of shared memory per block; the device allows 49152"),
    ({"smem": 48 * 1024, "rows": 16}, "it needs 85840 bytes of shared memory per block; the device allows 49152"),
    ({"H": 0}, "C=4 H=0 R=320: the fast path needs positive C, H and R"),  # validation refuses it first
    ({"C": 3}, "C=3 H=2560 R=320: the fast path needs C a multiple of 4, at most 8"),
    ({"C": 12}, "C=12 H=2560 R=320: the fast path needs C a multiple of 4, at most 8"),
    ({"R": 12}, "C=4 H=2560 R=12: the fast path needs R a multiple of 8, at most 1024"),
    ({"R": 1032}, "C=4 H=2560 R=1032: the fast path needs R a multiple of 8, at most 1024"),
    ({"H": 2576}, "C=4 H=2576 R=320: the fast path needs H a multiple of 32"),
    # R=1024: 80-feature K slices need 80 x 1032 x 2 bytes, more than the 64 KiB tile
    ({"R": 1024}, "C=4 H=2560 R=1024: no stage 1 tiling (K slices of a multiple of 16 features, a weight tile "
                  "of at most 65536 bytes) with clusters of 8"),
    # H=3072: 128 CTAs of 24 features need a 320 x 104 x 2 = 66560-byte tile; fewer CTAs only grow it
    ({"H": 3072}, "C=4 H=3072 R=320: no stage 2 tiling (4 or 8 features per CTA, a weight tile of at most "
                  "65536 bytes) with clusters of 8"),
])
def test_reasons_the_fast_path_cannot_run(plan, settings, reason):
    for forced in (0, 1):  # forcing the path lifts the row limit only
        assert plan(**settings, forced=forced) == {"ok": False, "reason": reason}


def test_a_reason_that_applies_is_reported_before_the_row_limit(plan):
    assert plan(rows=1000, elem=4)["reason"] == "the fast path runs float16 and bfloat16 only"
    assert plan(rows=1000, aligned=0)["reason"] == "a tensor is not 16-byte aligned"


@pytest.mark.parametrize("sm", [80, 86, 89, 100, 120])
def test_other_devices_run_without_clusters_or_pdl(plan, sm):
    """Only sm_90 runs the sm_90 code (clusters, PDL); any other device takes the sm_80 configuration."""
    p = plan(sm=sm, rows=4)
    assert p["ok"], p
    # no clusters, so not the real shape's kernels (compiled for clusters of 8): the generic ones
    assert (p["cluster"], p["use_pdl"], p["real_shape_kernels"]) == (1, False, False)
    d = p["dims"]
    # every stage 1 CTA is its own group and sums all squares and all hidden values itself
    assert (d["cpb"], d["groups"], d["per1"], d["ss_local"], d["ss_parts"], d["hidden_local"]) == (
        32, 128, 328, True, 8, True)


# ---- the tuning knobs (HcFastTuning), each as hc_fast_plan.h documents it


def test_sums_of_squares_local_up_to_ss_local_rows(plan):
    assert [plan(rows=r)["dims"]["ss_local"] for r in (1, 2)] == [True, False]  # default: 1 row
    assert [plan(rows=r)["dims"]["ss_parts"] for r in (1, 2)] == [8, 1]  # all 8 parts, or 8 / cluster
    assert [plan(rows=r, ss_local=4)["dims"]["ss_local"] for r in (4, 5)] == [True, False]


def test_hidden_values_local_up_to_hidden_local_rows(plan):
    assert plan(rows=1)["dims"]["hidden_local"] is False  # default: never
    assert [plan(rows=r, hidden_local=16, forced=1)["dims"]["hidden_local"] for r in (16, 17)] == [True, False]


# ---- the real shape's kernels and how many kernels wait ahead of them

# An H100/H200: 228 KiB of shared memory per SM, 1 KiB of it reserved for each resident block.
H200 = {"smem_sm": 228 * 1024, "smem_reserved": 1024}


def fits(blocks: list[int], sm: int = 228 * 1024, reserved: int = 1024) -> bool:
    return sum(b + reserved for b in blocks) <= sm


@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16])
def test_real_shape_kernels_run_with_one_kernel_ahead(plan, rows):
    """The real shape's constant-tiling kernels take 40 registers, so shared memory alone limits how
    many kernels' CTAs share an SM; the plan pads both stages so that one later kernel's CTA waits next to
    a running one (two fit an SM, three do not), the measured best."""
    p = plan(rows=rows, **H200)
    assert p["ok"] and p["real_shape_kernels"] is True, p
    s1, s2 = p["stage1_shared_bytes"], p["stage2_shared_bytes"]
    # the floor: more than a third of the SM less the reservation (233472 / 3 - 1024 = 76800), in 128 bytes
    assert (s1, s2) == (max(stage1_bytes(rows), 76928), max(stage2_bytes(rows), 76928))
    assert fits([s1, s2]) and fits([s2, s2]) and fits([s1, s1])
    assert not fits([min(s1, s2)] * 3)
    # the tiling and everything else are the unpadded plan's
    unpadded = plan(rows=rows, ahead=0, **H200)
    assert (unpadded["stage1_shared_bytes"], unpadded["stage2_shared_bytes"]) == (stage1_bytes(rows), stage2_bytes(rows))
    for key in ("stage1_shared_bytes", "stage2_shared_bytes", "shared_memory_bytes"):
        p.pop(key), unpadded.pop(key)
    assert p == unpadded


def test_kernels_ahead_sets_the_shared_memory_floor(plan):
    two = plan(rows=1, ahead=2, **H200)  # three fit, four do not: 233472 / 4 - 1024 = 57344, in 128 bytes
    assert (two["stage1_shared_bytes"], two["stage2_shared_bytes"]) == (57472, 57472)
    assert fits([57472] * 3) and not fits([57472] * 4)
    # a floor the stages cannot keep (16 rows of stage 1 do not fit three to an SM) pads nothing
    big = plan(rows=16, ahead=2, **H200)
    assert (big["stage1_shared_bytes"], big["stage2_shared_bytes"]) == (stage1_bytes(16), stage2_bytes(16))


@pytest.mark.parametrize("settings", [
    {"real_shape": 0},          # HCFUSE_FAST_REAL_SHAPE=0: the generic kernels, unpadded
    {"stage2": 80},             # another tiling: the generic kernels
    {"H": 1024},
    {"C": 8, "H": 1024},
    {"R": 256},
])
def test_generic_kernels_are_not_padded(plan, settings):
    p = plan(rows=1, **H200, **settings)
    assert p["ok"] and p["real_shape_kernels"] is False, p
    assert p == plan(rows=1, **settings)  # the device's shared memory figures change nothing


def test_unknown_shared_memory_figures_pad_nothing(plan):
    p = plan(rows=1)  # the probe's default device leaves them 0, as a device that does not report them
    assert p["real_shape_kernels"] is True
    assert (p["stage1_shared_bytes"], p["stage2_shared_bytes"]) == (stage1_bytes(1), stage2_bytes(1))


# ---- the quantized op (HcFastRequest::quant_block_size): 4-bit weights copied into shared memory

# Stage 1: K slices of 64 features (two groups of 32 k), 40 CTAs per branch, 160 in clusters of 8 (20
# partial groups). Its shared memory: the slice's 32 bytes of R + 8 = 328 columns at a stride of 48, a scale
# word and a zero-point word each: 328 * 56 = 18368; A 2*(rt+1)*72 + scale 128 + S 4*rt*64 + part sums
# 4*8*rt + reduction 4*8*rt*48 = 272 + 1968 * rt. Stage 2: 160 CTAs of 16 features as the dense op; up's
# R / 2 = 160 bytes of 64 columns at a stride of 176 = 11264, their scales 2 * 64 * k_blocks and zero points
# 64 * (k_blocks + 1) / 2 (k_blocks = 10 at block_size 32, 3 at 128), each padded to 16 bytes; the second K
# half's sums 4 * (64 / 16) * 2 * 32 * 4 = 4096 + A 2*rt*328 + hn 2*rt*64 + g 4*rt*64 + 8.
QUANT_STAGE2_WEIGHT_BYTES = {32: 11264 + 1280 + 320, 128: 11264 + 384 + 128}


@pytest.mark.parametrize("block_size", [32, 128])
@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16])
def test_quantized_real_shape_plan(plan, rows, block_size):
    p = plan(rows=rows, quant=block_size)
    assert p["ok"] and p["reason"] == "", p
    assert (p["cluster"], p["use_pdl"], p["real_shape_kernels"]) == (8, True, False)
    assert (p["stage1_ctas"], p["stage2_ctas"]) == (160, 160)
    d = p["dims"]
    assert (d["ks"], d["cpb"], d["groups"], d["g4"], d["per1"], d["hs"], d["n2"], d["block_size"]) == (
        64, 40, 20, 20, 48, 16, 64, block_size)
    assert p["stage1_shared_bytes"] == 18368 + 272 + 1968 * rows
    assert p["stage2_shared_bytes"] == QUANT_STAGE2_WEIGHT_BYTES[block_size] + 4104 + 1040 * rows
    assert p["scratch"]["hn"] == align256(rows * 324 * 20 * 4)
    assert p["scratch"]["total"] == p["scratch"]["hn"] + align256(rows * 10240 * 2)


@pytest.mark.parametrize("settings, reason", [
    ({"quant": 16}, "block_size >= 32"),
    ({"R": 336}, "R a multiple of 32"),
    ({"R": 384}, "at most 352"),
    ({"H": 2592}, "H a multiple of 64"),
    ({"C": 8}, "no stage 2 tiling"),  # 128 columns a CTA: two warps a 16-column tile need at most 64
    ({"elem": 4}, "float16 and bfloat16 only"),
    ({"rows": 65}, "more than 64 rows"),
])
def test_quantized_plan_refusals(plan, settings, reason):
    p = plan(**{"quant": 32, **settings})
    assert not p["ok"] and reason in p["reason"], p


def test_quantized_plan_small_shapes_and_forced_rows(plan):
    small = plan(rows=3, C=4, H=128, R=32, quant=32)  # two slices a branch: sums of squares not shared
    assert small["ok"] and (small["stage1_ctas"], small["dims"]["ks"], small["dims"]["ss_local"]) == (8, 64, True)
    assert small["dims"]["n2"] <= 64
    assert plan(rows=40, quant=32, forced=1)["ok"]
    assert plan(rows=1, sm=80, quant=32)["cluster"] == 1
