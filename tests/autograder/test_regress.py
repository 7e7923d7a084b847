"""``python -m autograder regress``: every lecture runs top to bottom with FAST=True.

The labs' source notebooks are run top to bottom, every cell, by ``verify`` (tests/autograder/test_verify.py), which
grades each solution in the sandbox with its measurements in their short form (the same path as FAST=True) and
fails on any cell that raises; running them here as well cost a minute and a half of make test's ten.
``regress`` itself runs labs too, for instructors: the CLI test below runs it on one."""
from __future__ import annotations

import json
import warnings

import nbformat
import pytest
from autograder_support import REPO, explain, isolated_env, run_cli
from graded_numbers import answers_shown, graded_numbers
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.slow


# A cell's execute_reply is sometimes noticed only when the client's wait for it times out: pyzmq's asyncio poll
# misses the wake-up and finds the message in its final check (zmq/_future.py), so the cell "passes" after exactly
# the per-cell timeout. It struck widget cells of lectures 04 and 08 at 300 s while two pytest workers shared the
# cores. A FAST notebook's cells take seconds, so this run waits at most STALL_S per cell, and a notebook that
# timed out is run again alone, with the default timeout, which gives the verdict.
STALL_S = 30


def _timed_out(row) -> bool:
    return row["status"] != "passed" and "timed out" in row["message"]


def test_every_notebook_runs(tmp_path):
    lectures = sorted((REPO / "lectures").glob("*.ipynb"))
    r = run_cli("regress", *lectures, "--workers", 2, "--timeout", STALL_S, env=isolated_env(tmp_path), cwd=tmp_path,
                timeout=600)
    summary = tmp_path / "build" / "regress" / "summary.json"
    assert summary.exists(), explain(r)
    rows = json.loads(summary.read_text())["notebooks"]
    failed = [f"{row['notebook']}: {row['message']}" for row in rows if row["status"] != "passed" and not _timed_out(row)]
    assert not failed, "\n".join(failed)
    names = {row["notebook"] for row in rows}
    assert names == {p.relative_to(REPO).as_posix() for p in lectures}
    for row in rows:  # the executed copies are kept, with outputs
        assert (tmp_path / "build" / "regress" / row["notebook"]).exists()
    # Lectures never print a lab's answer (tests/notebooks/test_lecture_answers.py holds the rule for code): lecture
    # NN shows no graded number of lab NN or of a later lab, in what it prints or says. The course runs lecture NN,
    # then lab NN, so a lab before it is done when it is read (lecture 02, on the KV cache, prints the tiny model's KV
    # bytes per token, which lab 01 asked first).
    numbers, printed = graded_numbers(), {}
    for row in rows:
        lecture = int(row["notebook"].split("/")[-1][:2])
        ahead = {name: v for name, v in numbers.items() if int(name[3:5]) >= lecture}
        found = answers_shown(json.loads((tmp_path / "build" / "regress" / row["notebook"]).read_text()), ahead)
        if found:
            printed[row["notebook"]] = found
    # A wall-clock measurement can spell a graded number by chance: lecture 05's measured "1.67x" read as lab 06's
    # SPEEDUP_DRAFT (1.674, from the cost model) and failed a CI run. An answer shown is the same on every run; a
    # measurement is not. A lecture that shows one is run again, and only what both runs show counts.
    for notebook, found in list(printed.items()):
        again = tmp_path / "answers_again"
        run_cli("regress", REPO / notebook, "--out", again, env=isolated_env(tmp_path), cwd=tmp_path, timeout=600)
        second = answers_shown(json.loads((again / notebook).read_text()), numbers)
        printed[notebook] = [name for name in found if name in second]
    printed = {notebook: found for notebook, found in printed.items() if found}
    assert not printed, f"lectures show the graded numbers of their own or later labs: {printed}"
    passed = sum(row["status"] == "passed" for row in rows)
    assert (tmp_path / "build" / "regress" / "summary.md").read_text().count("| passed |") == passed
    assert r.returncode == (0 if passed == len(rows) else 1), explain(r)
    # A notebook whose cell stalled until STALL_S (above) is run again, alone, and that run must pass.
    stalled = []
    for row in rows:
        if _timed_out(row):
            again = tmp_path / "again"
            run_cli("regress", REPO / row["notebook"], "--out", again, env=isolated_env(tmp_path), cwd=tmp_path, timeout=600)
            (retry,) = json.loads((again / "summary.json").read_text())["notebooks"]
            if retry["status"] != "passed":
                stalled.append(f"{row['notebook']}: {row['message']}, then alone: {retry['message']}")
            row["seconds"] = retry["seconds"]
    assert not stalled, "\n".join(stalled)
    # autograder/README.md, Notebook conventions, rule 7: every notebook runs top to bottom with FAST=True in under a
    # minute on 2 cores.  A time is a measurement, not a verdict (this machine is shared, and the suite shares its
    # two cores with other test files): over the budget is reported as a warning, with the time, not failed.
    slow = [f"{row['notebook']}: {row['seconds']:.1f} s" for row in rows if row["seconds"] >= 60]
    if slow:
        warnings.warn("over the 60 s FAST budget, sharing the cores with other tests: " + ", ".join(slow))


def test_a_failing_notebook_fails_the_run_and_a_lab_runs_beside_it(tmp_path):
    bad = tmp_path / "broken.ipynb"
    cells = [new_code_cell("FAST = False\nDEVICE = 'cpu'\nSEED = 0", metadata={"tags": ["parameters"]}),
             new_code_cell("assert FAST, 'papermill did not set FAST=True'"),
             new_code_cell("raise ValueError('boom')")]
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                      "language": "python"}}), str(bad))
    lab = REPO / "labs" / "lab03_roofline" / "lab03_roofline.ipynb"  # the quickest lab
    r = run_cli("regress", bad, lab, "--workers", 2, env=isolated_env(tmp_path), cwd=tmp_path, timeout=300)
    assert r.returncode == 1, explain(r)
    assert "ValueError: boom" in r.stdout
    rows = {row["notebook"]: row for row in json.loads((tmp_path / "build" / "regress" / "summary.json").read_text())["notebooks"]}
    assert rows[str(bad)]["status"] == "failed" and rows[str(bad)]["seconds"] > 0
    assert rows["labs/lab03_roofline/lab03_roofline.ipynb"]["status"] == "passed"
