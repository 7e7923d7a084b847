"""A memory cap per submission from the Linux cgroup file system, where this machine lets the grader make one.

RLIMIT_AS caps each process's address space: it counts memory mapped, not used (torch maps gigabytes it never
touches), and every process of a submission gets its own. A cgroup caps the memory all of the submission's
processes use together, and the kernel's OOM killer acts inside that cgroup only. So the grader makes one cgroup
per submission, the launcher (``autograder.sandbox.bubblewrap``) moves itself into it before it executes bwrap, so the
whole sandbox is inside, and ``remove`` kills what is left in it and deletes it after the submission.

Where it makes one, in this order:
  * cgroup v2: a child of the grader's own cgroup, or of the hierarchy's root, whose ``cgroup.subtree_control``
    already lists ``memory`` and which this user may write (root on a systemd machine; a subtree delegated to
    the instructor);
  * cgroup v1: a child of the grader's own cgroup of the ``memory`` controller, where that is writable (root on
    a machine with v1 or hybrid cgroups).
Nowhere else: then ``find`` returns None and RLIMIT_AS per process is the cap, as before.
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

V2, V1 = "cgroup v2 memory.max", "cgroup v1 memory.limit_in_bytes"
_names = itertools.count()


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, file system type, options) of every cgroup mount."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            found.append((parts[1].replace("\\040", " "), parts[2], set(parts[3].split(","))))
    return found


def _own() -> dict[str, str]:
    """The grader's own cgroup per hierarchy: "" for v2, else each v1 controller's name."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def _writable(folder: Path, control: str) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK) and os.access(folder / control, os.W_OK | os.R_OK)


def find() -> tuple[str, Path] | None:
    """(kind, the folder to make the submissions' cgroups in), or None where this user can make none."""
    try:
        mounts, own = _mounts(), _own()
    except OSError:
        return None
    for point, fstype, options in mounts:
        if fstype == "cgroup2" and "" in own:
            for folder in (Path(point + own[""]), Path(point)):
                try:
                    if "memory" in (folder / "cgroup.subtree_control").read_text().split() and \
                            _writable(folder, "cgroup.procs"):
                        return V2, folder
                except OSError:
                    continue
    for point, fstype, options in mounts:
        if fstype == "cgroup" and "memory" in options and "memory" in own:
            folder = Path(point + own["memory"])
            if _writable(folder, "cgroup.procs") and (folder / "memory.limit_in_bytes").exists():
                return V1, folder
    return None


def create(kind: str, parent: Path, gigabytes: float) -> Path:
    """A new cgroup under ``parent`` that caps its processes at ``gigabytes`` of memory (swap included)."""
    folder = parent / f"autograder-{os.getpid()}-{next(_names)}"
    folder.mkdir()
    limit = str(int(gigabytes * 1e9))
    if kind == V2:
        (folder / "memory.max").write_text(limit)
        if (folder / "memory.swap.max").exists():
            (folder / "memory.swap.max").write_text("0")
    else:
        (folder / "memory.limit_in_bytes").write_text(limit)
        if (folder / "memory.memsw.limit_in_bytes").exists():  # memory plus swap: without it, swap extends the cap
            (folder / "memory.memsw.limit_in_bytes").write_text(limit)
    return folder


def join(folder: str) -> None:
    """Move the calling process (the launcher, before it executes bwrap) into ``folder``."""
    Path(folder, "cgroup.procs").write_text(str(os.getpid()))


def _counter(folder: Path, name: str, key: str | None) -> int:
    try:
        text = (folder / name).read_text()
    except OSError:
        return 0
    if key is None:
        return int(text.split()[0]) if text.split() else 0
    return sum(int(line.split()[1]) for line in text.splitlines() if line.split()[:1] == [key])


def ran_out(folder: Path) -> str:
    """"oom" if the OOM killer killed a process of this cgroup, "cap" if its memory reached the cap without a kill
    (v2's memory.events "max"; v1's failcnt stayed 0 on Linux 6.18 here, even at an OOM kill), else ""."""
    if _counter(folder, "memory.events", "oom_kill") or _counter(folder, "memory.oom_control", "oom_kill"):
        return "oom"
    if _counter(folder, "memory.events", "max") or _counter(folder, "memory.failcnt", None) or \
            _counter(folder, "memory.memsw.failcnt", None):  # (v1 charges memory plus swap first, where both are set)
        return "cap"
    return ""


def remove(folder: Path) -> int:
    """Kill every process still in the cgroup and delete it; how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
        except OSError:
            return len(killed)
        if not pids:
            break
        if (folder / "cgroup.kill").exists():  # v2, Linux 5.14+: one write kills them all, forks in flight too
            (folder / "cgroup.kill").write_text("1")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    for _ in range(100):  # the killed processes leave the cgroup a moment after they die
        try:
            folder.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:
            time.sleep(0.1)
    return len(killed)
