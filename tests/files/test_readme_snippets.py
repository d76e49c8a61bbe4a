"""The README's Python snippets (Quick start, Where hcfuse plugs in) run as written, in a folder holding the
model.onnx they name (a small decode model) and its fused model.fused.onnx. Only from a checkout: an installed
run's copy of tests/ has no README; a snippet whose optional package is missing is skipped."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import onnx
import pytest

import hcfuse
from hcfuse.models.qwen_decode import make_decode_model

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
SECTIONS = ("## Quick start", "## Where hcfuse plugs in")
OPTIONAL = {"onnx_shape_inference": "onnx-shape-inference", "olive": "olive-ai"}


def _snippets() -> list[str]:
    if not README.exists():
        return []
    text = README.read_text()
    out = []
    for title in SECTIONS:
        start = text.index(title)
        end = text.find("\n## ", start + len(title))
        out += re.findall(r"```python\n(.*?)```", text[start:end if end != -1 else None], re.S)
    return out


SNIPPETS = _snippets()


def test_the_readme_has_snippets():
    if not README.exists():
        pytest.skip("no README.md beside tests/ (an installed run)")
    assert len(SNIPPETS) >= 4


@pytest.mark.filterwarnings("ignore:Specified provider .CUDAExecutionProvider. is not in available")
@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_snippet_runs(code, tmp_path, monkeypatch):
    for module, package in OPTIONAL.items():
        if re.search(rf"^\s*import {module}\b|^\s*import [\w., ]*\b{module}\b", code, re.M) and \
                importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {package}")
    monkeypatch.chdir(tmp_path)
    model = make_decode_model(2, C=4, H=32, R=8)
    onnx.save(model, "model.onnx")
    onnx.save(hcfuse.optimize(model), "model.fused.onnx")
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_snippet"})
