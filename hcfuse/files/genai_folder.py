"""onnxruntime-genai model folders: fuse (or unfuse) the decoder of a folder holding genai_config.json.

A folder as onnxruntime-genai's model builder writes it holds the decoder model (genai_config.json's
model.decoder.filename, e.g. model.onnx with model.onnx.data), genai_config.json and the tokenizer
files. `optimize_folder(MODEL_DIR, OUT_DIR)` writes the fused decoder into OUT_DIR under the same file
name (its data in ``<name>.data``), beside a copy of every other file (hcfuse.files.folder_contents
says which), and sets model.decoder.session_options.custom_ops_library in OUT_DIR/genai_config.json
to hcfuse's custom-op library: by default a copy of the library in OUT_DIR named by a relative path
(onnxruntime-genai resolves it against the folder and, since 0.18, refuses a library outside it), or
with copy_library=False the installed library's absolute path, which onnxruntime-genai 0.18 and newer
refuse ("not within an allowed directory": the path, links resolved, must lie in the model folder):
that run warns (LIBRARY_OUTSIDE_FOLDER, in FolderResult.warnings and as a LibraryLocationWarning).
`unfuse_folder` does the reverse: the stock decoder, no hcfuse library, no custom_ops_library naming it.

A run is one commit (hcfuse.files.folder_commit): the whole new folder is built beside OUT_DIR,
verified when asked, checked against the inputs' state when they were read, and swapped in. Every
file of MODEL_DIR is an input: MODEL_DIR is never modified, and neither OUT_DIR nor the report may lie
in it (paths compared with links resolved); MODEL_DIR may not lie in OUT_DIR either, which is replaced.
"""

from __future__ import annotations

import dataclasses
import filecmp
import os
import shutil
import warnings

from hcfuse._library import get_library_path, library_file_name
from hcfuse.files import folder_commit, folder_contents, model_io
from hcfuse.files.folder_contents import FolderContentError
from hcfuse.files.genai_config import CONFIG_NAME, GenaiConfig, GenaiConfigError
from hcfuse.files.pipeline import FileResult, optimize_file, unfuse_file, write_json_atomic
from hcfuse.files.unchanged_inputs import InputSignatures

__all__ = ["CONFIG_NAME", "FolderResult", "GenaiConfigError", "FolderContentError", "LibraryLocationWarning",
           "optimize_folder", "unfuse_folder"]

# What a folder naming the library outside itself meets in onnxruntime-genai, and what to do instead.
LIBRARY_OUTSIDE_FOLDER = ("{config}: custom_ops_library names {library}, outside the model folder: onnxruntime-genai "
                          "0.18 and newer refuse it (\"custom_ops_library path is not within an allowed directory\"); "
                          "run without --link-library (copy_library=True) to copy the library into the folder")


class LibraryLocationWarning(UserWarning):
    """The folder names hcfuse's library where onnxruntime-genai may refuse to load it."""


@dataclasses.dataclass
class FolderResult:
    """What optimize_folder / unfuse_folder wrote into out_dir (committed False: nothing, verify failed)."""

    model: str  # the decoder model written (its external data beside it)
    config: str  # out_dir/genai_config.json
    custom_ops_library: str | None  # the session option written (None: not set)
    copied: list[str]  # the folder's other files, copied
    pipeline: FileResult  # what hcfuse.files.pipeline's optimize_file / unfuse_file returned
    committed: bool = True
    warnings: list[str] = dataclasses.field(default_factory=list)  # one line each, for the user


def _library_names() -> set[str]:
    """The file names hcfuse's library goes by: its own, and HCFUSE_LIBRARY's when that is set."""
    return {library_file_name(), os.path.basename(os.environ.get("HCFUSE_LIBRARY", "") or library_file_name())}


def _within(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


class _Run:
    """One folder run: MODEL_DIR's config and files, OUT_DIR, the report path; every check made before
    anything is written."""

    def __init__(self, model_dir, out_dir, report=None):
        self.given = os.fspath(model_dir)
        if not os.path.isdir(self.given):
            raise model_io.ModelIOError(f"{self.given}: not a directory")
        self.root = os.path.realpath(self.given)
        self.target = folder_commit.FolderTarget(out_dir)
        out = self.target.path
        if _within(out, self.root) or _within(os.path.realpath(out), self.root):
            raise model_io.ModelIOError(f"{out_dir}: is {model_dir} or inside it (links resolved); write the folder "
                                        "to a new path")
        if _within(self.root, out):
            raise model_io.ModelIOError(f"{out_dir}: holds {model_dir}, and OUT_DIR is replaced as a whole; write "
                                        "the folder to a new path")
        self.report = None
        if report is not None:
            report_dir, report_name = os.path.split(os.path.abspath(os.fspath(report)))
            self.report = os.path.join(os.path.realpath(report_dir), report_name)
            for folder, what in ((self.root, "MODEL_DIR (every file there is an input)"),
                                 (out, "OUT_DIR (replaced as a whole)")):
                if _within(self.report, folder):
                    raise model_io.ModelIOError(f"{report}: the report would be written into {what}; write it "
                                                "to a path outside both folders")
        self.signatures = InputSignatures()
        self.signatures.record([os.path.join(self.root, CONFIG_NAME)])
        self.config = GenaiConfig(self.root)
        self.entries = folder_contents.scan(self.root)
        self.signatures.record(e.source for e in self.entries)
        by_rel = {e.rel: e for e in self.entries}
        decoder = by_rel.get(self.config.decoder_name)
        if decoder is None:
            raise GenaiConfigError(f"{self.config.path}: model.decoder.filename {self.config.decoder_name!r} is "
                                   f"not in {model_dir}")
        self.decoder = decoder
        try:  # before anything is written, and as one line about the config's choice
            model_io.load(os.path.join(self.root, decoder.rel))
        except model_io.ModelIOError as e:
            raise GenaiConfigError(f"{self.config.path}: model.decoder.filename {decoder.rel!r} is not a model "
                                   f"hcfuse can read: {e}") from e
        self.decoder_data = folder_contents.data_files_of(self.root, decoder)
        self.library_files = self._library_entries()  # before an unfuse drops the option naming one
        self.target.check()  # before any work; again at the commit

    def copies(self, skip: set[str]) -> list[folder_contents.Entry]:
        """The entries to copy beside the new decoder: all but the config, the decoder, ``skip`` and the
        decoder's data files no other model reads; refuses a copy that would replace the new decoder's
        files or leave another model reading other bytes."""
        outputs = {self.decoder.rel, model_io.data_file_name(self.decoder.rel)}
        needed: dict[str, str] = {}  # data file -> a model (other than the decoder) reading it
        for entry in self.entries:
            if entry.rel.endswith(".onnx") and entry.rel != self.decoder.rel:
                for rel in folder_contents.data_files_of(self.root, entry):
                    needed.setdefault(rel, entry.rel)
        for rel, model in sorted(needed.items()):
            if rel in outputs:
                raise FolderContentError(
                    f"{os.path.join(self.root, model)}: reads {rel}, which the new decoder's own file replaces in "
                    f"OUT_DIR; give {model} a data file of its own")
        chosen = []
        for entry in self.entries:
            if entry.rel in (CONFIG_NAME, self.decoder.rel) or entry.rel in skip:
                continue
            if entry.rel in self.decoder_data and entry.rel not in needed:
                continue
            if entry.rel in outputs:
                raise FolderContentError(
                    f"{entry.source}: the decoder does not read it (it reads {', '.join(sorted(self.decoder_data)) or 'no data file'}), "
                    f"but the new decoder's data file has its name; remove or rename it in the model folder")
            chosen.append(entry)
        return chosen

    def _library_entries(self) -> set[str]:
        """The files of MODEL_DIR that are hcfuse's library: named as it is, listed as it in the
        folder's manifest, or named by custom_ops_library with the installed library's bytes."""
        manifest = folder_commit.read_manifest(self.root).get("library")
        found = {e.rel for e in self.entries if os.path.basename(e.rel) in _library_names() or e.rel == manifest}
        named = self.named_library()
        if named is not None and _within(named, self.root) and self.is_hcfuse_library(named):
            found.add(os.path.relpath(named, self.root))
        return found

    def named_library(self) -> str | None:
        """custom_ops_library resolved against MODEL_DIR (as onnxruntime-genai does), or None."""
        value = self.config.options.get("custom_ops_library")
        if not isinstance(value, str) or not value:
            return None
        return os.path.realpath(value if os.path.isabs(value) else os.path.join(self.root, value))

    def is_hcfuse_library(self, path: str) -> bool:
        if os.path.basename(path) in _library_names():
            return True
        if _within(path, self.root) and os.path.relpath(path, self.root) == folder_commit.read_manifest(
                self.root).get("library"):
            return True
        try:
            installed = get_library_path()
        except OSError:
            return False
        return os.path.isfile(path) and filecmp.cmp(path, installed, shallow=False)

    def write(self, decoder_step, copy_library: bool | None) -> FolderResult:
        """Builds the new folder beside OUT_DIR (decoder_step(input, output) -> FileResult writes the
        decoder), then commits it unless the decoder step did not commit (failed verification)."""
        copies = self.copies(self.library_files)
        keep = [self.root, *(e.source for e in self.entries)]
        with folder_commit.staging(self.target, keep) as stage:
            target = os.path.join(stage, self.decoder.rel)
            pipeline = decoder_step(os.path.join(self.root, self.decoder.rel), target)
            out_model = os.path.join(self.target.path, self.decoder.rel)
            if not pipeline.committed:
                return FolderResult(out_model, os.path.join(self.target.path, CONFIG_NAME),
                                    self.config.options.get("custom_ops_library"), [], pipeline, committed=False)
            written = [os.path.relpath(f, stage) for f in pipeline.files]
            for entry in copies:
                path = os.path.join(stage, entry.rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                shutil.copy2(entry.source, path)
                written.append(entry.rel)
            library = None
            if copy_library:
                library = library_file_name()
                shutil.copy2(get_library_path(), os.path.join(stage, library))
                written.append(library)
                self.config.options["custom_ops_library"] = library
            elif copy_library is False:
                self.config.options["custom_ops_library"] = get_library_path()
            self.config.write(os.path.join(stage, CONFIG_NAME))
            written.append(CONFIG_NAME)
            self.signatures.check()  # every input as it was when read: the copies are of one version
            folder_commit.commit(self.target, stage, written, library)
        copied = [os.path.join(self.target.path, e.rel) for e in copies]
        return FolderResult(out_model, os.path.join(self.target.path, CONFIG_NAME),
                            self.config.options.get("custom_ops_library"), copied, pipeline)


def optimize_folder(model_dir, out_dir, *, copy_library: bool = True, verify: bool = False,
                    report: str | None = None, infer_shapes: bool = False, progress=None,
                    debug: bool = False, verify_dims: dict[str, int] | None = None) -> FolderResult:
    """Fuses MODEL_DIR's decoder into OUT_DIR (replaced as a whole, or created) and points genai_config.json's
    model.decoder.session_options.custom_ops_library at hcfuse's library (see the module doc). verify
    runs before the commit: a failed verification leaves OUT_DIR as it was (result.committed False).
    The report, outside both folders, is written after the commit."""
    run = _Run(model_dir, out_dir, report)
    present = run.named_library()
    if present is not None and not run.is_hcfuse_library(present):
        raise GenaiConfigError(
            f"{run.config.path}: model.decoder.session_options.custom_ops_library already names "
            f"{run.config.options['custom_ops_library']!r}; onnxruntime-genai registers one library per session, "
            "so hcfuse's cannot be added")

    def fuse(source: str, target: str) -> FileResult:
        return optimize_file(source, target, verify=verify, infer_shapes=infer_shapes, progress=progress,
                             debug=debug, verify_dims=verify_dims)

    result = run.write(fuse, copy_library)
    if result.committed and not copy_library:  # the installed library: never inside OUT_DIR, which is replaced
        result.warnings.append(LIBRARY_OUTSIDE_FOLDER.format(config=result.config, library=result.custom_ops_library))
        warnings.warn(result.warnings[-1], LibraryLocationWarning, stacklevel=2)
    if run.report is not None:
        write_json_atomic(run.report, result.pipeline.to_dict())
        result.pipeline.report = run.report
    return result


def unfuse_folder(model_dir, out_dir, *, progress=None) -> FolderResult:
    """The reverse of optimize_folder: the stock decoder in OUT_DIR, beside a copy of the other files
    but hcfuse's library (however the config names it), and no custom_ops_library naming that library;
    a library of the user's own is copied and stays named."""
    run = _Run(model_dir, out_dir)
    named = run.named_library()
    if named is not None and run.is_hcfuse_library(named):
        del run.config.options["custom_ops_library"]

    def expand(source: str, target: str) -> FileResult:
        return unfuse_file(source, target, progress=progress)

    return run.write(expand, None)
