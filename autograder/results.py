"""Grades per student and per test cell: the status of each, and the CSV, JSON and table that report them.

A test cell's status is one of:
    passed            full points
    partial           a design target missed, but better than the course's baseline: a share of the points
    failed            an assertion failed (the message says which case, step and token)
    error             any other exception, e.g. NameError or NotImplementedError, or the kernel died
    timeout           the cell ran past the per-cell limit, or the whole notebook past the per-student one
    missing test cell the student deleted it: nbgrader silently gives no points (autograder/README.md, nbgrader fact 4)
    corrupt notebook  the file is not a readable notebook, so nothing ran
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
from pathlib import Path

from autograder.notebooks.execute import KERNEL_DIED, NOT_RUN, TIMEOUT

PASSED, PARTIAL, FAILED, ERROR, TIMED_OUT, MISSING, CORRUPT = (
    "passed", "partial", "failed", "error", "timeout", "missing test cell", "corrupt notebook")
STATUSES = (PASSED, PARTIAL, FAILED, ERROR, TIMED_OUT, MISSING, CORRUPT)


@dataclasses.dataclass
class TestCell:
    """A test cell of a lab's source notebook."""

    grade_id: str
    max_points: float
    hidden: bool
    source: str = dataclasses.field(default="", repr=False)


@dataclasses.dataclass
class TestResult:
    test: str
    points: float
    max_points: float
    status: str
    message: str = ""
    hidden: bool = False


@dataclasses.dataclass
class StudentResult:
    student: str
    lab: str
    submission: str
    tests: list[TestResult]
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    sandbox: str = "bubblewrap-root"  # or "bubblewrap-userns" (autograder.sandbox.isolation), or "none": --unsafe-no-sandbox
    memory_cap: str = ""  # e.g. "cgroup v1 memory.limit_in_bytes 6 GB", "RLIMIT_AS 6 GB per process"
    refusals: list[str] = dataclasses.field(default_factory=list)  # answer cells the policy refused (answer_policy)
    notebook: str = "assembled"  # the course's notebook with the answers (assembly); "as submitted": --as-submitted

    @property
    def score(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_points for t in self.tests)

    def count(self, status: str) -> int:
        return sum(t.status == status for t in self.tests)


def answer_cells(nb) -> list[tuple[str, float]]:
    """The lab's answers for a TA (its reflection questions): nbgrader's manually graded cells with points, as
    (grade id, points).  The autograder scores none of them; nbgrader's formgrader shows each with its rubric."""
    return [(c.metadata.nbgrader["grade_id"], float(c.metadata.nbgrader.get("points", 0))) for c in nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("grade") and c.metadata.nbgrader.get("solution")
            and float(c.metadata.nbgrader.get("points", 0)) > 0]


def test_cells(nb) -> list[TestCell]:
    """The autograded test cells of a source notebook, in order."""
    cells = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution") and cell.cell_type == "code":
            cells.append(TestCell(meta["grade_id"], float(meta.get("points", 0)),
                                  "BEGIN HIDDEN TESTS" in cell.source, cell.source))
    return cells


ANSI = re.compile(r"\x1b\[[0-9;]*m")  # tracebacks and some messages carry terminal colours
# A message is kept whole up to this many characters: every real one is far shorter (a few hundred at most), and
# the cap keeps a submission's megabyte-long assertion out of grades.csv and the feedback page.
MESSAGE_LIMIT = 4000
CUT = "[... {n} more characters cut here; the cell's own output in the notebook shows the message whole]"


def first_line(text: str, limit: int = 300) -> str:
    """The first line of a text, without ANSI colours, cut to ``limit``: for the grader's own one-line reasons."""
    lines = [ln for ln in ANSI.sub("", str(text)).splitlines() if ln.strip()]
    text = (lines[0].rstrip() + (" ..." if len(lines) > 1 else "")) if lines else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def whole(text, limit: int = MESSAGE_LIMIT) -> str:
    """A test's message as the student should read it: every line of it, without ANSI colours or blank lines at
    either end.  Only a message over ``limit`` characters is cut, and then it says so and where the whole one is."""
    lines = [ln.rstrip() for ln in ANSI.sub("", str(text or "")).splitlines()]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit] + " " + CUT.format(n=len(text) - limit)


def describe_error(ename, evalue, limit: int = MESSAGE_LIMIT) -> str:
    """'NameError: name x is not defined', or just 'NotImplementedError' when there is no message."""
    message = whole(evalue, limit)
    return f"{ename}: {message}" if message else str(ename)


def indented(message: str, indent: int) -> str:
    """A message of several lines for a table: its later lines start under its first (``indent`` columns in)."""
    return message.replace("\n", "\n" + " " * indent)


# What a cell that ran past the per-cell limit holds: nbgrader's Execute interrupts the kernel, so the cell
# raises KeyboardInterrupt, and then adds its own CellTimeoutError.  Nobody else interrupts a grading
# kernel, so either one means the limit was hit.
TIMEOUT_ERRORS = (TIMEOUT, "KeyboardInterrupt")


def timed_out(cell) -> bool:
    """Whether an executed cell ran past the per-cell limit and was interrupted."""
    return any(o.get("output_type") == "error" and o.get("ename") in TIMEOUT_ERRORS for o in cell.get("outputs", []))


def timeout_message(timeout: int) -> str:
    return f"ran past the {timeout} s limit per cell and was interrupted"


def judge(cell, score: float | None, test: TestCell, timeout: int) -> TestResult:
    """The status of one autograded test cell, from nbgrader's score and the cell's outputs."""
    points = float(score or 0.0)
    outputs = cell.get("outputs", [])
    errors = [o for o in outputs if o.get("output_type") == "error"]

    def result(status, message=""):
        return TestResult(test.grade_id, points if status == PASSED else min(points, test.max_points),
                          test.max_points, status, whole(message), test.hidden)

    if timed_out(cell):
        return result(TIMED_OUT, timeout_message(timeout))
    if points >= test.max_points and not errors:
        return result(PASSED)
    if errors:
        e = errors[0]
        if e.get("ename") == "AssertionError":
            return result(FAILED, e.get("evalue") or "an assertion failed")
        if e.get("ename") in (KERNEL_DIED, NOT_RUN):
            return result(ERROR, e.get("evalue"))
        return result(ERROR, describe_error(e.get("ename"), e.get("evalue")))
    stderr = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr")
    if stderr:
        return result(FAILED, f"the cell wrote to stderr, which nbgrader counts as a failure: {stderr}")
    return result(FAILED, f"scored {points:g} of {test.max_points:g}")


def everything(tests: list[TestCell], status: str, message: str) -> list[TestResult]:
    return [TestResult(t.grade_id, 0.0, t.max_points, status, message, t.hidden) for t in tests]


# ---------------------------------------------------------------- reports

def write_csv(results: list[StudentResult], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "lab", "test", "hidden", "points", "max_points", "status", "message"])
        for r in results:
            for t in r.tests:
                w.writerow([r.student, r.lab, t.test, t.hidden, f"{t.points:g}", f"{t.max_points:g}", t.status, t.message])


def to_json(results: list[StudentResult]) -> dict:
    return {"students": [
        {"student": r.student, "lab": r.lab, "submission": r.submission, "score": r.score, "max_score": r.max_score,
         "seconds": round(r.seconds, 1), "sandbox": r.sandbox,
         "memory_cap": r.memory_cap, "notebook": r.notebook, "refusals": r.refusals, "notes": r.notes,
         "tests": [dataclasses.asdict(t) for t in r.tests]}
        for r in results]}


def from_json(data: dict) -> list[StudentResult]:
    return [StudentResult(s["student"], s["lab"], s["submission"], [TestResult(**t) for t in s["tests"]],
                          s.get("notes", []), s.get("seconds", 0.0), s.get("sandbox", "bubblewrap"),
                          s.get("memory_cap", ""), s.get("refusals", []), s.get("notebook", "assembled"))
            for s in data["students"]]


def write_json(results: list[StudentResult], path: Path) -> None:
    path.write_text(json.dumps(to_json(results), indent=1) + "\n")


def _replace(path: Path, write) -> None:
    """Write to a temporary file beside ``path``, then rename: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def write_reports(results: list[StudentResult], out: Path) -> tuple[Path, Path, int]:
    """grades.csv and grades.json in ``out``, merged with what is there: a student graded again gets the new
    grade, and students graded earlier (another folder, another day) keep theirs.  Returns the two paths and
    how many earlier students were kept."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out / "grades.csv", out / "grades.json"
    new = {(r.student, r.lab) for r in results}
    kept = []
    if json_path.exists():
        try:
            kept = [r for r in from_json(json.loads(json_path.read_text())) if (r.student, r.lab) not in new]
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"{json_path} is not a grades file this grader wrote ({e}); move it away and grade again")
    merged = sorted(kept + list(results), key=lambda r: (r.lab, r.student))
    _replace(csv_path, lambda p: write_csv(merged, p))
    _replace(json_path, lambda p: write_json(merged, p))
    return csv_path, json_path, len(kept)


def log_run(out: Path, graded: list[StudentResult]) -> Path:
    """Append one line per run to grading.log: when, how, and the SHA-256 of the grade files just written.

    The files are written after every sandbox is gone; a later change to them shows as a hash mismatch.
    """
    import hashlib
    import time

    out = Path(out)
    hashes = " ".join(f"{name} sha256={hashlib.sha256((out / name).read_bytes()).hexdigest()}"
                      for name in ("grades.csv", "grades.json"))
    modes = ",".join(sorted({r.sandbox for r in graded})) or "-"
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} graded={len(graded)} sandbox={modes} {hashes}\n"
    log = out / "grading.log"
    with open(log, "a") as f:
        f.write(line)
    return log


def table(results: list[StudentResult], details: bool = True) -> str:
    """The summary a grader reads first: one row per student, then what went wrong, test by test."""
    heads = ["student", "lab", "score", "passed", "partial", "failed", "error", "timeout", "missing", "seconds"]
    rows = []
    for r in results:
        corrupt = r.count(CORRUPT) > 0
        rows.append([r.student, r.lab, f"{r.score:g}/{r.max_score:g}",
                     *(str(r.count(s)) for s in (PASSED, PARTIAL, FAILED, ERROR, TIMED_OUT, MISSING)),
                     f"{r.seconds:.1f}"] + (["corrupt notebook"] if corrupt else []))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)) + ("  " + "  ".join(row[len(heads):]) if len(row) > len(heads) else ""))
    if details:
        for r in results:
            problems = [t for t in r.tests if t.status != PASSED]
            if not problems and not r.notes:
                continue
            lines.append("")
            lines.append(f"{r.student} ({r.lab}):")
            for note in r.notes:
                lines.append(f"  note: {note}")
            if r.count(CORRUPT) == len(r.tests) and r.tests:
                lines.append(f"  every test: corrupt notebook: {r.tests[0].message}")
                continue
            for t in problems:
                lines.append(indented(f"  {t.test:<26} {t.status:<17} {t.message}", 2 + 27 + 18))
    return "\n".join(lines)
