"""One notebook executed top to bottom with papermill and FAST=True: ``regress`` runs every one, ``book`` renders them.

It never raises, so one failing notebook cannot stop the others: the result is a row (notebook, status, seconds,
output, message).
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path

from autograder import course_paths


def run_one(nb: Path, output: Path, timeout: int, device: str = "cpu") -> dict:
    """Execute one notebook; never raises, so one failure cannot stop the others."""
    import papermill as pm

    output.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    status, message = "passed", ""
    try:
        pm.execute_notebook(str(nb), str(output), parameters={"FAST": True, "DEVICE": device}, kernel_name="python3",
                            cwd=str(nb.parent), progress_bar=False, execution_timeout=timeout,
                            extra_arguments=["--IPKernelApp.log_level=ERROR"])  # quiet the kernel's TCP warning
    except pm.PapermillExecutionError as e:
        status, message = "failed", f"cell {e.exec_count}: {e.ename}: {str(e.evalue)[:300]}"
    except Exception as e:  # a timeout, a dead kernel, an unreadable notebook
        status, message = "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else traceback.format_exc(limit=1)}"
    return {"notebook": label(nb), "status": status, "seconds": round(time.monotonic() - start, 1),
            "output": str(output), "message": message}


def label(nb: Path) -> str:
    try:
        return nb.resolve().relative_to(course_paths.REPO_ROOT).as_posix()
    except ValueError:
        return str(nb)
