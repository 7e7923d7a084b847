"""Helpers shared by the autograder's end-to-end tests (no tests here): run the CLI as a user would, in folders of its own."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "lab01"


def isolated_env(work: Path) -> dict:
    """The autograder's working folders under ``work``, so tests never touch the real course/ or student/."""
    env = dict(os.environ)
    env.update(AUTOGRADER_COURSE_DIR=str(work / "course"), AUTOGRADER_STUDENT_DIR=str(work / "student"),
               AUTOGRADER_BUILD_DIR=str(work / "build"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def run_cli(*args, env: dict, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def explain(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-6000:]}\n--- stderr\n{r.stderr[-4000:]}"
