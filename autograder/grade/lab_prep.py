"""What grading needs to know of a lab before any submission runs: its test cells, its template gradebook, its
release (what runs, with each submission's answers in it), the answer policy's view of it, and the hidden files.

Built once per lab and grading run, from labs/ (never from course/: see prepare_lab), by ``autograde.grade``.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path

from autograder import answer_policy, course_paths, hidden_outputs, results
from autograder.grade.messages import hidden_secrets
from autograder.notebooks import assembly, assignments
from autograder.notebooks.nbgrader_config import nbgrader_api, succeeded
from autograder.results import TestCell

LEAVE_OUT_ENV = "AUTOGRADER_LEAVE_OUT"  # a JSON list of given cells' ids: the course's tests only (prepare_lab)


@dataclasses.dataclass
class LabInfo:
    lab: course_paths.Lab
    tests: list[TestCell]
    template_db: Path  # the lab's gradebook with no students: each private course starts from a copy
    originals: dict[str, set[str]]  # test cell id -> its source in the lab and in the release: anything else is an edit
    golden: dict[str, dict]  # the hidden golden files this lab's hidden tests are compared with
    secrets: list[str]  # what would give a hidden input away in a message (hidden_secrets)
    template: object = None  # the lab's release (nbformat): what runs, with the submission's answers (assembly)
    policy: answer_policy.Lab | None = None  # what answer cells may reach, read from the lab's source
    sheet: dict[str, list[dict]] | None = None  # the answer sheet (autograder/grade/sheets.py): None while it is being made
    as_submitted: bool = False  # --as-submitted: the notebook runs as handed in, without assembly or the policy


def load_hidden() -> dict[str, dict]:
    """Every hidden golden file there is, by name: read once per grading run."""
    return {f: hidden_outputs.load(f) for f in hidden_outputs.FILES if (hidden_outputs.HIDDEN_DIR / f"{f}.json").exists()}


def prepare_lab(lab: course_paths.Lab, run_dir: Path, hidden: dict[str, dict]) -> LabInfo:
    """The lab's test cells and a template gradebook, built from labs/ in this run; ``hidden``: load_hidden().

    The template is never copied from course/gradebook.db: anything that could write there (an earlier
    ungraded run, a hand edit) could raise a test's points or change its source.
    """
    import nbformat

    assignments.generate(lab)  # keeps course/ (where grades are merged, and the formgrader looks) current
    root = run_dir / f"template-{lab.name}"
    succeeded(nbgrader_api(root).generate_assignment(lab.name, force=True, create=True),
              f"nbgrader generate_assignment {lab.name} (the template gradebook)")
    tests = results.test_cells(nbformat.read(lab.source, as_version=4))
    originals = {t.grade_id: {t.source} for t in tests}
    for t in results.test_cells(nbformat.read(root / "release" / lab.name / f"{lab.name}.ipynb", as_version=4)):
        originals.setdefault(t.grade_id, set()).add(t.source)
    files = {d.file for (name, _), dues in hidden_outputs.SPECS.items() if name == lab.name for d in dues}
    source = nbformat.read(lab.source, as_version=4)
    template = nbformat.read(root / "release" / lab.name / f"{lab.name}.ipynb", as_version=4)
    # For the course's own tests only: given cells (never answer or test cells) left out of every graded notebook,
    # so that two dozen planted-bug submissions do not rerun the lab's measurements (tests/autograder/fixture_cells.py).
    leave_out = set(json.loads(os.environ.get(LEAVE_OUT_ENV) or "[]"))
    template.cells = [c for c in template.cells
                      if c.get("id") not in leave_out or assembly.is_answer(c) or assembly.is_test(c)]
    return LabInfo(lab, tests, root / "gradebook.db", originals, {f: hidden[f] for f in sorted(files)},
                   hidden_secrets(hidden), template, answer_policy.lab_of(source))


def write_hidden_inputs(run_dir: Path, hidden: dict[str, dict]) -> Path:
    """The hidden files' inputs only (public_view), which a sandbox is shown while a hidden test runs."""
    folder = run_dir / "hidden-inputs"
    folder.mkdir()
    for name, data in hidden.items():
        (folder / f"{name}.json").write_text(json.dumps(hidden_outputs.public_view(data)))
    return folder


def only_tests(info: LabInfo, keep: set[str] | None) -> LabInfo:
    """``info`` with a template that keeps only the test cells ``keep`` names (all when None)."""
    if keep is None:
        return info
    template = copy.deepcopy(info.template)
    template.cells = [c for c in template.cells if not assembly.is_test(c) or assembly.grade_id(c) in keep]
    return dataclasses.replace(info, template=template)


