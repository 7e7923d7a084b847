"""What a submission leaves running: the grading worker's process tree, and anything still in a student's sandbox.

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


def leftover_in_namespace(status_file, since: float) -> int:
    """Kill the sandbox's PID namespace if it outlived its worker; how many processes it held besides its init.

    Where every kernel runs as the instructor's uid (bubblewrap.USERNS), a uid names no sandbox. bwrap's status
    file names the namespace's init (its pid and namespace) instead: everything the sandbox started is in that
    namespace, and the kernel kills all of it when the init dies. The pid counts only if that process started
    after the submission did and is still in that namespace, so a reused pid or namespace number is never hit.
    """
    import json
    import os
    from pathlib import Path

    import psutil

    try:
        status, _ = json.JSONDecoder().raw_decode(Path(status_file).read_text())
        pid, namespace = int(status["child-pid"]), int(status["pid-namespace"])
        init = psutil.Process(pid)
        if init.create_time() < since - 1 or os.stat(f"/proc/{pid}/ns/pid").st_ino != namespace:
            return 0
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return 0  # no status (the sandbox never started) or its init is gone, and with it the whole namespace
    inside = []
    for p in psutil.process_iter():
        try:
            if p.pid != pid and os.stat(f"/proc/{p.pid}/ns/pid").st_ino == namespace:
                inside.append(p)
        except OSError:
            pass
    try:
        init.kill()
    except psutil.Error:
        pass
    psutil.wait_procs([init, *inside], timeout=10)
    return len(inside)


def last_words(proc: subprocess.Popen, seconds: int = 30) -> tuple[str, str]:
    """What a killed worker wrote. A process it left (one that escaped kill_tree) could hold its pipes open for
    ever: after ``seconds`` the pipes are closed unread, and KernelBox kills whatever is left of the sandbox."""
    try:
        return proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        proc.wait()
        return "", ""
