"""``grade``: autograde submissions with nbgrader, each student in an isolated course, in parallel.

For every submission:
  1. a notebook that is not valid JSON or not a notebook is reported as ``corrupt
     notebook`` at once (nbgrader would fail the whole run on it: autograder/README.md, nbgrader fact 7);
  2. a private nbgrader course is made under course/tmp/: a copy of the gradebook
     (holding the lab's test cells, hidden tests included) and the submission;
  3. ``python -m autograder.worker`` runs nbgrader autograde there, with a time
     limit per cell and one for the whole notebook, and a memory limit in the kernel;
  4. each test cell gets its points and a status (``results``), and the results are
     merged into course/gradebook.db and course/autograded/ for ``feedback``.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from . import environment, layout, release, results, submissions
from .config import COURSE_ID
from .results import CORRUPT, ERROR, MISSING, TIMED_OUT, StudentResult, TestCell

DEFAULT_TIMEOUT = 60     # seconds per cell
DEFAULT_MEMORY_GB = 6.0  # address space per kernel; torch alone reserves a few GB of it


def student_time_limit(timeout: int) -> int:
    """The whole notebook's limit: room for a few cells to time out, but not for every cell to."""
    return max(120, 6 * int(timeout))


@dataclasses.dataclass
class LabInfo:
    lab: layout.Lab
    tests: list[TestCell]
    template_db: Path  # the lab's gradebook with no students: each private course starts from a copy
    originals: dict[str, set[str]]  # test cell id -> its source in the lab and in the release: anything else is an edit


def prepare_lab(lab: layout.Lab, run_dir: Path) -> LabInfo:
    import nbformat
    from nbgrader.api import Gradebook

    release.generate(lab)  # regenerates only when labs/<lab>/ changed since the last release
    template = run_dir / f"template-{lab.name}.db"
    shutil.copyfile(layout.COURSE / "gradebook.db", template)
    with Gradebook(f"sqlite:///{template}", COURSE_ID) as gb:
        for student in list(gb.students):
            for sub in list(student.submissions):
                gb.remove_submission(sub.assignment.name, student.id)
            gb.remove_student(student.id)
    tests = results.test_cells(nbformat.read(lab.source, as_version=4))
    originals = {t.grade_id: {t.source} for t in tests}
    for t in results.test_cells(nbformat.read(lab.release, as_version=4)):
        originals.setdefault(t.grade_id, set()).add(t.source)
    return LabInfo(lab, tests, template, originals)


def _kill_tree(proc: subprocess.Popen) -> None:
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


def _scores(db: Path, lab: str, student: str) -> dict[str, float | None]:
    from nbgrader.api import Gradebook, MissingEntry

    try:
        with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
            return {g.name: g.auto_score for g in gb.find_submission_notebook(lab, lab, student).grades}
    except MissingEntry:
        return {}


CHANGED = re.compile(r"Attribute '(\w+)' for cell (\S+) has changed! \(should be: (.*?), got: (.*?)\)")


def notes_from_submission(nb, info: LabInfo) -> list[str]:
    """Test cells whose source differs from the released one (nbgrader restores them before running).

    nbgrader's own checksum warning fires for every cell with hidden tests (autograder/README.md,
    nbgrader fact 3), so the comparison is with the released source instead.
    """
    notes = []
    for t in results.test_cells(nb):
        if t.grade_id in info.originals and t.source not in info.originals[t.grade_id]:
            notes.append(f"test cell {t.grade_id} was edited; the grader ran the original")
    return notes


def notes_from_log(log: str) -> list[str]:
    """What else nbgrader's OverwriteCells undid: raised points, a changed cell type."""
    notes = []
    for attr, cell, should, got in CHANGED.findall(log):
        if attr == "checksum":
            continue  # see notes_from_submission
        elif attr == "points":
            notes.append(f"the points of {cell} were changed to {got}; the grader used {should}")
        else:
            notes.append(f"the {attr} of cell {cell} was changed to {got}; the grader used {should}")
    return list(dict.fromkeys(notes))


def notes_from_outputs(nb, test_ids: set[str], timeout: int) -> list[str]:
    """Events in cells other than test cells that explain the test results: timeouts, exits, crashes."""
    notes = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in test_ids:
            continue
        label = f"cell {index}" + (f" ({gid})" if gid else "")
        for o in cell.get("outputs", []):
            if o.get("output_type") != "error":
                continue
            ename = o.get("ename")
            if ename in ("CellTimeoutError", "KeyboardInterrupt"):
                notes.append(f"{label} ran past the {timeout} s limit per cell and was interrupted")
                break
            if ename in ("SystemExit", "MemoryError", "DeadKernelError"):
                notes.append(f"{label}: {results.describe_error(ename, o.get('evalue'), 160)}")
                break
    return notes


def grade_one(sub: submissions.Submission, info: LabInfo, run_dir: Path, timeout: int, memory_gb: float,
              time_limit: int) -> tuple[StudentResult, Path]:
    import nbformat

    start = time.monotonic()
    lab = info.lab.name
    shown = str(sub.path)

    def done(tests, notes=()):
        return StudentResult(sub.student, lab, shown, tests, list(notes), time.monotonic() - start)

    root = run_dir / f"{sub.student}__{lab}"
    try:
        submitted_nb = nbformat.read(sub.path, as_version=4)
        nbformat.validate(submitted_nb)
    except Exception as e:  # JSON errors, a missing "cells" key, a non-notebook file: nothing can run
        reason = results.first_line(f"{type(e).__name__}: {e}", 200)
        return done(results.everything(info.tests, CORRUPT, f"cannot read the notebook: {reason}")), root

    submitted = root / "submitted" / sub.student / lab / f"{lab}.ipynb"
    submitted.parent.mkdir(parents=True)
    shutil.copyfile(sub.path, submitted)
    shutil.copyfile(info.template_db, root / "gradebook.db")
    cmd = [sys.executable, "-m", "autograder.worker", "--root", str(root), "--lab", lab, "--student", sub.student,
           "--timeout", str(timeout), "--memory-gb", str(memory_gb)]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=time_limit)
        capped = False
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        out, err = proc.communicate()
        capped = True

    log = (root / "worker.log").read_text() if (root / "worker.log").exists() else ""
    autograded = root / "autograded" / sub.student / lab / f"{lab}.ipynb"
    if capped:
        return done(results.everything(info.tests, TIMED_OUT,
                                       f"grading this notebook took over {time_limit} s in total and was stopped")), root
    if not autograded.exists():
        detail = results.first_line((log + err).strip().splitlines()[-1] if (log + err).strip() else "no output", 300)
        return done(results.everything(info.tests, ERROR, f"nbgrader could not grade this notebook: {detail}"),
                    notes_from_log(log)), root

    nb = nbformat.read(autograded, as_version=4)
    scores = _scores(root / "gradebook.db", lab, sub.student)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells if c.get("metadata", {}).get("nbgrader")}
    tests = []
    for t in info.tests:
        if t.grade_id not in cells:
            tests.append(results.TestResult(t.grade_id, 0.0, t.max_points, MISSING,
                                            "this test cell was deleted from the submission, so it scores 0", t.hidden))
        else:
            tests.append(results.judge(cells[t.grade_id], scores.get(t.grade_id), t, timeout))
    notes = (notes_from_submission(submitted_nb, info) + notes_from_log(log)
             + notes_from_outputs(nb, {t.grade_id for t in info.tests}, timeout))
    return done(tests, notes), root


def merge(result: StudentResult, root: Path) -> None:
    """Copy one student's grades and files from their private course into course/ (for feedback and formgrader)."""
    from nbgrader.api import Gradebook, MissingEntry

    import warnings

    from sqlalchemy.exc import SAWarning

    lab, student = result.lab, result.student
    warnings.simplefilter("ignore", SAWarning)  # nbgrader's add_submission trips SQLAlchemy 2's autoflush warning
    with Gradebook(f"sqlite:///{layout.COURSE / 'gradebook.db'}", COURSE_ID) as gb:
        gb.update_or_create_student(student)
        gb.update_or_create_submission(lab, student)
        for t in result.tests:
            try:
                g = gb.find_grade(t.test, lab, lab, student)
            except MissingEntry:
                continue
            g.auto_score = t.points
            g.needs_manual_grade = t.status == MISSING  # shows up in the formgrader for a human to look at
        gb.db.commit()
    for step in ("submitted", "autograded", "feedback"):
        dest = layout.COURSE / step / student / lab
        if dest.exists():
            shutil.rmtree(dest)
        src = root / step / student / lab
        if src.exists():
            shutil.copytree(src, dest)


def grade(path, lab: str | None = None, workers: int = 1, timeout: int = DEFAULT_TIMEOUT,
          memory_gb: float = DEFAULT_MEMORY_GB, time_limit: int | None = None, student: str | None = None,
          merge_into_course: bool = True, keep: bool = False, echo=print) -> list[StudentResult]:
    """Grade PATH (a notebook, a folder or a zip); returns one StudentResult per submission."""
    environment.prepare(workers)
    chosen = layout.find_labs([lab])[0] if lab else None
    if workers < 1 or timeout < 1:
        raise layout.LabError("--workers and --timeout must be at least 1")
    run_dir = layout.COURSE / "tmp" / f"grade-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True)
    try:
        subs = submissions.collect(Path(path), chosen, run_dir, student=student)
        infos = {}
        for sub in subs:
            if sub.lab.name not in infos:
                infos[sub.lab.name] = prepare_lab(sub.lab, run_dir)
        limit = time_limit or student_time_limit(timeout)
        echo(f"grading {len(subs)} submission{'s' * (len(subs) != 1)} with {workers} worker{'s' * (workers != 1)} "
             f"(limits: {timeout} s per cell, {limit} s per notebook, {memory_gb:g} GB per kernel)")
        graded: list[tuple[StudentResult, Path]] = []
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(grade_one, s, infos[s.lab.name], run_dir, timeout, memory_gb, limit) for s in subs]
            for n, fut in enumerate(as_completed(futures), 1):
                r, root = fut.result()
                graded.append((r, root))
                bad = {s: r.count(s) for s in results.STATUSES[1:] if r.count(s)}
                echo(f"[{n}/{len(subs)}] {r.student} ({r.lab}): {r.score:g}/{r.max_score:g}"
                     + (f", {', '.join(f'{v} {k}' for k, v in bad.items())}" if bad else "") + f"  ({r.seconds:.1f} s)")
        graded.sort(key=lambda x: (x[0].lab, x[0].student))
        if merge_into_course:
            for r, root in graded:
                merge(r, root)
        return [r for r, _ in graded]
    finally:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
