"""``verify``: prove each lab's tests sound before students see them.

For every lab: the source notebook (the solution) must get full marks with
every cell running without an error, the released stub must get zero, and
every hidden test must fail on the stub (a hidden test that passes on the stub
checks nothing).  A lab with a design part (autograder/qa/design/) is graded a third time, with the course's
baseline swapped in where the student's part goes: each design test the lab names must fail on it (a
threshold the baseline meets has no power).  All are graded by the
real ``grade`` pipeline, in private courses that leave course/gradebook.db alone.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from autograder import course_paths, environment, hidden_outputs, results
from autograder.grade import autograde, sheets
from autograder.notebooks import assignments
from autograder.qa import design


def baseline_notebook(lab: course_paths.Lab, module):
    """The solution notebook with each cell of ``module.BASELINE`` (by grade id) replaced by the baseline's source,
    and without the test cells of the lab's other parts: the baseline is the solution there, which the solution's
    own grading already proved, so only the design tests are run again (a test cell binds nothing a later cell
    reads; a design test that then failed for want of a name would be an error, which baseline_problems refuses)."""
    import nbformat

    nb = nbformat.read(lab.source, as_version=4)
    others = {t.grade_id for t in results.test_cells(nb) if not t.grade_id.startswith("design-")}
    todo = dict(module.BASELINE)
    kept = []
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in others:
            continue
        if gid in todo:
            cell.source = todo.pop(gid)
        kept.append(cell)
    if todo:
        raise course_paths.LabError(f"{module.__name__}.BASELINE names cells {lab.name} does not have: {', '.join(todo)}")
    nb.cells = kept
    return nb


def baseline_problems(module, baseline: results.StudentResult) -> list[str]:
    by = {t.test: t for t in baseline.tests}
    found = []
    for gid in module.MUST_FAIL:
        if gid not in by:
            found.append(f"{module.__name__}.MUST_FAIL names {gid}, which is not a test cell of the lab")
        elif by[gid].status == results.PASSED:
            found.append(f"the baseline ({module.BASELINE_NAME}) passes {gid}: its threshold has no power")
        elif by[gid].status == results.PARTIAL:  # partial credit starts above the baseline, so it must earn nothing
            found.append(f"the baseline ({module.BASELINE_NAME}) earns {by[gid].points:g} points on {gid}: "
                         f"{by[gid].message}")
        elif by[gid].status != results.FAILED:  # an error or a timeout proves nothing about the threshold
            found.append(f"the baseline ({module.BASELINE_NAME}) did not fail {gid} on its measure but with "
                         f"{by[gid].status}: {by[gid].message}")
    return found


def problems_of(lab: course_paths.Lab, solution: results.StudentResult, stub: results.StudentResult) -> list[str]:
    found = []
    if not solution.tests:
        found.append("the lab has no test cells")
    if not any(t.hidden for t in solution.tests):
        found.append("the lab has no hidden tests")
    # Every cell of the solution must run, measurements included: make test executes the labs only here.
    found += [f"the solution: {note}" for note in solution.notes]
    found += [f"the answer policy refuses the solution's {r} (every correct answer must pass it)"
              for r in solution.refusals]
    for t in solution.tests:
        if t.max_points <= 0:
            found.append(f"test cell {t.test} is worth no points")
        if t.status != results.PASSED:
            found.append(f"the solution fails {t.test}: {t.status}: {t.message}")
    if stub.score != 0:
        found.append(f"the stub scores {stub.score:g}, not 0: "
                     + ", ".join(t.test for t in stub.tests if t.points > 0))
    for t in stub.tests:
        if t.hidden and t.status == results.PASSED:
            found.append(f"hidden test {t.test} passes on the stub")
    if lab is not None:
        found += [f"test cell {gid} awards points on the kernel's word: it observes nothing for the grader to judge "
                  f"(autograder/notebook_checks/ledger.py)" for gid in kernel_word(lab, solution)]
    return found


def kernel_word(lab: course_paths.Lab, solution: results.StudentResult) -> list[str]:
    """Test cells whose verdict the trusted side takes from the kernel alone: no row in the lab's answer sheet, and
    no hidden outputs compared with golden files (hidden_outputs.SPECS)."""
    sheet = sheets.load(lab) or {}
    return [t.test for t in solution.tests
            if not sheet.get(t.test) and (lab.name, t.test) not in hidden_outputs.SPECS]


def verify(names=None, workers: int = 2, timeout: int = 60) -> int:
    import nbformat

    environment.prepare(workers)
    labs = course_paths.find_labs(names)
    for lab in labs:
        assignments.generate(lab)
    designs = {lab.name: design.for_lab(lab.name) for lab in labs}
    course_paths.COURSE.joinpath("tmp").mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="verify-", dir=course_paths.COURSE / "tmp")
    try:
        for lab in labs:
            for who, src in (("solution", lab.source), ("stub", lab.release)):
                dest = Path(folder) / who / lab.name / f"{lab.name}.ipynb"
                dest.parent.mkdir(parents=True)
                shutil.copyfile(src, dest)
            if designs[lab.name] is not None:
                dest = Path(folder) / "baseline" / lab.name / f"{lab.name}.ipynb"
                dest.parent.mkdir(parents=True)
                dest.write_text(nbformat.writes(baseline_notebook(lab, designs[lab.name])), encoding="utf-8")
        # The baseline is graded on the design tests only: the solution's grading already covers the rest.
        design_only = {lab.name: {t.grade_id for t in results.test_cells(nbformat.read(lab.source, as_version=4))
                                  if t.grade_id.startswith("design-")} for lab in labs}
        graded = autograde.grade(folder, workers=workers, timeout=timeout, merge_into_course=False,
                               only_tests={"baseline": set().union(*design_only.values())})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    by = {(r.student, r.lab): r for r in graded}
    status = 0
    print()
    for lab in labs:
        solution, stub = by[("solution", lab.name)], by[("stub", lab.name)]
        found = problems_of(lab, solution, stub)
        hidden = sum(t.hidden for t in stub.tests)
        summary = (f"{lab.name}: solution {solution.score:g}/{solution.max_score:g} in {solution.seconds:.1f} s, "
                   f"stub {stub.score:g}/{stub.max_score:g}, "
                   f"{hidden} hidden test cell{'s' * (hidden != 1)} failing on the stub")
        module = designs[lab.name]
        if module is not None:
            baseline = by[("baseline", lab.name)]
            found += baseline_problems(module, baseline)
            design_tests = [t for t in baseline.tests if t.test.startswith("design-")]
            design_points = sum(t.max_points for t in solution.tests if t.test.startswith("design-"))
            summary += (f", design {design_points:g} points, baseline ({module.BASELINE_NAME}) "
                        f"{sum(t.points for t in design_tests):g}/{sum(t.max_points for t in design_tests):g} of them, "
                        f"failing {', '.join(module.MUST_FAIL)}")
        if found:
            status = 1
            print(f"{summary}: NOT SOUND")
            for p in found:
                print(f"  - {p}")
        else:
            print(f"{summary}: sound")
    return status
