"""``grade``: autograde submissions with nbgrader, each student in an isolated course, in parallel.

For every submission:
  1. a notebook that is not valid JSON or not a notebook is reported as ``corrupt
     notebook`` at once (nbgrader would fail the whole run on it: autograder/README.md, nbgrader fact 7);
  2. a private nbgrader course is made under course/tmp/: a copy of the lab's gradebook,
     built from labs/ in this run (never copied from course/), and the submission;
  3. ``python -m autograder.grade.worker`` runs nbgrader autograde there, with a time
     limit per cell and one for the whole notebook; the kernel runs in the student's
     own bubblewrap sandbox (``autograder.sandbox.bubblewrap``; ``autograder.sandbox.isolation`` picks the mode);
  4. each test cell gets its points and a status (``results``).  A hidden test that
     reports outputs is compared here, outside the sandbox, with the hidden golden
     files (``autograder.hidden_outputs``).  Messages pass an allow-list (``safe_message``);
  5. the results are merged into course/gradebook.db and course/autograded/.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from autograder import course_paths, environment, results
from autograder.grade import sheets, submissions, verdicts
from autograder.grade.lab_prep import LabInfo, load_hidden, only_tests as keep_only, prepare_lab, write_hidden_inputs
from autograder.grade.messages import (DIED, judge_hidden_outputs, notes_from_log, notes_from_outputs,
                                       notes_from_submission, redact, safe_message)
from autograder.notebooks import assembly
from autograder.notebooks.nbgrader_config import COURSE_ID
from autograder.results import CORRUPT, ERROR, MISSING, TIMED_OUT, StudentResult
from autograder.sandbox import cgroups, isolation
from autograder.sandbox.processes import kill_tree, last_words

DEFAULT_TIMEOUT = 60     # seconds per cell
DEFAULT_MEMORY_GB = 6.0  # address space per kernel; torch alone reserves a few GB of it


def student_time_limit(timeout: int) -> int:
    """The whole notebook's limit: room for a few cells to time out, but not for every cell to."""
    return max(120, 6 * int(timeout))


def _scores(db: Path, lab: str, student: str) -> dict[str, float | None]:
    from nbgrader.api import Gradebook, MissingEntry

    try:
        with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
            return {g.name: g.auto_score for g in gb.find_submission_notebook(lab, lab, student).grades}
    except MissingEntry:
        return {}


def grade_one(sub: submissions.Submission, info: LabInfo, run_dir: Path, timeout: int, memory_gb: float,
              time_limit: int, mode: str = isolation.NONE, inputs: Path | None = None) -> tuple[StudentResult, Path]:
    """Grade one submission; its kernel runs in a sandbox of the ``mode`` isolation.choose() picked (or none)."""
    import nbformat

    start = time.monotonic()
    lab = info.lab.name
    shown = str(sub.path)
    root = run_dir / f"{sub.student}__{lab}"
    mine, mine_notes = submissions.handed_in_mine(sub, root / "mine")  # lab 10 serves them: a copy, read-only
    kept = isolation.KernelBox(mode, root, memory_gb, time_limit, inputs, [t.grade_id for t in info.tests if t.hidden],
                               mine)

    refusals: list[str] = []

    def done(tests, notes=()):
        return StudentResult(sub.student, lab, shown, tests, list(notes), time.monotonic() - start, mode,
                             kept.memory_cap, refusals, "as submitted" if info.as_submitted else "assembled")

    try:
        submitted_nb = nbformat.read(sub.path, as_version=4)
        nbformat.validate(submitted_nb)
    except Exception as e:  # JSON errors, a missing "cells" key, a non-notebook file: nothing can run
        reason = results.first_line(f"{type(e).__name__}: {e}", 200)
        return done(results.everything(info.tests, CORRUPT, f"cannot read the notebook: {reason}")), root

    # What runs is the course's notebook with the submission's answers in it, each answer cell read first.
    assembled = (assembly.Assembled(submitted_nb, [], [], []) if info.as_submitted
                 else assembly.assemble(info.template, submitted_nb, info.policy))
    refusals[:] = [str(r) for r in assembled.refusals]
    submitted = root / "submitted" / sub.student / lab / f"{lab}.ipynb"
    submitted.parent.mkdir(parents=True)
    nbformat.write(assembled.notebook, submitted)
    shutil.copyfile(info.template_db, root / "gradebook.db")
    cmd = [sys.executable, "-m", "autograder.grade.worker", "--root", str(root), "--lab", lab, "--student", sub.student,
           "--timeout", str(timeout), "--memory-gb", str(memory_gb)]
    with kept as box:  # on leaving: whatever of the sandbox still runs is killed, its cgroup removed
        if box is not None:
            cmd += ["--sandbox", json.dumps(dataclasses.asdict(box))]
        elif mine is not None:
            cmd += ["--mine", str(mine)]
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=time_limit)
            capped = False
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            out, err = last_words(proc)
            capped = True

    log = (root / "worker.log").read_text() if (root / "worker.log").exists() else ""
    autograded = root / "autograded" / sub.student / lab / f"{lab}.ipynb"
    if capped:
        return done(results.everything(info.tests, TIMED_OUT,
                                       f"grading this notebook took over {time_limit} s in total and was stopped")), root
    if proc.returncode != 0:  # the worker always exits 0 when it finishes (nbgrader's own failures included)
        # nbgrader copies the notebook into autograded/ before running it, so that file proves nothing here.
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        last = (err or "").strip().splitlines()[-1:] or [""]
        return done(results.everything(info.tests, ERROR, f"{DIED} ({how}) before the notebook was graded"
                                       + (f": {results.first_line(last[0], 200)}" if last[0] else ""))), root
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
            cell = cells[t.grade_id]
            r = results.judge(cell, scores.get(t.grade_id), t, timeout)
            r = dataclasses.replace(r, message=safe_message(r, cell, info.secrets))
            r = judge_hidden_outputs(r, cell, info)
            rows = (info.sheet or {}).get(t.grade_id) or None  # a cell that observes nothing: see verify
            r = verdicts.judge(r, cell, rows)
            tests.append(dataclasses.replace(r, message=redact(r.message, info.secrets)))
    notes = (assembled.notes() + mine_notes + notes_from_submission(submitted_nb, info) + notes_from_log(log)
             + notes_from_outputs(nb, {t.grade_id for t in info.tests}, timeout))
    notes = [redact(n, info.secrets) for n in notes]
    if kept.out_of_memory:
        notes.append(f"the submission reached its memory cap ({kept.memory_cap}, all its processes together)"
                     + (", and the kernel's OOM killer stopped a process of it" if kept.out_of_memory == "oom" else ""))
    if kept.stray:
        notes.append(f"{kept.stray} process(es) of this submission were still running after grading and were killed")
    return done(tests, notes), root


def answer_sheets(infos: dict[str, LabInfo], run_dir: Path, timeout: int, memory_gb: float, limit: int, mode: str,
                  inputs: Path, workers: int, echo) -> dict[str, tuple[StudentResult, Path]]:
    """Each lab's answer sheet (autograder/grade/sheets.py), made first where it is missing by grading the lab's source
    notebook; returns those gradings, which a submission identical to the source reuses (verify's solution)."""
    made: dict[str, tuple[StudentResult, Path]] = {}

    def make(info: LabInfo):
        import nbformat

        with sheets.lock(info.lab):
            info.sheet = sheets.load(info.lab)
            if info.sheet is not None:
                return
            echo(f"making the answer sheet of {info.lab.name} (grading its solution)")
            sub = submissions.Submission("answer-sheet", info.lab, info.lab.source)
            result, root = grade_one(sub, info, run_dir, timeout, memory_gb, limit, mode, inputs)
            graded = root / "autograded" / sub.student / info.lab.name / f"{info.lab.name}.ipynb"
            info.sheet = sheets.from_graded(nbformat.read(graded, as_version=4) if graded.exists() else None, result)
            sheets.write(info.lab, info.sheet)
            made[info.lab.name] = (result, root)

    for info in infos.values():  # read here, made below where missing
        info.sheet = sheets.load(info.lab)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for fut in [pool.submit(make, info) for info in infos.values() if info.sheet is None]:
            fut.result()
    return made


def _is_source(sub: submissions.Submission, made: dict) -> bool:
    """The lab's source notebook, handed in with no saved parts: the grading that made the sheet is its grading."""
    return sub.lab.name in made and sub.mine is None and Path(sub.path).read_bytes() == sub.lab.source.read_bytes()


def _reuse(sub: submissions.Submission, made: tuple[StudentResult, Path]) -> tuple[StudentResult, Path]:
    """The grading that made the sheet, as this submission's (the same notebook: grading it again would repeat it)."""
    return dataclasses.replace(made[0], student=sub.student, submission=str(sub.path)), made[1]


def merge(result: StudentResult, root: Path) -> None:
    """Copy one student's grades and files from their private course into course/ (for feedback and formgrader)."""
    import warnings

    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy.exc import SAWarning

    lab, student = result.lab, result.student
    warnings.simplefilter("ignore", SAWarning)  # nbgrader's add_submission trips SQLAlchemy 2's autoflush warning
    with Gradebook(f"sqlite:///{course_paths.COURSE / 'gradebook.db'}", COURSE_ID) as gb:
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
        dest = course_paths.COURSE / step / student / lab
        if dest.exists():
            shutil.rmtree(dest)
        src = root / step / student / lab / f"{lab}.ipynb"  # the notebook only: the sandbox never wrote here
        if src.exists():
            dest.mkdir(parents=True)
            shutil.copyfile(src, dest / src.name)
    # What `feedback` may show, written by the trusted side after the sandbox is gone.
    dest = course_paths.COURSE / "autograded" / student / lab
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "result.json").write_text(json.dumps(results.to_json([result])["students"][0], indent=1) + "\n")


AS_SUBMITTED_WARNING = ("WARNING: grading the notebooks as submitted (--as-submitted): cells a student added run, and "
                        "no answer policy reads the answers, so code in them can change how the tests run. Use this "
                        "only to test the sandbox; grades.json records it.")
UNSAFE_WARNING = ("WARNING: grading without a sandbox (--unsafe-no-sandbox): every submission runs with your own "
                  "rights, and can read the hidden tests' data, change files and other students' grades. "
                  "Use this only for notebooks you trust; grades.json records it.")


def grade(path, lab: str | None = None, workers: int = 1, timeout: int = DEFAULT_TIMEOUT,
          memory_gb: float = DEFAULT_MEMORY_GB, time_limit: int | None = None, student: str | None = None,
          merge_into_course: bool = True, keep: bool = False, sandbox: bool = True, echo=print,
          only_tests: dict[str, set[str]] | None = None, as_submitted: bool = False,
          mine: Path | None = None) -> list[StudentResult]:
    """Grade PATH (a notebook, a folder or a zip); returns one StudentResult per submission.

    ``sandbox=False`` (the CLI's --unsafe-no-sandbox) runs kernels unsandboxed, with one warning; without it,
    grading refuses to start where no sandbox can be made.  ``mine``: the saved parts handed in with one notebook
    (submissions.py; lab 10 serves them).  ``only_tests`` (verify's baseline) maps a student id to
    the test cells its graded notebook keeps; the others are left out, and report as missing.
    """
    environment.prepare(workers)
    chosen = course_paths.find_labs([lab])[0] if lab else None
    if workers < 1 or timeout < 1:
        raise course_paths.LabError("--workers and --timeout must be at least 1")
    mode = isolation.NONE
    if sandbox:
        try:
            mode = isolation.choose()
        except isolation.Unavailable as e:
            raise course_paths.LabError(f"no sandbox can be made for the submissions' kernels: {e}. Submissions are "
                                  f"untrusted code; to grade notebooks you trust without one, pass --unsafe-no-sandbox")
        echo(f"sandbox: {mode} ({isolation.DESCRIPTION[mode]}); memory cap per submission: "
             f"{isolation.memory_cap_name((cgroups.find() or (None,))[0], memory_gb)}")
    else:
        echo(UNSAFE_WARNING)
    if as_submitted:
        echo(AS_SUBMITTED_WARNING)
    run_dir = course_paths.COURSE / "tmp" / f"grade-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True)
    try:
        subs = submissions.collect(Path(path), chosen, run_dir, student=student, mine=mine)
        infos, hidden = {}, load_hidden()
        for sub in subs:
            if sub.lab.name not in infos:
                infos[sub.lab.name] = prepare_lab(sub.lab, run_dir, hidden)
                infos[sub.lab.name].as_submitted = as_submitted
        limit = time_limit or student_time_limit(timeout)
        echo(f"grading {len(subs)} submission{'s' * (len(subs) != 1)} with {workers} worker{'s' * (workers != 1)} "
             f"(limits: {timeout} s per cell, {limit} s per notebook, {memory_gb:g} GB per kernel)")
        graded: list[tuple[StudentResult, Path]] = []
        inputs = write_hidden_inputs(run_dir, hidden)
        solutions = answer_sheets(infos, run_dir, timeout, memory_gb, limit, mode, inputs, workers, echo)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_reuse, s, solutions[s.lab.name]) if _is_source(s, solutions)
                       else pool.submit(grade_one, s, keep_only(infos[s.lab.name], (only_tests or {}).get(s.student)),
                                        run_dir, timeout, memory_gb, limit, mode, inputs)
                       for s in subs]
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
