"""onnxruntime-genai model folders (hcfuse.files.genai_folder, `hcfuse optimize|unfuse MODEL_DIR -o OUT_DIR`), on a
folder shaped like the genai model builder's output (hcfuse.models.genai_model_folder)."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

import hcfuse
from hcfuse import _op
from hcfuse.files import genai_folder, model_io
from hcfuse.files.folder_commit import MANIFEST
from hcfuse._library import library_file_name
from hcfuse.checking._session import inference_session
from hcfuse.cli import EXIT_ERROR, EXIT_OK, main
from hcfuse.models.genai_model_folder import MODEL_FILE, save_genai_model_folder
from hcfuse.checking.verification import verify

BLOCKS = 3
SHAPE = dict(C=4, H=32, R=8, dtype=np.float16)  # weights above the external-data threshold


def tree(directory) -> dict[str, str]:
    """name -> sha256 of every file below directory."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def config(directory) -> dict:
    with open(os.path.join(directory, genai_folder.CONFIG_NAME)) as f:
        return json.load(f)


def fused_count(path) -> int:
    return sum(node.op_type == _op.OP_TYPE for node in model_io.load(path).graph)


@pytest.fixture
def folder(tmp_path) -> str:
    return save_genai_model_folder(tmp_path / "model", BLOCKS, **SHAPE)


def test_builder_shaped_folder(folder):
    assert sorted(tree(folder)) == sorted(["genai_config.json", "model.onnx", "model.onnx.data",
                                           "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"])
    decoder = config(folder)["model"]["decoder"]
    assert decoder["filename"] == MODEL_FILE and decoder["session_options"]["log_id"] == "onnxruntime-genai"
    assert model_io.external_data_paths(model_io.load(os.path.join(folder, MODEL_FILE))) == {
        os.path.join(folder, "model.onnx.data")}


def test_optimize_folder(folder, tmp_path, hcfuse_lib):
    before = tree(folder)
    out = str(tmp_path / "fused")
    result = genai_folder.optimize_folder(folder, out)
    assert tree(folder) == before, "the input folder was modified"
    written = tree(out)
    assert sorted(written) == sorted([*before, library_file_name(), MANIFEST])
    for name in ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"):
        assert written[name] == before[name]
    assert written[library_file_name()] == tree(os.path.dirname(hcfuse_lib))[os.path.basename(hcfuse_lib)]
    expected = config(folder)
    expected["model"]["decoder"]["session_options"]["custom_ops_library"] = library_file_name()
    assert config(out) == expected
    assert result.custom_ops_library == library_file_name() and result.pipeline.output.endswith("model.onnx")
    assert fused_count(os.path.join(out, MODEL_FILE)) == BLOCKS
    # the library as the config names it, resolved against the folder as onnxruntime-genai does
    library = os.path.join(out, config(out)["model"]["decoder"]["session_options"]["custom_ops_library"])
    inference_session(os.path.join(out, MODEL_FILE), library=library)
    check = verify(os.path.join(folder, MODEL_FILE), os.path.join(out, MODEL_FILE), providers=["CPUExecutionProvider"])
    assert check.passed, check.summary()


def test_unfuse_folder_reverses_optimize(folder, tmp_path, hcfuse_lib):
    fused, back = str(tmp_path / "fused"), str(tmp_path / "back")
    genai_folder.optimize_folder(folder, fused)
    result = genai_folder.unfuse_folder(fused, back)
    assert sorted(tree(back)) == sorted([*tree(folder), MANIFEST])  # no library copy
    assert config(back) == config(folder)  # no custom_ops_library
    assert result.custom_ops_library is None
    assert fused_count(os.path.join(back, MODEL_FILE)) == 0
    stock = inference_session(os.path.join(back, MODEL_FILE), library=False)  # runs without hcfuse
    assert [o.name for o in stock.get_outputs()] == [o.name for o in model_io.load(
        os.path.join(folder, MODEL_FILE)).graph.outputs]


def test_link_library_names_the_installed_library(folder, tmp_path, hcfuse_lib):
    out = str(tmp_path / "fused")
    with pytest.warns(genai_folder.LibraryLocationWarning, match="not within an allowed directory"):
        genai_folder.optimize_folder(folder, out, copy_library=False)
    assert config(out)["model"]["decoder"]["session_options"]["custom_ops_library"] == hcfuse.get_library_path()
    assert library_file_name() not in tree(out)


def test_cli_folder_round_trip(folder, tmp_path, capsys, hcfuse_lib):
    fused, back = str(tmp_path / "fused"), str(tmp_path / "back")
    assert main(["optimize", folder, "-o", fused, "--verify"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"fused {BLOCKS} block(s)" in out and "PASSED" in out
    assert f"custom_ops_library: {library_file_name()}" in out
    assert main(["unfuse", fused, "-o", back]) == EXIT_OK
    assert "custom_ops_library: (none)" in capsys.readouterr().out
    assert config(back) == config(folder) and fused_count(os.path.join(back, MODEL_FILE)) == 0


def _edit_config(directory, edit) -> None:
    data = config(directory)
    edit(data)
    with open(os.path.join(directory, genai_folder.CONFIG_NAME), "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize("case, message", [
    ("no config", "no genai_config.json"),
    ("bad json", "not valid JSON"),
    ("missing model", "is not in"),
    ("pipeline", "model.decoder.pipeline"),
    ("other library", "already names 'libother_ops.so'"),
    ("inside input", "inside it"),
])
def test_bad_folders_are_refused(folder, tmp_path, capsys, case, message):
    out = str(tmp_path / "out")
    if case == "no config":
        os.remove(os.path.join(folder, genai_folder.CONFIG_NAME))
    elif case == "bad json":
        with open(os.path.join(folder, genai_folder.CONFIG_NAME), "w") as f:
            f.write("{not json")
    elif case == "missing model":
        _edit_config(folder, lambda c: c["model"]["decoder"].update(filename="absent.onnx"))
    elif case == "pipeline":
        _edit_config(folder, lambda c: c["model"]["decoder"].update(pipeline=[]))
    elif case == "other library":
        _edit_config(folder, lambda c: c["model"]["decoder"]["session_options"].update(
            custom_ops_library="libother_ops.so"))
    elif case == "inside input":
        out = os.path.join(folder, "fused")
    before = tree(folder)
    assert main(["optimize", folder, "-o", out]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert tree(folder) == before and not os.path.exists(out)


def test_onnxruntime_genai_loads_the_written_folder(folder, tmp_path, hcfuse_lib):
    """onnxruntime-genai creates the decoder's session from OUT_DIR/genai_config.json: with the library
    the config names it loads; without that option the fused node has no kernel."""
    og = pytest.importorskip("onnxruntime_genai")
    out = str(tmp_path / "fused")
    genai_folder.optimize_folder(folder, out)
    og.Model(og.Config(out))
    _edit_config(out, lambda c: c["model"]["decoder"]["session_options"].pop("custom_ops_library"))
    with pytest.raises(Exception, match=f"(implementation|kernel) for .*{_op.OP_TYPE}|{_op.OP_TYPE}\\(-1\\) is not a registered"):
        og.Model(og.Config(out))
    back = str(tmp_path / "back")
    genai_folder.unfuse_folder(out, back)
    og.Model(og.Config(back))


def test_fused_folder_keeps_external_data_and_modes(folder, tmp_path, hcfuse_lib):
    """The fused decoder keeps its weights in OUT_DIR/model.onnx.data (nothing read from MODEL_DIR); every
    file keeps its permissions (the config written through a temporary file too)."""
    os.chmod(os.path.join(folder, genai_folder.CONFIG_NAME), 0o644)
    out = str(tmp_path / "fused")
    genai_folder.optimize_folder(folder, out)
    model = model_io.load(os.path.join(out, MODEL_FILE))
    assert model_io.external_data_paths(model) == {os.path.join(out, "model.onnx.data")}
    for name in os.listdir(folder):
        if name != MODEL_FILE + ".data":
            assert os.stat(os.path.join(out, name)).st_mode == os.stat(os.path.join(folder, name)).st_mode, name
