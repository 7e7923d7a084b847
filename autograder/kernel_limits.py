"""Limits for a grading kernel, imported inside the kernel before the notebook's first cell.

``python -m autograder grade`` and ``check`` start kernels with
``--IPKernelApp.exec_lines=import autograder.kernel_limits``.  This keeps a
submission from taking the grader down with it:
  * an address-space limit (RLIMIT_AS), so a 30 GB allocation fails with a
    MemoryError in that cell instead of swapping the machine to death;
  * ``os._exit`` raises SystemExit instead of killing the kernel, so the
    remaining cells still run and are graded (``sys.exit`` already only ends
    the cell under IPython).
These guard against accidents and crude attacks, not against a determined
adversary; that is what the per-student timeout and the dead-kernel handling
in ``autograder.notebooks.execute`` are for.
"""
from __future__ import annotations

import os

MEMORY_ENV = "AUTOGRADER_KERNEL_MEMORY_GB"


def limit_memory(gigabytes: float) -> None:
    import resource

    limit = int(gigabytes * 1e9)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard if hard != resource.RLIM_INFINITY else limit))


_real_exit = os._exit


def _exit_disabled(status=0):
    import sys

    # ipykernel itself calls os._exit when its parent process dies: let the kernel machinery through.
    caller = sys._getframe(1).f_globals.get("__name__", "")
    if caller.startswith(("ipykernel", "jupyter_client", "IPython")):
        _real_exit(status)
    raise SystemExit(f"os._exit({status}) was called: the grader keeps the kernel alive and goes on with the next cell")


def install() -> None:
    gigabytes = os.environ.get(MEMORY_ENV)
    if gigabytes:
        limit_memory(float(gigabytes))
    os._exit = _exit_disabled


install()
