"""``check NOTEBOOK``: a student's own run of the visible tests, outside JupyterLab.

Runs the notebook the grader will run, in a fresh kernel: the lab's release with the student's answer cells in
it (autograder/notebooks/assembly.py), each answer cell read first by the answer policy (autograder/answer_policy/), so a
cell the student added, a given or test cell they edited, or an answer the policy refuses, is treated here as the
grader will treat it, and said so.  The notebook file itself is not modified.  Then it prints every test cell's
result the way the grader would judge it.  Hidden test cells are empty in the student edition: they are listed,
not run.
Like the grader, it runs the labs' measurements short (``GRADING_ENVIRONMENT``).
Exit status 0 when every visible test passed.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import time
from pathlib import Path
from unittest import mock

from autograder import course_paths, environment, results
from autograder.kernel_limits import MEMORY_ENV
from autograder.notebooks import assembly

# What nbgrader's autograde puts in the environment of the kernel that grades (nbgrader/converters/autograde.py).
# The labs' timing cells run their short version when NBGRADER_EXECUTION is set (autograder/README.md, Notebook
# conventions, rule 2), so check, which previews the grade, sets it the same way: the same short runs, the same
# value for any cell that looks at it, and a check about as long as grading instead of minutes longer.
GRADING_ENVIRONMENT = {"NBGRADER_EXECUTION": "autograde"}


def _is_empty(source: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith("#") for line in source.splitlines())


def check(notebook: Path, timeout: int = 120, memory_gb: float = 6.0) -> int:
    import nbformat
    from nbgrader.utils import compute_checksum, determine_grade

    from autograder.notebooks.execute import GuardedExecute, kernel_arguments

    notebook = Path(notebook)
    if not notebook.is_file():
        raise course_paths.LabError(f"{notebook}: no such notebook")
    try:
        nb = nbformat.read(notebook, as_version=4)
        nbformat.validate(nb)
    except Exception as e:
        raise course_paths.LabError(f"{notebook}: not a readable notebook ({type(e).__name__}: {str(e)[:200]})") from None
    tests = results.test_cells(nb)
    if not tests:
        raise course_paths.LabError(f"{notebook}: no test cells found (is this a lab notebook?)")

    environment.prepare()
    os.environ.setdefault(MEMORY_ENV, str(memory_gb))
    edited = {c.metadata.nbgrader["grade_id"] for c in nb.cells
              if c.get("metadata", {}).get("nbgrader", {}).get("grade") and "checksum" in c.metadata.nbgrader
              and not c.metadata.nbgrader.get("solution") and compute_checksum(c) != c.metadata.nbgrader["checksum"]}
    submitted = nb
    template = find_template(nb)
    if template is None:
        print("note: the lab's release is not at hand, so your notebook runs as it is (the grader runs the lab's "
              "release with your answer cells in it)")
        restored = restore_test_cells(nb, edited)
    else:
        assembled = assembly.assemble(template, nb)
        nb, restored = assembled.notebook, set(edited)
        for note in assembled.notes():
            print(results.indented(f"note: {note}", 6))
    tests = results.test_cells(nb)
    print(f"running {notebook} in a fresh kernel ({timeout} s per cell; measurements run short, as when graded) ...",
          flush=True)
    start = time.monotonic()
    executor = GuardedExecute(timeout=timeout, kernel_name="python3", extra_arguments=kernel_arguments())
    # The kernel inherits the environment when it starts; patch.dict puts back whatever was there before. Lab 10
    # serves the saved parts handed in with it: here, the mine/ that you would hand in.
    from autograder.own.registry import mine_dir

    where = mine_dir()
    mine = {"MINIENGINE_MINE": str(where)} if where.is_dir() else {}
    with mock.patch.dict(os.environ, {**GRADING_ENVIRONMENT, **mine}):
        ran, _ = executor.preprocess(copy.deepcopy(nb), {"metadata": {"path": str(notebook.parent.resolve())}})
    seconds = time.monotonic() - start

    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in ran.cells if c.get("metadata", {}).get("nbgrader")}
    visible_ok = visible_n = 0
    points = max_points = 0.0
    outcomes = {}  # grade id -> (status, message): recorded with the student's saved parts (autograder/own/)
    width = max(len(t.grade_id) for t in tests)
    for t in tests:
        cell = cells[t.grade_id]
        if _is_empty(t.source):
            print(f"  {t.grade_id:<{width}}  {t.max_points:g} pts  hidden: runs when your notebook is graded")
            continue
        score, _ = determine_grade(cell)
        r, shown = as_graded(results.judge(cell, score, t, timeout), cell)
        outcomes[t.grade_id] = (r.status, r.message)
        visible_n += 1
        visible_ok += r.status == results.PASSED
        points, max_points = points + r.points, max_points + r.max_points
        label = " (hidden)" if t.hidden else ""
        line = f"  {t.grade_id:<{width}}  {t.max_points:g} pts  {r.status}{label}" + (f": {r.message}" if r.message else "")
        print(results.indented(line, width + 4))  # a message of several lines, whole, its later lines indented
        for words in shown:
            print(results.indented(f"  {'':<{width}}  {words}", width + 8))
        if t.grade_id in edited:
            how = "it was checked with the original, as the grader will" if t.grade_id in restored else "the grader runs the original"
            print(f"  {'':<{width}}  note: you edited this test cell; {how}")
    for index, cell in enumerate(ran.cells):
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if cell.cell_type == "code" and errors and gid not in cells_of(tests):
            label = f"cell {index}{f' ({gid})' if gid else ''}"
            if results.timed_out(cell):  # its KeyboardInterrupt is the grader's interrupt, not the student's bug
                print(f"  note: {label} {results.timeout_message(timeout)}")
                continue
            e = errors[0]
            print(results.indented(f"  note: {label} raised {results.describe_error(e.get('ename'), e.get('evalue'))}", 8))
    save_own(notebook, submitted, outcomes)
    kind = "visible tests" if any(_is_empty(t.source) for t in tests) or not any(t.hidden for t in tests) else "tests"
    print(f"\n{visible_ok} of {visible_n} {kind} passed ({points:g} of {max_points:g} points) in {seconds:.0f} s")
    return 0 if visible_ok == visible_n else 1


def as_graded(r: results.TestResult, cell) -> tuple[results.TestResult, list[str]]:
    """A visible cell's result as the grader will give it, judged on what the cell measured, and the lines that show
    those measurements: a design target's value beside its target and the course baseline's, with the share of
    points it earns (ledger.credit); a value checked only when graded counts 0 points here, and says so."""
    from autograder.notebook_checks import ledger

    try:
        rows = ledger.observations(cell) or []
    except ValueError:
        return r, []
    targets = [row for row in rows if ("at_most" in row or "at_least" in row) and not row.get("when_graded")]
    later = [row for row in rows if row.get("when_graded")]
    shown = []
    for row in targets:
        bound = f"at most {row['at_most']:.6g}" if "at_most" in row else f"at least {row['at_least']:.6g}"
        base = f"; no points at {row['baseline']:.6g} or beyond" if "baseline" in row else ""
        value = f"{row['value']:.6g}" if isinstance(row["value"], (int, float)) else repr(row["value"])
        shown.append(f"measured {row['label']}: {value} (target: {bound}{base})")
    if later:
        shown.append(f"checked only when graded, 0 of {r.max_points:g} points counted here: "
                     + ", ".join(row["label"] for row in later))
    if r.status != results.PASSED:
        return r, shown
    if later:
        return dataclasses.replace(r, points=0.0), shown
    missed = [(ledger.row_credit(row["value"], row), ledger.missed_target(row["value"], row))
              for row in targets if ledger.row_credit(row["value"], row) < 1]
    if not missed:
        return r, shown
    share, message = min(missed, key=lambda m: m[0])
    points = round(r.max_points * share, 2)
    if points <= 0:
        return dataclasses.replace(r, points=0.0, status=results.FAILED, message=message), shown
    return dataclasses.replace(r, points=points, status=results.PARTIAL,
                               message=f"partial credit, {points:g} of {r.max_points:g} points: {message}"), shown


def save_own(notebook: Path, nb, outcomes: dict) -> None:
    """Save the student's graded cells as mine/labNN.py, with these results, for the labs' last cells (autograder/own/)."""
    try:
        from autograder import own

        line = own.record_check(notebook, nb, outcomes)
    except Exception as e:  # a service to the student: it never changes what check reports
        line = f"note: your parts were not saved for the labs' last cells ({type(e).__name__}: {e})"
    if line:
        print(f"  {line}")


def find_template(nb):
    """The release of the lab this notebook is (its test cells' ids name it), or None where none is at hand."""
    import nbformat

    ids = {t.grade_id for t in results.test_cells(nb)}
    for lab in course_paths.all_labs():
        if not ids or not ids <= {t.grade_id for t in results.test_cells(nbformat.read(lab.source, as_version=4))}:
            continue
        try:
            path = assembly.template_path(lab)
        except Exception:  # noqa: BLE001 - no release and no way to make one here: check runs the notebook as it is
            return None
        return nbformat.read(path, as_version=4) if path.is_file() else None
    return None


def restore_test_cells(nb, edited: set[str]) -> set[str]:
    """Put back the released source of edited test cells, when the release is at hand (course/release/)."""
    import nbformat

    if not edited:
        return set()
    for lab in course_paths.all_labs():
        if not lab.release.exists():
            continue
        originals = {t.grade_id: t.source for t in results.test_cells(nbformat.read(lab.release, as_version=4))}
        if edited <= set(originals):  # the lab these test cells belong to
            for cell in nb.cells:
                gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                if gid in edited:
                    cell.source = originals[gid]
            return set(edited)
    return set()


def cells_of(tests) -> set[str]:
    return {t.grade_id for t in tests}
