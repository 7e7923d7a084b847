"""A lab's answer sheet: what each test cell observes of the course's solution, and how a submission is judged.

The sheet is made by grading the lab's source notebook (the solution) through the very pipeline students go
through, in the same sandbox, on the same hidden inputs: every observation its test cells hand out
(autograder/notebook_checks/ledger.py) becomes a row, whose expected value is the harness's own where it stated one (a
visible literal) and the solution's otherwise (a hidden case), with the harness's tolerance or bound.  A submission
is then judged against these rows outside the kernel (autograder/grade/verdicts.py).

Rows hold hidden expected values, so sheets live where no edition goes: ``build/sheets/`` (or
``$AUTOGRADER_SHEETS_DIR``), one file per lab, named by a hash of everything the observations depend on (the lab's
source, the grader's and the engine's code, the data and the hidden files): an edit anywhere makes a new sheet, built
once, under a lock, by whichever grading run needs it first.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from autograder import course_paths, results
from autograder.grade import verdicts

SHEETS = Path(os.environ.get("AUTOGRADER_SHEETS_DIR") or course_paths.REPO_ROOT / "build" / "sheets").resolve()
RULE_KEYS = ("tol", "rel", "at_most", "at_least", "judge", "baseline")
# What the observations depend on, besides the lab's own source notebook.
INPUTS = [("autograder", "*.py"), ("miniengine", "*.py"), ("data", "*"), ("autograder/hidden", "*")]


def key(lab: course_paths.Lab) -> str:
    h = hashlib.sha256(lab.source.read_bytes())
    for folder, pattern in INPUTS:
        root = course_paths.REPO_ROOT / folder
        for path in sorted(p for p in root.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts):
            h.update(path.relative_to(course_paths.REPO_ROOT).as_posix().encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:20]


def path(lab: course_paths.Lab) -> Path:
    return SHEETS / f"{lab.name}-{key(lab)}.json"


def load(lab: course_paths.Lab) -> dict | None:
    try:
        return json.loads(path(lab).read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return None


@contextlib.contextmanager
def lock(lab: course_paths.Lab):
    """One builder per lab at a time, across processes (two pytest workers, two grading runs)."""
    import fcntl

    SHEETS.mkdir(parents=True, exist_ok=True)
    fd = os.open(SHEETS / f"{lab.name}.lock", os.O_RDONLY | os.O_CREAT, 0o666)  # read-only: anyone may lock it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def from_graded(graded_nb, solution: results.StudentResult) -> dict[str, list[dict]]:
    """The sheet's rows, from the solution's graded notebook.  Refuses a solution that does not pass every test:
    a sheet made from a wrong run would grade every student against it."""
    failing = [f"{t.test} ({t.status}: {t.message})" for t in solution.tests if t.status != results.PASSED]
    if failing:
        raise course_paths.LabError(f"{solution.lab}: no answer sheet, since the solution does not pass "
                              f"{', '.join(failing)}")
    tests = {t.test for t in solution.tests}
    cells = {}
    for cell in graded_nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid not in tests:
            continue
        rows = verdicts.observations(cell) or []
        labels = [r["label"] for r in rows]
        if len(set(labels)) != len(labels):
            raise course_paths.LabError(f"{solution.lab}/{gid}: the harness observes a label twice: "
                                  f"{next(x for x in labels if labels.count(x) > 1)!r}")
        cells[gid] = [{"label": r["label"], "expect": r.get("expect", r["value"]),
                       **{k: r[k] for k in RULE_KEYS if k in r}} for r in rows]
    return cells


def write(lab: course_paths.Lab, cells: dict[str, list[dict]]) -> Path:
    target = path(lab)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps({"lab": lab.name, "key": key(lab), "cells": cells}) + "\n")
    os.replace(tmp, target)
    return target
