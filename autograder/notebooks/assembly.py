"""The notebook that is graded: the course's released notebook, with the student's answers in its answer cells.

A submission's own notebook is never run as it is.  Every cell comes from the lab's release (the given cells, the
stubs, the test cells), and only the contents of the answer (solution) cells come from the submission, matched by
grade id; the cell's metadata stays the course's.  So a cell the student added, or a given cell they edited, is not
run, and code can reach the kernel before the tests only through an answer cell, which ``answer_policy`` has read
first: an answer cell it refuses is left as the release's stub.  ``grade`` and ``check`` run the same assembly
(autograder/README.md, Trust model).
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from autograder import answer_policy, course_paths

RELEASED = course_paths.REPO_ROOT / "autograder" / "released"  # the student edition's pristine releases (publish writes them)


def grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def is_answer(cell) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution"))


def is_test(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


@dataclasses.dataclass
class Assembled:
    notebook: object  # nbformat.NotebookNode: what runs
    refusals: list[answer_policy.Refusal]  # answer cells the policy refused (each left as the stub)
    not_run: list[str]  # the submission's own cells that are not run: added ones, and edited given cells
    missing: list[str]  # answer cells the submission lacks (left as the stub)

    def notes(self) -> list[str]:
        notes = [f"refused, so the stub ran in its place: {r}" for r in self.refusals]
        notes += [f"not run: {what}" for what in self.not_run]
        notes += [f"answer cell {gid} is missing from the submission; the stub ran in its place" for gid in self.missing]
        return notes


def _label(index: int, cell) -> str:
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    return f"cell {index} ({first[:60]!r})" if first else f"cell {index} (empty)"


def assemble(template, submitted, policy: answer_policy.Lab | None = None) -> Assembled:
    """The release ``template`` with the answers of ``submitted``; ``policy``: answer_policy.lab_of(the lab's source)."""
    answers = {grade_id(c): c for c in submitted.cells if is_answer(c) and grade_id(c)}
    ours = {grade_id(c) for c in template.cells if is_answer(c)}
    code_answers = {gid: answers[gid].source for c in template.cells if is_answer(c) and c.cell_type == "code"
                    and (gid := grade_id(c)) in answers and answers[gid].cell_type == "code"}
    refusals = answer_policy.check_answers(code_answers, policy or answer_policy.lab_of(template))
    refused = {r.cell for r in refusals}
    nb = copy.deepcopy(template)
    missing = []
    for cell in nb.cells:
        gid = grade_id(cell)
        if not is_answer(cell):
            continue
        if gid not in answers or answers[gid].cell_type != cell.cell_type:
            missing.append(gid)
        elif gid not in refused:
            cell.source = answers[gid].source
    given = {c.source for c in template.cells if not is_answer(c)}
    ids = {c.get("id") for c in template.cells if not is_answer(c) and not is_test(c)}
    not_run = []
    for index, cell in enumerate(submitted.cells):
        if cell.cell_type != "code" or is_answer(cell) or is_test(cell) or cell.source in given:
            continue
        if not cell.source.strip():
            continue
        edited = cell.get("id") in ids
        not_run.append(f"{_label(index, cell)}: " + ("a given cell you edited; the grader ran the course's" if edited
                                                     else "a cell you added; only answer cells are graded"))
    unknown = sorted(set(answers) - ours)
    not_run += [f"answer cell {gid}: the lab has no answer cell of that id" for gid in unknown]
    return Assembled(nb, refusals, not_run, missing)


def template_path(lab: course_paths.Lab) -> Path:
    """The lab's pristine release: course/release/ in the instructor edition (regenerated when the source changed),
    autograder/released/ in the student edition, where labs/ holds the notebooks students edit."""
    mine = RELEASED / f"{lab.name}.ipynb"
    if mine.is_file():
        return mine
    from autograder.notebooks import assignments  # nbgrader, loaded only where a release is made

    assignments.generate(lab, quiet=True)
    return lab.release
