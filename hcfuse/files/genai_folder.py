"""onnxruntime-genai model folders: fuse (or unfuse) the decoder of a folder holding genai_config.json.

A folder as onnxruntime-genai's model builder writes it holds the decoder model (genai_config.json's
model.decoder.filename, e.g. model.onnx with model.onnx.data), genai_config.json and the tokenizer
files. `optimize_folder(MODEL_DIR, OUT_DIR)` writes the fused decoder into OUT_DIR under the same file
name, beside a copy of every other file, and sets model.decoder.session_options.custom_ops_library in
OUT_DIR/genai_config.json to hcfuse's custom-op library: by default a copy of the library in OUT_DIR
named by a relative path (onnxruntime-genai resolves it against the folder and, since 0.18, refuses a
library outside it), or with copy_library=False the installed library's absolute path.
`unfuse_folder` does the reverse: the stock decoder, no hcfuse library, no custom_ops_library naming it.

MODEL_DIR is never modified. Models go through the single-file pipeline of `hcfuse optimize` /
`hcfuse unfuse` (atomic output, weights never loaded to fuse); every other file (one by one) and
genai_config.json, written last, are written atomically too, so OUT_DIR never holds a config that names
a library or model not yet there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

from hcfuse.files import model_io, temporaries
from hcfuse._library import get_library_path, library_file_name
from hcfuse.files.pipeline import FileResult, optimize_file, unfuse_file

CONFIG_NAME = "genai_config.json"


@dataclasses.dataclass
class FolderResult:
    """What optimize_folder / unfuse_folder wrote into out_dir."""

    model: str  # the decoder model written (its external data beside it)
    config: str  # out_dir/genai_config.json
    custom_ops_library: str | None  # the session option written (None: not set)
    copied: list[str]  # the folder's other files, copied
    pipeline: FileResult  # what hcfuse.files.pipeline's optimize_file / unfuse_file returned


# --- the folder


class _Folder:
    """MODEL_DIR's genai_config.json and the decoder file it names, checked."""

    def __init__(self, model_dir: str | os.PathLike, out_dir: str | os.PathLike):
        self.dir = os.path.abspath(os.fspath(model_dir))
        self.out = os.path.abspath(os.fspath(out_dir))
        config_path = os.path.join(self.dir, CONFIG_NAME)
        if not os.path.isdir(self.dir):
            raise model_io.ModelIOError(f"{model_dir}: not a directory")
        if not os.path.isfile(config_path):
            raise model_io.ModelIOError(f"{model_dir}: no {CONFIG_NAME} (not an onnxruntime-genai model folder)")
        if os.path.commonpath([self.dir, self.out]) == self.dir:
            raise model_io.ModelIOError(f"{out_dir}: is {model_dir} or inside it; write the folder to a new path")
        try:
            with open(config_path, encoding="utf-8") as f:
                self.config = json.load(f)
        except (ValueError, UnicodeDecodeError) as e:
            raise model_io.ModelIOError(f"{config_path}: not valid JSON ({e})") from e
        decoder = self.config.get("model", {}).get("decoder") if isinstance(self.config, dict) else None
        if not isinstance(decoder, dict):
            raise model_io.ModelIOError(f"{config_path}: no model.decoder section")
        if "pipeline" in decoder:
            raise model_io.ModelIOError(f"{config_path}: model.decoder.pipeline (a multi-model decoder) is not "
                                        "supported; fuse its model files one by one with `hcfuse optimize`")
        filename = decoder.get("filename")
        if not isinstance(filename, str) or not filename or os.path.basename(filename) != filename:
            raise model_io.ModelIOError(f"{config_path}: model.decoder.filename must name a file in the folder; "
                                        f"got {filename!r}")
        self.decoder = decoder
        self.model = os.path.join(self.dir, filename)
        if not os.path.isfile(self.model):
            raise model_io.ModelIOError(f"{config_path}: model.decoder.filename {filename!r} is not in {model_dir}")
        self.options = decoder.setdefault("session_options", {})
        if not isinstance(self.options, dict):
            raise model_io.ModelIOError(f"{config_path}: model.decoder.session_options must be an object")

    def model_files(self) -> set[str]:
        """The decoder model and the external data files it reads (rewritten, not copied)."""
        return {self.model, *model_io.external_data_paths(model_io.load(self.model))}

    def copy_others(self, skip: set[str]) -> list[str]:
        """Copies every file and folder of MODEL_DIR but genai_config.json and skip, atomically per file."""
        skip = {os.path.abspath(p) for p in skip} | {os.path.join(self.dir, CONFIG_NAME)}
        copied = []
        for name in sorted(os.listdir(self.dir)):
            source = os.path.join(self.dir, name)
            if source in skip:
                continue
            target = os.path.join(self.out, name)
            if os.path.isdir(source):
                shutil.copytree(source, target, copy_function=_copy_atomic, dirs_exist_ok=True)
            else:
                _copy_atomic(source, target)
            copied.append(target)
        return copied

    def write_config(self) -> str:
        """OUT_DIR/genai_config.json, indented as the builder writes it, with the input's permissions."""
        path = os.path.join(self.out, CONFIG_NAME)
        temporaries.replace_atomic(path, lambda tmp: _dump_json(self.config, tmp, like=os.path.join(self.dir, CONFIG_NAME)))
        return path


def _dump_json(data: dict, path: str, like: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=4)
        f.write("\n")
    shutil.copymode(like, path)


def _copy_atomic(source: str, target: str) -> None:
    temporaries.replace_atomic(target, lambda tmp: shutil.copy2(source, tmp))


def _names_hcfuse_library(value) -> bool:
    """Whether a custom_ops_library value is hcfuse's library (its file name, or HCFUSE_LIBRARY's)."""
    names = {library_file_name(), os.path.basename(os.environ.get("HCFUSE_LIBRARY", "") or library_file_name())}
    return isinstance(value, str) and os.path.basename(value) in names


def optimize_folder(model_dir, out_dir, *, copy_library: bool = True, verify: bool = False,
                    report: str | None = None, infer_shapes: bool = False, progress=None,
                    debug: bool = False) -> FolderResult:
    """Fuses MODEL_DIR's decoder into OUT_DIR (created if missing) and points genai_config.json's
    model.decoder.session_options.custom_ops_library at hcfuse's library (see the module doc)."""
    folder = _Folder(model_dir, out_dir)
    present = folder.options.get("custom_ops_library")
    if present and not _names_hcfuse_library(present):
        raise model_io.ModelIOError(
            f"{os.path.join(folder.dir, CONFIG_NAME)}: model.decoder.session_options.custom_ops_library already "
            f"names {present!r}; onnxruntime-genai registers one library per session, so hcfuse's cannot be added")
    library = get_library_path()
    skip = folder.model_files() | ({os.path.join(folder.dir, present)} if present else set())
    os.makedirs(folder.out, exist_ok=True)
    target = os.path.join(folder.out, os.path.basename(folder.model))
    pipeline = optimize_file(folder.model, target, verify=verify, report=report, infer_shapes=infer_shapes,
                             progress=progress, debug=debug)
    copied = folder.copy_others(skip)
    if copy_library:
        value = library_file_name()
        _copy_atomic(library, os.path.join(folder.out, value))
    else:
        value = library
    folder.options["custom_ops_library"] = value
    return FolderResult(target, folder.write_config(), value, copied, pipeline)


def unfuse_folder(model_dir, out_dir, *, progress=None) -> FolderResult:
    """The reverse of optimize_folder: the stock decoder in OUT_DIR, beside a copy of the other files
    but a copy of hcfuse's library, and no custom_ops_library option naming that library."""
    folder = _Folder(model_dir, out_dir)
    present = folder.options.get("custom_ops_library")
    skip = folder.model_files()
    if _names_hcfuse_library(present):
        del folder.options["custom_ops_library"]
        skip.add(os.path.join(folder.dir, present))
        present = None
    os.makedirs(folder.out, exist_ok=True)
    target = os.path.join(folder.out, os.path.basename(folder.model))
    pipeline = unfuse_file(folder.model, target, progress=progress)
    copied = folder.copy_others(skip)
    return FolderResult(target, folder.write_config(), present, copied, pipeline)
