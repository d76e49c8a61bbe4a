"""What the dependency floors in pyproject.toml guard against, each in a process of its own so that a release
below a floor fails here with its version named instead of crashing or hanging the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import onnx
import onnx_ir as ir


def _run(code: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


def test_a_process_that_imports_hcfuse_exits_cleanly():
    """onnx 1.17-1.19 fail the import (no OpSchema.NodeDeterminism); 1.20-1.22 crash at exit (SIGSEGV) once a
    schema was registered from Python, as `import hcfuse` does."""
    result = _run("import hcfuse", timeout=120)
    assert result.returncode == 0, f"onnx {onnx.__version__}: exit status {result.returncode}: {result.stderr[-800:]}"


def test_saving_beside_a_truncated_external_data_file_fails_instead_of_looping(tmp_path):
    """Before onnx-ir 1.0, copying an external tensor whose file is shorter than the tensor looped forever
    (a failing save, as the file pipeline meets it, never returned)."""
    (tmp_path / "w.data").write_bytes(b"\0" * 8)
    code = f"""
        import onnx_ir as ir
        weight = ir.ExternalTensor("w.data", offset=0, length=16, dtype=ir.DataType.FLOAT, shape=ir.Shape([4]),
                                   name="w", base_dir={str(tmp_path)!r})
        w = ir.Value(name="w", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([4]), const_value=weight)
        y = ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([4]))
        graph = ir.Graph([], [y], nodes=[ir.Node("", "Identity", [w], outputs=[y])], initializers=[w],
                         opset_imports={{"": 21}})
        try:
            ir.save(ir.Model(graph, ir_version=10), {str(tmp_path / "out.onnx")!r}, external_data="out.data",
                    size_threshold_bytes=0)
        except OSError as e:
            print("raised:", e)
    """
    try:
        result = _run(code, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"onnx-ir {ir.__version__}: saving beside a truncated data file did not return") from None
    assert result.returncode == 0, result.stderr[-800:]
    assert result.stdout.startswith("raised:") and "w.data" in result.stdout, result.stdout
