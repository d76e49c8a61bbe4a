"""What a folder run reads and copies: the fused decoder's files are never replaced by copies, other
models keep the bytes they read, links and odd entries follow one rule checked before writing, every
file of MODEL_DIR is an input (links resolved), an existing OUT_DIR is never written through a link,
unfuse drops hcfuse's library however it is named, and genai_config.json problems are one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import onnx_ir as ir
import pytest

from hcfuse._library import library_file_name
from hcfuse.checking._session import inference_session
from hcfuse.cli import EXIT_ERROR, EXIT_OK, main
from hcfuse.files import genai_folder, model_io
from hcfuse.files.folder_commit import MANIFEST
from hcfuse.models.genai_model_folder import MODEL_FILE, save_genai_model_folder

SHAPE = dict(C=4, H=32, R=8, dtype=np.float16)


def tree(directory) -> dict[str, str]:
    """relative path -> sha256 of each regular file below directory; other entries by their kind."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if os.path.islink(path):
                out[rel] = "link -> " + os.readlink(path)
            elif not os.path.isfile(path):
                out[rel] = "special"
            else:
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def outputs(path: str, library: str | bool = False) -> list[np.ndarray]:
    session = inference_session(path, library=library)
    rng = np.random.default_rng(3)
    feeds = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else 2 for d in i.shape]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float16 if "float16" in i.type else np.float32)
    return session.run(None, feeds)


def cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def edit_config(folder, edit) -> None:
    path = os.path.join(folder, genai_folder.CONFIG_NAME)
    with open(path) as f:
        data = json.load(f)
    edit(data)
    with open(path, "w") as f:
        json.dump(data, f)


@pytest.fixture
def folder(tmp_path) -> str:
    return save_genai_model_folder(tmp_path / "model", 2, **SHAPE)


def resave_decoder(folder: str, data_name: str) -> None:
    """The decoder with its weights in data_name instead of model.onnx.data (which is removed)."""
    path = os.path.join(folder, MODEL_FILE)
    model = model_io.load(path)
    for value in model.graph.initializers.values():  # read now: the file is rewritten below
        value.const_value = ir.tensor(value.const_value.numpy(), name=value.name)
    ir.save(model, path, external_data=data_name, size_threshold_bytes=1024)
    os.remove(os.path.join(folder, "model.onnx.data"))


def refused(capsys, folder, out, message, *extra) -> None:
    before = tree(folder)
    code, err = cli(capsys, "optimize", folder, "-o", str(out), *extra)
    assert code == EXIT_ERROR and message in err and err.count("\n") == 1, err
    assert tree(folder) == before


# ---- the fused decoder's files, and other models ----------------------------------------------------


def test_a_stale_data_file_never_replaces_the_fused_weights(folder, tmp_path, capsys):
    """The decoder reads model.onnx_data; an older model.onnx.data beside it would have been copied
    over the fused decoder's own data file."""
    stale = open(os.path.join(folder, "model.onnx.data"), "rb").read()
    resave_decoder(folder, "model.onnx_data")
    with open(os.path.join(folder, "model.onnx.data"), "wb") as f:
        f.write(stale)
    refused(capsys, folder, tmp_path / "out", "the decoder does not read it", "--verify")
    assert not os.path.exists(tmp_path / "out")
    os.remove(os.path.join(folder, "model.onnx.data"))  # without it: fused, and the right weights
    assert main(["optimize", folder, "-o", str(tmp_path / "out"), "--verify"]) == EXIT_OK
    assert "model.onnx_data" not in tree(tmp_path / "out")


def test_a_model_sharing_the_decoders_data_file_is_refused(folder, tmp_path, capsys):
    shutil.copy(os.path.join(folder, MODEL_FILE), os.path.join(folder, "embed.onnx"))  # reads model.onnx.data
    refused(capsys, folder, tmp_path / "out", "give embed.onnx a data file of its own")
    assert not os.path.exists(tmp_path / "out")


def test_a_model_sharing_another_data_file_keeps_its_bytes(folder, tmp_path, capsys, hcfuse_lib):
    resave_decoder(folder, "shared.data")
    shutil.copy(os.path.join(folder, MODEL_FILE), os.path.join(folder, "other.onnx"))  # reads shared.data
    expected = outputs(os.path.join(folder, "other.onnx"))
    out = tmp_path / "out"
    assert main(["optimize", folder, "-o", str(out)]) == EXIT_OK
    written = tree(out)
    assert written["shared.data"] == tree(folder)["shared.data"] and "model.onnx.data" in written
    for got, want in zip(outputs(str(out / "other.onnx")), expected):
        np.testing.assert_array_equal(got, want)
    outputs(str(out / MODEL_FILE), hcfuse_lib)


# ---- entries that are not regular files ------------------------------------------------------------


@pytest.mark.parametrize("case, message", [
    ("dangling link", "dangles or loops"),
    ("looping link", "dangles or loops"),
    ("link out of the folder", "outside the model folder"),
    ("link to a folder", "a symbolic link to a folder"),
    ("directory loop", "a symbolic link to a folder"),
    ("fifo", "not a regular file"),
])
def test_entries_outside_the_rule_are_refused_before_writing(case, message, folder, tmp_path, capsys):
    sub = os.path.join(folder, "sub")
    os.mkdir(sub)
    outside = tmp_path / "secret.txt"
    outside.write_text("not the model's")
    {
        "dangling link": lambda: os.symlink("absent.json", os.path.join(sub, "x.json")),
        "looping link": lambda: (os.symlink("b", os.path.join(sub, "a")), os.symlink("a", os.path.join(sub, "b"))),
        "link out of the folder": lambda: os.symlink(outside, os.path.join(sub, "x.txt")),
        "link to a folder": lambda: os.symlink(sub, os.path.join(folder, "alias")),
        "directory loop": lambda: os.symlink("..", os.path.join(sub, "up")),
        "fifo": lambda: os.mkfifo(os.path.join(sub, "pipe")),
    }[case]()
    previous = tmp_path / "out"
    assert main(["optimize", save_genai_model_folder(tmp_path / "other", 2, **SHAPE), "-o", str(previous)]) == EXIT_OK
    capsys.readouterr()
    before = tree(previous)
    refused(capsys, folder, previous, message)
    assert tree(previous) == before and sorted(os.listdir(tmp_path)) == ["model", "other", "out", "secret.txt"]


def test_a_link_to_a_file_inside_is_copied_as_a_file(folder, tmp_path):
    os.symlink("tokenizer.json", os.path.join(folder, "vocab.json"))
    genai_folder.optimize_folder(folder, tmp_path / "out")
    copy = tmp_path / "out" / "vocab.json"
    assert not os.path.islink(copy) and copy.read_bytes() == open(os.path.join(folder, "tokenizer.json"), "rb").read()


def test_a_killed_runs_temporary_in_the_folder_is_not_copied(folder, tmp_path):
    leftover = os.path.join(folder, "sub", ".hcfuse-0123abcd-1-1-0123abcd")
    os.makedirs(leftover)
    with open(os.path.join(leftover, "model.onnx.data"), "wb") as f:
        f.write(b"partial")
    fused, back = tmp_path / "fused", tmp_path / "back"
    genai_folder.optimize_folder(folder, fused)
    genai_folder.unfuse_folder(fused, back)
    for out in (fused, back):
        assert not any(".hcfuse-0123abcd" in name for name in tree(out)), tree(out)


# ---- inputs, resolved ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["genai_config.json", "tokenizer.json", "new_report.json"])
def test_a_report_inside_model_dir_is_refused(name, folder, tmp_path, capsys):
    refused(capsys, folder, tmp_path / "out", "into MODEL_DIR", "--report", os.path.join(folder, name))
    assert not os.path.exists(tmp_path / "out")


def test_out_dir_through_a_link_into_model_dir_is_refused(folder, tmp_path, capsys):
    os.symlink(folder, tmp_path / "alias")
    refused(capsys, folder, tmp_path / "alias" / "fused", "inside it (links resolved)")
    assert sorted(os.listdir(folder)) == sorted(tree(folder))  # no nested copy


def test_model_dir_inside_out_dir_is_refused(tmp_path, capsys):
    """OUT_DIR/model is MODEL_DIR, and it has a subfolder named 'model': nothing may be written."""
    out = tmp_path / "out"
    folder = save_genai_model_folder(out / "model", 2, **SHAPE)
    os.makedirs(os.path.join(folder, "model"))
    with open(os.path.join(folder, "model", "genai_config.json"), "w") as f:
        f.write("{}")
    refused(capsys, folder, out, "holds")


def test_an_existing_out_dir_is_never_written_through_a_link(folder, tmp_path, capsys):
    """An earlier OUT_DIR whose subfolder became a link to a user's folder: the user's file stays, and
    OUT_DIR given as a link is refused too."""
    os.makedirs(os.path.join(folder, "sub"))
    with open(os.path.join(folder, "sub", "notes.txt"), "w") as f:
        f.write("model's")
    out = tmp_path / "out"
    genai_folder.optimize_folder(folder, out)
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("the user's")
    shutil.rmtree(out / "sub")
    os.symlink(users, out / "sub")
    refused(capsys, folder, out, "holds files hcfuse did not write (sub)")
    assert (users / "notes.txt").read_text() == "the user's" and os.path.islink(out / "sub")
    os.symlink(users, tmp_path / "out_link")
    refused(capsys, folder, tmp_path / "out_link", "is a symbolic link")
    assert sorted(os.listdir(users)) == ["notes.txt"]


def test_a_folder_of_the_users_files_is_not_replaced(folder, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    refused(capsys, folder, out, "holds files hcfuse did not write (thesis.tex)")
    assert sorted(os.listdir(out)) == ["thesis.tex"]


def test_rerunning_into_the_same_out_dir_replaces_it(folder, tmp_path):
    out = tmp_path / "out"
    genai_folder.optimize_folder(folder, out)
    first = tree(out)
    os.remove(os.path.join(folder, "special_tokens_map.json"))
    genai_folder.optimize_folder(folder, out)
    assert sorted(tree(out)) == sorted(set(first) - {"special_tokens_map.json"})


def test_hard_linked_input_data_is_accepted(folder, tmp_path, capsys):
    """onnxruntime loads a model whose data file has a second hard link; so does hcfuse."""
    os.link(os.path.join(folder, "model.onnx.data"), tmp_path / "backup.data")
    assert main(["optimize", os.path.join(folder, MODEL_FILE), "-o", str(tmp_path / "o.onnx")]) == EXIT_OK
    assert main(["optimize", folder, "-o", str(tmp_path / "out")]) == EXIT_OK


# ---- unfuse and hcfuse's library ------------------------------------------------------------------------


@pytest.mark.parametrize("naming", ["absolute", "subfolder", "option deleted", "no manifest"])
def test_unfuse_removes_hcfuses_library_however_named(naming, folder, tmp_path):
    fused, back = tmp_path / "fused", tmp_path / "back"
    genai_folder.optimize_folder(folder, fused)
    library = fused / library_file_name()
    if naming == "absolute":
        os.rename(library, fused / "ops_abs.so")
        edit_config(fused, lambda c: c["model"]["decoder"]["session_options"].update(
            custom_ops_library=str(fused / "ops_abs.so")))
    elif naming == "subfolder":
        (fused / "lib").mkdir()
        os.rename(library, fused / "lib" / "ops.so")
        edit_config(fused, lambda c: c["model"]["decoder"]["session_options"].update(custom_ops_library="lib/ops.so"))
    elif naming == "option deleted":
        edit_config(fused, lambda c: c["model"]["decoder"]["session_options"].pop("custom_ops_library"))
    else:
        os.rename(library, fused / "ops_copy.so")
        os.remove(fused / MANIFEST)
        edit_config(fused, lambda c: c["model"]["decoder"]["session_options"].update(custom_ops_library="ops_copy.so"))
    result = genai_folder.unfuse_folder(fused, back)
    assert not any(name.endswith(".so") for name in tree(back)), sorted(tree(back))
    assert "custom_ops_library" not in json.load(open(back / "genai_config.json"))["model"]["decoder"]["session_options"]
    assert result.custom_ops_library is None


def test_unfuse_keeps_a_users_own_library(folder, tmp_path, capsys):
    fused, back = tmp_path / "fused", tmp_path / "back"
    genai_folder.optimize_folder(folder, fused)
    os.remove(fused / library_file_name())
    (fused / "libmine.so").write_bytes(b"the user's own kernels")
    edit_config(fused, lambda c: c["model"]["decoder"]["session_options"].update(custom_ops_library="libmine.so"))
    genai_folder.unfuse_folder(fused, back)
    assert (back / "libmine.so").read_bytes() == b"the user's own kernels"
    options = json.load(open(back / "genai_config.json"))["model"]["decoder"]["session_options"]
    assert options["custom_ops_library"] == "libmine.so"


# ---- genai_config.json problems: one line each ------------------------------------------------------------


@pytest.mark.parametrize("case, message", [
    ("model is an array", "model must be a JSON object; got a JSON array"),
    ("model is null", "model must be a JSON object; got nothing"),
    ("decoder is a string", "model.decoder must be a JSON object; got a JSON string"),
    ("file is an array", "the file must be a JSON object"),
    ("deeply nested", "nested too deeply"),
    ("decoder is a json file", "not an ONNX model"),
    ("decoder is the config", "names genai_config.json itself"),
    ("session_options is a list", "session_options must be an object"),
])
@pytest.mark.parametrize("command", ["optimize", "unfuse"])
def test_config_problems_are_one_line(command, case, message, folder, tmp_path, capsys):
    path = os.path.join(folder, genai_folder.CONFIG_NAME)
    if case == "model is an array":
        edit_config(folder, lambda c: c.update(model=[]))
    elif case == "model is null":
        edit_config(folder, lambda c: c.update(model=None))
    elif case == "decoder is a string":
        edit_config(folder, lambda c: c["model"].update(decoder="model.onnx"))
    elif case == "file is an array":
        with open(path, "w") as f:
            f.write("[1, 2]")
    elif case == "deeply nested":
        with open(path, "w") as f:
            f.write("[" * 100000 + "]" * 100000)
    elif case == "decoder is a json file":
        edit_config(folder, lambda c: c["model"]["decoder"].update(filename="tokenizer.json"))
    elif case == "decoder is the config":
        edit_config(folder, lambda c: c["model"]["decoder"].update(filename="genai_config.json"))
    else:
        edit_config(folder, lambda c: c["model"]["decoder"].update(session_options=[]))
    before = tree(folder)
    code, err = cli(capsys, command, folder, "-o", str(tmp_path / "out"))
    assert code == EXIT_ERROR and message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert tree(folder) == before and not os.path.exists(tmp_path / "out")
    with pytest.raises(ValueError, match=message.split(";")[0]):
        (genai_folder.optimize_folder if command == "optimize" else genai_folder.unfuse_folder)(folder, tmp_path / "o2")


def test_without_rename_exchange_the_folder_is_swapped_by_renames(folder, tmp_path, monkeypatch):
    """On a filesystem without RENAME_EXCHANGE the previous folder goes aside, the new one in."""
    from hcfuse.files import folder_commit

    out = tmp_path / "out"
    genai_folder.optimize_folder(folder, out)
    first = tree(out)
    monkeypatch.setattr(folder_commit, "_exchange", lambda a, b: False)
    os.remove(os.path.join(folder, "special_tokens_map.json"))
    genai_folder.optimize_folder(folder, out)
    assert sorted(tree(out)) == sorted(set(first) - {"special_tokens_map.json"})
    assert sorted(os.listdir(tmp_path)) == ["model", "out"]
