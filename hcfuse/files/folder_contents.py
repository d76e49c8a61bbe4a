"""What a model folder holds, by one rule, checked before anything is written.

Every entry of MODEL_DIR, at any depth, is one of:
- a regular file or a folder: copied as it is;
- a symbolic link that resolves to a regular file inside MODEL_DIR: copied as a regular file with
  that file's bytes;
- an hcfuse run temporary (a killed run's leftover, hcfuse.files.temporaries) or a folder manifest
  (hcfuse.files.folder_commit.MANIFEST): never part of a model, not copied;
anything else (a link that dangles or loops, that points outside MODEL_DIR or to a folder; a fifo,
socket or device) is refused, naming the entry.

Each ONNX model in the folder (``*.onnx``) other than the decoder keeps reading exactly the bytes it
read: the external data files it reads are copied with it, and it may not read a file outside
MODEL_DIR.
"""

from __future__ import annotations

import dataclasses
import os
import stat

from hcfuse.files import model_io, temporaries
from hcfuse.files.folder_commit import MANIFEST


class FolderContentError(model_io.ModelIOError, ValueError):
    """An entry of MODEL_DIR that the folder rule refuses, or copies that could not keep a model whole."""


@dataclasses.dataclass(frozen=True)
class Entry:
    rel: str  # the path inside the folder
    source: str  # the regular file to read (a link's target, resolved)


def scan(root: str) -> list[Entry]:
    """Every file of the folder ``root`` (resolved) under the rule above, sorted; raises FolderContentError."""
    entries = []
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(os.path.join(root, rel_dir)) as listing:
            for item in listing:
                rel = os.path.join(rel_dir, item.name)
                if item.name == MANIFEST or temporaries.parse(item.path) is not None:
                    continue
                mode = os.lstat(item.path).st_mode
                if stat.S_ISDIR(mode):
                    pending.append(rel)
                elif stat.S_ISREG(mode):
                    entries.append(Entry(rel, item.path))
                elif stat.S_ISLNK(mode):
                    entries.append(Entry(rel, _link_target(root, item.path)))
                else:
                    raise FolderContentError(f"{item.path}: not a regular file, folder or link (a fifo, socket or "
                                             "device); a model folder holds files only")
    return sorted(entries, key=lambda e: e.rel)


def _link_target(root: str, path: str) -> str:
    target = os.path.realpath(path)
    if not os.path.exists(target):
        raise FolderContentError(f"{path}: a symbolic link that dangles or loops ({os.readlink(path)}); remove it "
                                 "or make it a file")
    if os.path.commonpath([root, target]) != root:
        raise FolderContentError(f"{path}: a symbolic link to {target}, outside the model folder; copy the file "
                                 "into the folder (e.g. cp -L)")
    if not os.path.isfile(target):
        raise FolderContentError(f"{path}: a symbolic link to a folder ({os.readlink(path)}); only links to files "
                                 "are copied (as files)")
    return target


def data_files_of(root: str, entry: Entry) -> set[str]:
    """The external data files (folder-relative paths) that the model ``entry`` reads; raises
    FolderContentError for a location outside the folder. A file that is not a model reads none."""
    found = set()
    for location in model_io.locations(entry.source):
        path = os.path.realpath(os.path.join(root, os.path.dirname(entry.rel), location))
        if os.path.isabs(location) or os.path.commonpath([root, path]) != root:
            raise FolderContentError(f"{os.path.join(root, entry.rel)}: reads external data {location!r} outside "
                                     "the model folder; its copy would read other bytes")
        found.add(os.path.normpath(os.path.join(os.path.dirname(entry.rel), location)))  # a link: its own name
    return found
