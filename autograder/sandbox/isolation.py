"""Which sandbox this machine allows, and one submission's sandbox from before its worker starts to after it ends.

``choose`` picks the mode once per grading run: as root, bwrap as root with a uid of its own per student
(``bubblewrap.ROOT``); as a normal user, bwrap in an unprivileged user namespace (``bubblewrap.USERNS``), where
every kernel runs as the instructor's uid (autograder/README.md, trust model, says what that loses).  Where the
mode it tries cannot make a sandbox, grading refuses with what failed and how to enable it.

``KernelBox`` makes a submission's sandbox (its uid, runtime folder and memory cap) and, when the worker is gone,
kills whatever of it is still running and removes it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder.sandbox import bubblewrap, cgroups, uids
from autograder.sandbox.bubblewrap import ROOT, USERNS, Sandbox
from autograder.sandbox.processes import leftover_in_namespace, leftover_processes

NONE = "none"  # grade --unsafe-no-sandbox
DESCRIPTION = {ROOT: "bwrap as root, an unprivileged uid of its own per student",
               USERNS: "bwrap in an unprivileged user namespace, every kernel as your own uid",
               NONE: "no sandbox"}
INSTALL = "install the bubblewrap package (Debian/Ubuntu: sudo apt-get install bubblewrap; `make sandbox` does it as root)"
ENABLE_USERNS = ("allow unprivileged user namespaces (sysctl user.max_user_namespaces=15000; Debian before 11: "
                 "sysctl kernel.unprivileged_userns_clone=1; Ubuntu 23.10+: an AppArmor profile that lets bwrap use "
                 "them, or sysctl kernel.apparmor_restrict_unprivileged_userns=0), or grade as root (sudo), which "
                 "gives every student's kernel a uid of its own")


class Unavailable(Exception):
    """No sandbox can be made here; the message says what was tried, what failed, and how to fix it."""


def choose() -> str:
    """ROOT when running as root, USERNS otherwise, once a probe sandbox ran; raises Unavailable."""
    if not sys.platform.startswith("linux"):
        raise Unavailable("bubblewrap needs Linux (on macOS or Windows, grade inside a Linux VM or container)")
    if not shutil.which("bwrap"):
        raise Unavailable(f"bwrap is not installed: {INSTALL}")
    mode = ROOT if os.geteuid() == 0 else USERNS
    try:
        with (uids.claimed_uid() if mode == ROOT else contextlib.nullcontext()) as uid:
            probe = Sandbox(runtime="", cases="", uid=uid)
            done = subprocess.run(probe.wrap(["/bin/true"]), capture_output=True, text=True, timeout=30)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"bwrap could not start ({e})") from None
    if done.returncode != 0:
        said = done.stderr.strip()[-300:] or f"exit status {done.returncode}"
        if mode == ROOT:
            raise Unavailable(f"bwrap, run as root, could not make a sandbox: {said}")
        raise Unavailable(f"not root (uid {os.geteuid()}), so bwrap needs an unprivileged user namespace, and "
                          f"it could not make one: {said}. To fix it, {ENABLE_USERNS}")
    return mode


def memory_cap_name(kind: str | None, gigabytes: float) -> str:
    """What grades.json records as a submission's memory cap."""
    if not gigabytes:
        return NONE
    return f"{kind} {gigabytes:g} GB" if kind else f"RLIMIT_AS {gigabytes:g} GB per process"


class KernelBox:
    """One submission's sandbox: ``with KernelBox(...) as box`` yields the Sandbox for its worker (None when
    unsandboxed), and on leaving kills what is left of it.  Read afterwards: ``stray`` (processes killed),
    ``memory_cap`` (what grades.json records) and ``out_of_memory`` (cgroups.ran_out: the cap was reached)."""

    def __init__(self, mode: str, root: Path, memory_gb: float, time_limit: int, inputs: Path | None,
                 hidden_cells: list[str], mine: Path | None = None):
        self.mode, self.root, self.memory_gb, self.mine = mode, Path(root), memory_gb, mine
        self.time_limit, self.inputs, self.hidden_cells = time_limit, inputs, hidden_cells
        self.stray, self.out_of_memory = 0, ""
        self.memory_cap = memory_cap_name(None, memory_gb)
        self._claim = self._uid = self._cgroup = self._runtime = None

    def __enter__(self) -> Sandbox | None:
        if self.mode == NONE:
            return None
        self._started = time.time()
        if self.mode == ROOT:
            self._claim = uids.claimed_uid()
            self._uid = self._claim.__enter__()
        found = cgroups.find() if self.memory_gb else None
        if found:
            try:
                self._cgroup = cgroups.create(found[0], found[1], self.memory_gb)
                self.memory_cap = memory_cap_name(found[0], self.memory_gb)
            except OSError:  # a controller that refuses a child: the address-space limit is the cap, as recorded
                self._cgroup = None
        # The kernel's sockets: a short path of their own, since a Unix socket's path has at most 107 bytes.
        self._runtime = tempfile.mkdtemp(prefix="autograder-")
        return Sandbox(runtime=self._runtime, cases=str(self.root / "sandbox" / "hidden-inputs"), uid=self._uid,
                       status=str(self.root / "sandbox" / "bwrap-status.json"),
                       cgroup=str(self._cgroup or ""), memory_gb=0 if self._cgroup else self.memory_gb,
                       cpu_seconds=self.time_limit, inputs=str(self.inputs or ""), hidden_cells=self.hidden_cells,
                       mine=str(self.mine or ""))

    def __exit__(self, *exc) -> bool:
        if self.mode == NONE:
            return False
        try:
            if self.mode == ROOT:
                self.stray = leftover_processes(self._uid)
            else:
                self.stray = leftover_in_namespace(self.root / "sandbox" / "bwrap-status.json", self._started)
            if self._cgroup:
                self.out_of_memory = cgroups.ran_out(self._cgroup)
                cgroups.remove(self._cgroup)
        finally:
            shutil.rmtree(self._runtime, ignore_errors=True)
            if self._claim is not None:
                self._claim.__exit__(None, None, None)
        return False
