"""Names of a run's temporary files, and telling a killed run's temporaries from a live run's.

Every run keeps its temporaries in one hidden folder (or file) beside the file it writes, named
``.hcfuse-<host>-<pid>-<start>-<random>``: host is a hash of the host name, start the process's start
time (Linux: /proc/<pid>/stat), so a later run can tell whether the run that made it is still alive
even after its pid was reused. A temporary is stale when its run is dead: on this host by pid and
start time; where no start time can be read, by pid and age; from another host (a shared
filesystem), by age alone; so are the randomly named temporaries of hcfuse 0.1.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import secrets
import socket
import time

PREFIX = ".hcfuse-"
# Temporaries untouched this long are stale when their run's liveness cannot be checked exactly.
STALE_AGE_S = 24 * 3600
_NAME = re.compile(r"^\.hcfuse-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]{8}(?:\..*)?$")
# hcfuse 0.1's temporaries (tempfile.mkdtemp / mkstemp names): no run recorded, judged by age alone
_LEGACY_NAME = re.compile(r"^\.hcfuse-(?:report-)?[a-z0-9_]{8}$")


def _host_id() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # field 22; the command name (field 2) may hold spaces and parentheses: split after the last ')'
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def new_name(suffix: str = "") -> str:
    """A name unique to this run (and this call), recognizable by later runs."""
    return f"{PREFIX}{_host_id()}-{os.getpid()}-{_start_time(os.getpid()) or 0}-{secrets.token_hex(4)}{suffix}"


def replace_atomic(target: str, write, suffix: str = "") -> None:
    """write(tmp) fills a temporary file beside target (named by new_name, so a later run removes it if
    this one is killed), which then replaces target in one rename."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(target)), new_name(suffix))
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


@dataclasses.dataclass(frozen=True)
class Temporary:
    path: str
    host: str
    pid: int
    start: int


def parse(path: str) -> Temporary | None:
    """The run that made ``path``, or None when the name is not a run temporary's."""
    match = _NAME.match(os.path.basename(path))
    if match is None:
        return Temporary(path, "", 0, 0) if _LEGACY_NAME.match(os.path.basename(path)) else None
    return Temporary(path, match["host"], int(match["pid"]), int(match["start"]))


def _age_s(path: str) -> float:
    """Seconds since the entry (or, for a folder, anything directly in it) last changed."""
    times = [os.lstat(path).st_mtime]
    if os.path.isdir(path) and not os.path.islink(path):
        times += [os.lstat(e.path).st_mtime for e in os.scandir(path)]
    return time.time() - max(times)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def is_stale(temp: Temporary) -> bool:
    """Whether the run that made ``temp`` is dead (see the module doc)."""
    try:
        age = _age_s(temp.path)
    except FileNotFoundError:  # removed meanwhile (its run finished)
        return False
    if temp.host != _host_id():  # another host's, or an older hcfuse's
        return age > STALE_AGE_S
    if temp.pid == os.getpid() and temp.start == (_start_time(temp.pid) or 0):
        return False  # this process's own (another thread's run)
    if temp.start and os.path.isdir("/proc/self"):
        return _start_time(temp.pid) != temp.start
    return not _pid_exists(temp.pid) or age > STALE_AGE_S


def stale_in(directory: str) -> list[Temporary]:
    """The stale temporaries directly in ``directory``, oldest run first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [t for t in (parse(os.path.join(directory, n)) for n in names if n.startswith(PREFIX)) if t]
    return sorted((t for t in found if is_stale(t)), key=lambda t: (t.start, t.path))
