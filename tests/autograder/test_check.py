"""``python -m autograder check`` on lab 1 as students receive it: it runs, every visible test fails with
its reason (the stubs raise NotImplementedError), the hidden tests are listed, and nothing crashes.

The student edition (``python -m autograder publish``) ships this test: there labs/ holds the released
notebooks and a reduced autograder, and this is the proof that the reduced one still checks a lab.  In
the instructor edition labs/ holds the sources, so the lab is first released into folders of its own.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = "lab01_naive_decode"
pytestmark = [pytest.mark.slow, pytest.mark.student_edition]


def cli(*args, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def explain(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-3000:]}"


def test_check_fails_every_visible_test_of_the_released_lab_with_its_reason(tmp_path):
    env = {**os.environ, "AUTOGRADER_COURSE_DIR": str(tmp_path / "course"),
           "AUTOGRADER_STUDENT_DIR": str(tmp_path / "student"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    notebook = REPO / "labs" / LAB / f"{LAB}.ipynb"
    if "### BEGIN SOLUTION" in notebook.read_text(encoding="utf-8"):  # the source: release it as students get it
        r = cli("release", LAB, env=env, cwd=tmp_path)
        assert r.returncode == 0, explain(r)
        notebook = tmp_path / "student" / LAB / f"{LAB}.ipynb"

    # As a student might: a cell of their own, and a line in an answer cell that the answer policy refuses. check runs
    # what the grader runs (the release with the answers in it), so it says that neither ran.
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    nb.cells.insert(3, nbformat.v4.new_code_cell("print('my own scratch cell')"))
    answer = next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    answer.source += "\nget_ipython().events.register('pre_run_cell', print)\n"
    notebook = tmp_path / f"{LAB}.ipynb"
    nbformat.write(nb, notebook)

    r = cli("check", notebook, env=env, cwd=tmp_path)
    assert r.returncode == 1, explain(r)
    assert "not run: cell 3 (\"print('my own scratch cell')\"): a cell you added" in r.stdout, explain(r)
    assert "refused, so the stub ran in its place: answer cell greedy, line" in r.stdout, explain(r)
    assert "my own scratch cell" not in r.stdout.split("running ")[-1], explain(r)
    assert "Traceback" not in r.stdout + r.stderr, explain(r)
    summary = re.search(r"^0 of (\d+) visible tests passed", r.stdout, re.M)
    assert summary and int(summary.group(1)) > 0, explain(r)
    assert "error: NotImplementedError" in r.stdout, explain(r)
    assert "hidden: runs when your notebook is graded" in r.stdout, explain(r)
