"""The quantized op's CPU kernel gives the same bits on every instruction set it is compiled for.

onnxruntime sessions test the kernel against hcfuse.reference_nbits bit for bit, but only on the instruction set
this CPU picks (hc_cpu_isa.inc: AVX-512, else AVX2 + FMA, else plain x86-64). Here kernels/src/cpu/hc_nbits_cpu.cc
is compiled once per instruction set (HCFUSE_CPU_ISA) with tests/kernels/cpp/nbits_isa_probe.cc, which runs
every form (bits, block sizes, zero points, dense or quantized projections, the prologue, 1-70 rows) on fixed
pseudo-random inputs and prints a hash of each call's outputs: every instruction set this CPU runs must print
the same lines as plain x86-64 (so the same bits as the reference, which the picked one matches).
"""

from __future__ import annotations

import pathlib
import platform
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNEL = ROOT / "kernels" / "src" / "cpu" / "hc_nbits_cpu.cc"
PROBE = pathlib.Path(__file__).resolve().parent / "cpp" / "nbits_isa_probe.cc"
ISAS = ("generic", "avx2", "avx512")
SKIPPED = 77  # the probe's exit status where this CPU cannot run its instruction set


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, list[str]]:
    """Instruction set -> the probe's lines, for those this CPU runs."""
    compiler = shutil.which("g++")
    if compiler is None or platform.machine() != "x86_64":
        pytest.skip("the instruction-set variants are built by GCC on x86-64 only")
    if not KERNEL.is_file():
        pytest.skip(f"the kernels' sources are not beside tests/ (no {KERNEL.relative_to(ROOT)}): "
                    "a copy of tests/ run against an installed wheel")
    tmp = tmp_path_factory.mktemp("nbits_isa")
    builds = {}
    for isa in ISAS:  # the library's flags that matter to the bits: -ffp-contract=off (kernels/CMakeLists.txt)
        cmd = [compiler, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
               "-I", str(ROOT / "kernels" / "include"), "-I", str(ROOT / "kernels" / "src"),
               f"-DHCFUSE_CPU_ISA={isa}", f'-DHCFUSE_CPU_ISA_NAME="{isa}"', str(PROBE), str(KERNEL),
               "-o", str(tmp / isa)]
        builds[isa] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = {}
    for isa, build in builds.items():
        _, err = build.communicate()
        assert build.returncode == 0, f"{compiler} failed for {isa}:\n{err}"
        run = subprocess.run([str(tmp / isa)], capture_output=True, text=True)
        if run.returncode == SKIPPED:
            continue
        assert run.returncode == 0, f"the {isa} probe failed ({run.returncode}):\n{run.stderr}"
        lines[isa] = run.stdout.splitlines()
    return lines


def test_the_probe_covers_distinct_cases(outputs):
    """Every case gives its own hash (outputs that were never written would repeat)."""
    hashes = [line.rsplit(" ", 1)[1] for line in outputs["generic"]]
    assert len(hashes) == 84 and len(set(hashes)) == len(hashes)


@pytest.mark.parametrize("isa", ISAS[1:])
def test_instruction_sets_give_the_same_bits(outputs, isa):
    if isa not in outputs:
        pytest.skip(f"this CPU does not run {isa}")
    for generic, got in zip(outputs["generic"], outputs[isa], strict=True):
        assert got == generic, f"{isa} differs from plain x86-64: {got}"
