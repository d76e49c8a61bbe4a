"""The gate epilogue's sigmoids (HcGateEpilogueKernel, kernels/src/cuda/general/hc_general.cu) against Sigmoid, for every
16-bit input: tests/kernels/cuda/sigmoid_in_range_check.cu built with nvcc for the device and run (skipped without nvcc or
a GPU).
- SigmoidInRange (hc_common.cuh), without the IEEE division's slow-path branch, gives Sigmoid's bits for every
  float16 and bfloat16 input in its range. Measured on an H200: 53618 float16 and 49712 bfloat16 inputs in range,
  0 mismatches.
- The bfloat16 sigmoid table (hc_sigmoid_table.cuh) gives RoundToT(Sigmoid(x)) for every bfloat16 x but NaN (65282
  inputs)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests._cuda import compute_capability

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[2]


def test_epilogue_sigmoids_are_sigmoid_bitwise(tmp_path):
    major, minor = compute_capability()
    if major < 8:
        pytest.skip(f"needs a CUDA device of compute capability 8.0+; found {(major, minor)}")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    exe = tmp_path / "sigmoid_check"
    subprocess.run([nvcc, "-O3", "-std=c++17", f"-arch=sm_{major}{minor}", "-I", str(ROOT / "kernels" / "src"),
                    str(ROOT / "tests" / "kernels" / "cuda" / "sigmoid_in_range_check.cu"), "-o", str(exe)],
                   check=True, capture_output=True, text=True, timeout=300)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split(":")[0]: line for line in result.stdout.splitlines()}
    for name in ("float16", "bfloat16"):
        assert lines.get(name, "").endswith(", 0 mismatches"), result.stdout
    assert lines.get("bfloat16 table", "") == "bfloat16 table: 65282 inputs in range, 0 mismatches", result.stdout
