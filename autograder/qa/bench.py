"""``bench``: measure the autograder against its targets (measurements, not pass/fail tests).

  * grading one submission of the lab (its solution)               target <= 15 s
    (and once more without the sandbox, for the sandbox's cost)
  * grading a folder of N copies with W workers (20 and 2 by default) target <= 180 s
  * regress over lecture 01 and the lab                             target <= 90 s
Grading runs in private courses and leaves course/gradebook.db alone.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from autograder import course_paths, environment
from autograder.grade import autograde
from autograder.notebooks import assignments
from autograder.qa import regress

TARGETS = {"one": 15.0, "folder": 180.0, "regress": 90.0}


def _timed(fn):
    start = time.monotonic()
    value = fn()
    return value, time.monotonic() - start


def bench(copies: int = 20, workers: int = 2, lab: str = "lab01") -> int:
    environment.prepare(workers)
    chosen = course_paths.find_labs([lab])[0]
    assignments.generate(chosen)
    course_paths.COURSE.joinpath("tmp").mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-", dir=course_paths.COURSE / "tmp"))
    rows = []
    quiet = lambda *a, **k: None  # noqa: E731
    try:
        one = folder / "one" / f"student01_{chosen.name}.ipynb"
        one.parent.mkdir(parents=True)
        shutil.copyfile(chosen.source, one)
        graded, seconds = _timed(lambda: autograde.grade(one, lab=chosen.name, workers=1, merge_into_course=False, echo=quiet))
        rows.append(("grade 1 submission (1 worker, sandboxed)", seconds, TARGETS["one"], graded))
        # The same, without the sandbox, side by side: what the sandbox costs.
        graded, bare = _timed(lambda: autograde.grade(one, lab=chosen.name, workers=1, merge_into_course=False,
                                                    sandbox=False, echo=quiet))
        rows.append(("grade 1 submission (1 worker, --unsafe-no-sandbox)", bare, TARGETS["one"], graded))
        many = folder / "many"
        many.mkdir()
        for i in range(copies):
            shutil.copyfile(chosen.source, many / f"student{i + 1:02d}_{chosen.name}.ipynb")
        graded, seconds = _timed(lambda: autograde.grade(many, lab=chosen.name, workers=workers, merge_into_course=False, echo=quiet))
        rows.append((f"grade {copies} submissions ({workers} workers)", seconds, TARGETS["folder"], graded))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lectures = [nb for nb in course_paths.lectures() if nb.name.startswith("01")]
    names = [str(nb) for nb in lectures] + [str(chosen.source)]
    code, seconds = _timed(lambda: regress.regress(names, out=course_paths.BUILD / "bench-regress"))
    rows.append((f"regress {' + '.join(Path(n).stem for n in names)}", seconds, TARGETS["regress"], code))

    print("\n| measurement | seconds | target | within target |\n|---|---:|---:|---|")
    for name, seconds, target, _ in rows:
        print(f"| {name} | {seconds:.1f} | {target:.0f} | {'yes' if seconds <= target else 'NO'} |")
    print(f"\nsandboxed/unsandboxed grading time of one submission: {rows[0][1] / rows[1][1]:.2f}x")
    full = all(r.score == r.max_score for _, _, _, graded in rows[:3] for r in graded)
    if not full:
        print("warning: some copies of the solution did not get full marks")
    return 0 if full and code == 0 else 1
