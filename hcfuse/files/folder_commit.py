"""Writing a folder as one commit: built beside OUT_DIR, swapped in whole, under a lock.

The new folder is written into a run temporary (hcfuse.files.temporaries) in OUT_DIR's parent, so on
the same filesystem. Under an flock on that parent (runs writing there take turns to commit or clean
up), OUT_DIR is checked again and the new folder takes its place in one step: renameat2's
RENAME_EXCHANGE swaps the two folders where the filesystem has it (Linux), a rename makes a new
OUT_DIR. The temporary then holds the previous folder, and is removed. So OUT_DIR is, at every
moment, the complete previous folder or the complete new one: a kill before the swap leaves the
previous one (and the new one in a temporary), after it the new one (and the previous one in a
temporary); the next run writing in that parent removes such temporaries. Where the filesystem
cannot exchange, the previous folder is renamed aside first: a kill between the two renames leaves
OUT_DIR missing and the previous folder in the run temporary.

An existing OUT_DIR is replaced only when it is empty or every entry in it is one hcfuse wrote there
(listed in its MANIFEST file): a user's other files are never removed. OUT_DIR itself may not be a
symbolic link; nothing is ever written into the previous folder, so links inside it are never
followed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
from collections.abc import Iterator

from hcfuse.files import model_io, steps, temporaries
from hcfuse.files.paths import fsync_path

MANIFEST = ".hcfuse_manifest.json"
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


class FolderTarget:
    """OUT_DIR: its parent resolved (links followed), its own name kept (a link there is refused)."""

    def __init__(self, out_dir: str | os.PathLike):
        self.given = os.fspath(out_dir)
        parent, name = os.path.split(os.path.normpath(os.path.abspath(self.given)))
        self.parent = os.path.realpath(parent)
        self.path = os.path.join(self.parent, name)

    def check(self) -> None:
        """Raises ModelIOError (one line) unless OUT_DIR is absent, empty, or wholly hcfuse's."""
        if os.path.islink(self.path):
            raise model_io.ModelIOError(f"{self.given}: is a symbolic link (to {os.readlink(self.path)}); give the "
                                        "folder's real path: OUT_DIR is replaced as a whole, never written through a link")
        if not os.path.lexists(self.path):
            return
        if not os.path.isdir(self.path):
            raise model_io.ModelIOError(f"{self.given}: exists and is not a folder")
        foreign = _foreign_entries(self.path)
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise model_io.ModelIOError(
                f"{self.given}: holds files hcfuse did not write ({', '.join(foreign[:3])}{more}); OUT_DIR is "
                "replaced as a whole, so give a new or empty folder, or move those files")


def read_manifest(folder: str) -> dict:
    """The manifest of a folder hcfuse wrote ({} where there is none or it is unreadable)."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("files"), list) else {}


def _foreign_entries(folder: str) -> list[str]:
    """Entries (relative paths, links not followed) of ``folder`` that its manifest does not list."""
    listed = {MANIFEST}
    for file in map(str, read_manifest(folder).get("files", [])):
        while file and not os.path.isabs(file):  # the file and every folder above it
            listed.add(file)
            file = os.path.dirname(file)
    foreign = []
    for root, dirs, files in os.walk(folder):  # never follows links
        for name in sorted(dirs + files):
            rel = os.path.relpath(os.path.join(root, name), folder)
            path = os.path.join(root, name)
            if rel not in listed or os.path.islink(path):
                foreign.append(rel)
        dirs[:] = [d for d in dirs if os.path.relpath(os.path.join(root, d), folder) in listed]
    return sorted(foreign)


@contextlib.contextmanager
def staging(target: FolderTarget, keep: list[str]) -> Iterator[str]:
    """A new run temporary beside OUT_DIR to build the folder in; removed on leaving (after commit()
    it holds the previous folder). Dead runs' temporaries there are removed first, but any holding
    a path in ``keep`` (the inputs)."""
    os.makedirs(target.parent, exist_ok=True)
    model_io.remove_stale_temporaries(target.parent, keep=keep)
    stage = os.path.join(target.parent, temporaries.new_name(".folder"))
    os.mkdir(stage)
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def commit(target: FolderTarget, stage: str, files: list[str], library: str | None) -> None:
    """Writes the manifest (files: relative paths written into stage; library: the one that is
    hcfuse's library), makes everything durable, and swaps stage in as OUT_DIR (module doc)."""
    with open(os.path.join(stage, MANIFEST), "w", encoding="utf-8") as f:
        json.dump({"written_by": "hcfuse", "files": sorted(files), "library": library}, f, indent=1)
        f.write("\n")
    for root, _, names in os.walk(stage):
        for name in names:
            fsync_path(os.path.join(root, name))
        fsync_path(root)
    steps.reached("folder-staged")
    with model_io.directory_lock(target.parent):
        target.check()  # again: another run or a user may have changed OUT_DIR meanwhile
        if not os.path.lexists(target.path):
            os.rename(stage, target.path)
        elif not _exchange(stage, target.path):
            _swap_by_renames(stage, target.path)
        steps.reached("folder-committed")
        fsync_path(target.parent)
    shutil.rmtree(stage, ignore_errors=True)  # the previous folder
    steps.reached("folder-finalized")


def _exchange(a: str, b: str) -> bool:
    """Swaps two paths in one step (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), b)


def _swap_by_renames(stage: str, out: str) -> None:
    """The previous folder aside, the new one in, the previous one into stage (removed after)."""
    aside = os.path.join(os.path.dirname(stage), temporaries.new_name(".previous"))
    os.rename(out, aside)
    try:
        os.rename(stage, out)
    except BaseException:
        os.rename(aside, out)
        raise
    os.rename(aside, stage)
