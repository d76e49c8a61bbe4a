"""Where an onnxruntime-genai folder names hcfuse's library, and whether onnxruntime-genai loads it from
there: a copy inside the folder always; the installed library's absolute path (--link-library) is
outside the folder, which onnxruntime-genai 0.18 and newer refuse, so that run warns."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from hcfuse._library import library_file_name
from hcfuse.cli import EXIT_OK, main
from hcfuse.files import genai_folder
from hcfuse.models.genai_model_folder import save_genai_model_folder


@pytest.fixture
def folder(tmp_path) -> str:
    return save_genai_model_folder(tmp_path / "model", 2, C=4, H=32, R=8, dtype=np.float32)


def _genai_refusal(directory) -> str | None:
    """None when onnxruntime-genai loads the folder, else its error (skips without onnxruntime-genai)."""
    og = pytest.importorskip("onnxruntime_genai")
    try:
        og.Model(og.Config(directory))
    except Exception as e:  # onnxruntime-genai raises RuntimeError or its own types
        return str(e)
    return None


def _genai_version() -> tuple[int, ...]:
    """onnxruntime-genai's version (any of its distributions: CPU, CUDA, DirectML)."""
    import onnxruntime_genai

    return tuple(int(p) for p in onnxruntime_genai.__version__.split(".")[:2])


def test_the_copy_in_the_folder_loads_without_a_warning(folder, tmp_path, hcfuse_lib):
    out = str(tmp_path / "fused")
    with warnings.catch_warnings():
        warnings.simplefilter("error", genai_folder.LibraryLocationWarning)
        result = genai_folder.optimize_folder(folder, out)
    assert result.warnings == [] and result.custom_ops_library == library_file_name()
    assert _genai_refusal(out) is None


def test_link_library_warns_that_onnxruntime_genai_refuses_it(folder, tmp_path, hcfuse_lib):
    out = str(tmp_path / "fused")
    with pytest.warns(genai_folder.LibraryLocationWarning, match="not within an allowed directory") as caught:
        result = genai_folder.optimize_folder(folder, out, copy_library=False)
    assert len(caught) == 1 and result.warnings == [str(caught[0].message)]
    line = result.warnings[0]
    assert "\n" not in line and hcfuse_lib in line and "without --link-library" in line
    refusal = _genai_refusal(out)
    if _genai_version() >= (0, 18):
        assert refusal is not None and "not within an allowed directory" in refusal
    else:
        assert refusal is None


def test_cli_link_library_prints_the_warning(folder, tmp_path, capsys, hcfuse_lib):
    out = str(tmp_path / "fused")
    with warnings.catch_warnings():
        warnings.simplefilter("error", genai_folder.LibraryLocationWarning)  # the CLI prints it, once
        assert main(["optimize", folder, "-o", out, "--link-library"]) == EXIT_OK
    assert os.path.isfile(os.path.join(out, genai_folder.CONFIG_NAME))
    assert capsys.readouterr().err.count("hcfuse: warning: ") == 1
