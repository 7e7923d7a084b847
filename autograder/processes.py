"""What a submission leaves running: the grading worker's process tree, and anything still under a student's uid.

Both are killed after every submission, so that nothing a student started outlives its grading.
"""
from __future__ import annotations

import subprocess


def kill_tree(proc: subprocess.Popen) -> None:
    """The worker and everything it started: kernels run in sessions of their own."""
    import psutil

    try:
        procs = psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def leftover_processes(uid: int) -> int:
    """Kill whatever still runs as a student's uid (nothing should: the sandbox's PID namespace ends with it)."""
    import psutil

    left = []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real == uid:
                p.kill()
                left.append(p)
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)
    return len(left)
