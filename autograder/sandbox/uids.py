"""Sandbox uids: in ROOT mode every kernel runs as a uid of its own, claimed machine-wide for as long as it runs."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

UID_BASE, UID_COUNT = 61000, 4000  # one uid per kernel at a time, machine-wide: RLIMIT_NPROC counts per uid


@contextlib.contextmanager
def claimed_uid():
    """A sandbox uid that no other kernel on this machine has now, held until the block ends.

    Two grading runs at once (two instructors, or two test workers) must not share a uid: a uid's processes
    share one RLIMIT_NPROC, and after a student's grading the worker kills whatever still runs as that uid.
    A lock file per uid decides; the lock goes away with the process that holds it, even a killed one.
    """
    import fcntl
    import tempfile

    folder = Path(tempfile.gettempdir()) / "autograder-uids"
    folder.mkdir(mode=0o700, exist_ok=True)
    for uid in range(UID_BASE, UID_BASE + UID_COUNT):
        fd = os.open(folder / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # releases the lock
        return
    raise RuntimeError(f"all {UID_COUNT} sandbox uids from {UID_BASE} are in use")
