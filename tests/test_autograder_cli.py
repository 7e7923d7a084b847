"""The autograder as its users drive it: a student's release, check and grade; the instructor's verify.

Every run uses working folders of its own (AUTOGRADER_*_DIR), never the real
course/ or student/.
"""
from __future__ import annotations

import json
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from autograder import results
from test_autograder_support import REPO, explain, isolated_env, run_cli

pytestmark = pytest.mark.slow
LAB = "lab01_naive_decode"


def solutions() -> dict[str, str]:
    source = nbformat.read(REPO / "labs" / LAB / f"{LAB}.ipynb", as_version=4)
    out = {}
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            out[meta["grade_id"]] = "\n".join(ln for ln in cell.source.splitlines() if "### " not in ln)
    return out


def write_solutions(path, replace):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in replace:
            cell.source = replace[gid]
    nbformat.write(nb, str(path))


def test_student_workflow(tmp_path):
    env = isolated_env(tmp_path)
    student_nb = tmp_path / "student" / LAB / f"{LAB}.ipynb"

    # make lab: publish once, then never overwrite the student's work
    r = run_cli("release", "--if-missing", env=env, cwd=tmp_path)
    assert r.returncode == 0 and student_nb.exists(), explain(r)
    nb = nbformat.read(student_nb, as_version=4)
    assert "BEGIN HIDDEN TESTS" not in nbformat.writes(nb) and "BEGIN SOLUTION" not in nbformat.writes(nb)

    # an honest mistake: top-k drops the logits tied with the k-th largest (and its test cell "fixed" to pass)
    good = solutions()
    write_solutions(student_nb, {**good, "top_k_mask": good["top_k_mask"].replace("logits >= kth", "logits > kth"),
                                 "top-k-visible": "pass"})
    edited = student_nb.read_text()
    for args in (("release", "--if-missing"), ("release",)):
        r = run_cli(*args, env=env, cwd=tmp_path)
        assert r.returncode == 0, explain(r)
        assert student_nb.read_text() == edited, f"{args} overwrote the student's notebook"
    assert "kept your edited" in r.stdout

    r = run_cli("check", student_nb, env=env, cwd=tmp_path)
    assert r.returncode == 1, explain(r)
    assert "top-k-visible" in r.stdout and "top_k_mask([1.0, 3.0, 2.0, 3.0], k=1) should keep" in r.stdout
    assert "hidden: runs when your notebook is graded" in r.stdout  # hidden tests are listed, not run
    assert "greedy-visible            2 pts  passed" in r.stdout
    assert "you edited this test cell; it was checked with the original" in r.stdout

    # fixed: check passes, and the grader agrees
    released = nbformat.read(tmp_path / "course" / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    original_test = next(c.source for c in released.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "top-k-visible")
    write_solutions(student_nb, {**good, "top-k-visible": original_test})
    r = run_cli("check", student_nb, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "7 of 7 visible tests passed" in r.stdout, explain(r)
    r = run_cli("grade", student_nb, "--student", "me", "--out", tmp_path / "grades", env=env, cwd=tmp_path)
    assert r.returncode == 0, explain(r)
    graded = json.loads((tmp_path / "grades" / "grades.json").read_text())["students"]
    assert [(s["student"], s["score"], s["max_score"]) for s in graded] == [("me", 28, 28)]


def test_a_notebook_over_its_total_time_limit_is_stopped(tmp_path):
    """The last line of defence: the whole notebook's limit kills the worker and its kernel, and says so."""
    from test_autograder_support import FIXTURES

    r = run_cli("grade", FIXTURES / "c_toplevel_loop.ipynb", "--lab", "lab01", "--timeout", 60,
                "--notebook-timeout", 12, "--out", tmp_path / "grades", env=isolated_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, explain(r)
    (student,) = json.loads((tmp_path / "grades" / "grades.json").read_text())["students"]
    assert {t["status"] for t in student["tests"]} == {"timeout"} and student["score"] == 0
    assert "took over 12 s in total" in student["tests"][0]["message"]
    assert student["seconds"] < 45


def test_a_worker_that_dies_is_reported_as_such_not_as_failed_tests(tmp_path):
    """A worker killed from outside (the OOM killer, an operator) costs every test, with the reason given."""
    import subprocess
    import sys
    import threading
    import time

    import psutil

    from test_autograder_support import FIXTURES

    cmd = [sys.executable, "-m", "autograder", "grade", str(FIXTURES / "c_toplevel_loop.ipynb"), "--lab", "lab01",
           "--timeout", "60", "--student", "victim", "--out", str(tmp_path / "grades")]
    proc = subprocess.Popen(cmd, env=isolated_env(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    killed = []

    def kill_the_worker():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            for p in psutil.process_iter(["cmdline"]):
                line = " ".join(p.info["cmdline"] or [])
                if "autograder.worker" in line and "victim" in line:
                    time.sleep(3)  # let it start the kernel: the loop cell keeps it busy
                    p.kill()
                    killed.append(p.pid)
                    return
            time.sleep(0.2)

    threading.Thread(target=kill_the_worker, daemon=True).start()
    out, err = proc.communicate(timeout=120)
    assert killed and proc.returncode == 0, out + err
    (student,) = json.loads((tmp_path / "grades" / "grades.json").read_text())["students"]
    assert {t["status"] for t in student["tests"]} == {"error"} and student["score"] == 0
    assert student["tests"][0]["message"].startswith("grading process died (signal 9)"), student["tests"][0]


def _test_cell(grade_id: str, source: str):
    return new_code_cell(source, metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                                        "grade_id": grade_id, "points": 1, "schema_version": 3}})


@pytest.fixture(scope="module")
def checked_synthetic(tmp_path_factory):
    """``check`` with a 3 s limit per cell on a tiny lab: a measurement written the labs' way, then an ungraded
    cell and a test cell that each sleep past the limit.  One run (about 10 s) serves the tests below."""
    work = tmp_path_factory.mktemp("check")
    cells = [
        new_code_cell("FAST = False\nDEVICE = 'cpu'\nSEED = 0", metadata={"tags": ["parameters"]}),
        # autograder/README.md, Notebook conventions, rule 2: the grader always runs the short version
        new_code_cell("import os, time\nn_new = 48 if FAST or os.environ.get('NBGRADER_EXECUTION') else 320"),
        _test_cell("measured-short", "assert n_new == 48, f'the measurement ran {n_new} tokens, not the short 48'\n"
                                     "assert os.environ['NBGRADER_EXECUTION'] == 'autograde'"),
        new_code_cell("time.sleep(60)"),
        _test_cell("sleeps", "time.sleep(60)"),
        _test_cell("after", "assert n_new == 48"),  # the kernel goes on after an interrupted cell
    ]
    notebook = work / "timing.ipynb"
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                      "language": "python"}}), str(notebook))
    return run_cli("check", notebook, "--timeout", 3, env=isolated_env(work), cwd=work, timeout=120)


def _status(r, grade_id: str) -> str:
    found = re.search(rf"^  {re.escape(grade_id)}\s+1 pts  (.*)$", r.stdout, re.M)
    assert found, f"no line for {grade_id}\n" + explain(r)
    return found.group(1)


def test_check_runs_measurements_short_as_grading_does(checked_synthetic):
    r = checked_synthetic
    assert _status(r, "measured-short") == results.PASSED, explain(r)
    assert "measurements run short, as when graded" in r.stdout


def test_check_reports_a_timeout_as_a_timeout(checked_synthetic):
    r = checked_synthetic
    assert r.returncode == 1 and "2 of 3 visible tests passed" in r.stdout, explain(r)
    # a test cell: the grader's status for it, with its reason
    assert _status(r, "sleeps") == f"{results.TIMED_OUT}: ran past the 3 s limit per cell and was interrupted", explain(r)
    # an ungraded cell: a note that says what happened, not the KeyboardInterrupt the interrupt raised in it
    assert "note: cell 3 ran past the 3 s limit per cell and was interrupted" in r.stdout, explain(r)
    assert "KeyboardInterrupt" not in r.stdout, explain(r)
    assert _status(r, "after") == results.PASSED, explain(r)
