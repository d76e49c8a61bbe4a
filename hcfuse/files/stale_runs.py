"""Cleaning up after killed runs: removing a dead run's temporaries, completing a commit it began.

hcfuse.files.temporaries tells a dead run's temporaries from a live run's; a folder that an output
reads (the run was killed after its commit, hcfuse.files.model_saving) is completed, not removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable

from hcfuse.files import temporaries
from hcfuse.files.model_saving import directory_lock, finish, reads_from
from hcfuse.files.paths import data_file_name


def _committed_output(tmp: str) -> str | None:
    """The output name of a run whose folder ``tmp`` the output's current model reads, else None."""
    entries = set(os.listdir(tmp))
    for name in entries:
        if data_file_name(name) in entries and not name.endswith((".staged", ".link")):
            if reads_from(os.path.join(os.path.dirname(tmp), name), tmp):
                return name
    return None


def remove_stale_temporaries(directory: str | os.PathLike, keep: Iterable[str] = ()) -> list[str]:
    """Removes the temporaries of dead runs in ``directory`` (hcfuse.files.temporaries decides which);
    a run killed after its commit is completed instead. Anything among or holding the files in
    ``keep`` (this run's inputs) is left alone. Returns the paths removed or completed."""
    directory = os.path.abspath(os.fspath(directory))
    keep = [os.path.realpath(k) for k in keep]
    done = []
    with directory_lock(directory):
        for temp in temporaries.stale_in(directory):
            real = os.path.realpath(temp.path)
            if any(k == real or k.startswith(real + os.sep) for k in keep):
                continue
            if os.path.isdir(temp.path) and not os.path.islink(temp.path):
                name = _committed_output(temp.path)
                if name is not None:
                    if os.path.realpath(os.path.join(directory, name)) in keep:
                        continue
                    finish(temp.path, name)
                else:
                    shutil.rmtree(temp.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp.path)
            done.append(temp.path)
    return done
