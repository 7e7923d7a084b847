"""The labs' design parts (autograder/qa/design/__init__.py says what each holds): their instructor modules are well formed.

Each autograder/design/labNN.py names baseline cells that exist in its lab, design test cells that exist, and only
cells whose grade ids begin with ``design-``; ``autograder verify`` then shows that the baseline fails them
(tests/autograder/test_verify.py).  The edition never holds these modules (tests/autograder/test_publish.py).
"""
from __future__ import annotations

import json

import pytest

from autograder import course_paths
from autograder.qa import design

LABS = [lab for lab in course_paths.all_labs() if design.for_lab(lab.name) is not None]


def grade_cells(lab):
    cells = json.loads(lab.source.read_text(encoding="utf-8"))["cells"]
    return {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"] for c in cells
            if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")}


def test_the_first_three_labs_have_a_design_part():
    assert {lab.name.split("_")[0] for lab in LABS} >= {"lab01", "lab02", "lab03"}


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_a_design_module_names_the_lab_s_design_cells(lab):
    module, cells = design.for_lab(lab.name), grade_cells(lab)
    assert module.BASELINE and module.MUST_FAIL and module.BASELINE_NAME
    for gid in module.BASELINE:
        assert gid.startswith("design-") and cells.get(gid, {}).get("solution"), f"{gid}: not a design solution cell"
    for gid in module.MUST_FAIL:
        assert gid.startswith("design-") and cells.get(gid, {}).get("grade"), f"{gid}: not a graded design test cell"
    design_points = sum(m.get("points", 0) for gid, m in cells.items() if gid.startswith("design-") and m.get("grade"))
    total = sum(m.get("points", 0) for m in cells.values() if m.get("grade"))
    assert 3 * design_points >= total, f"{lab.name}: the design part carries {design_points} of {total} points, under a third"


def test_no_shipped_autograder_module_imports_the_design_package():
    from autograder.edition import publish

    shipped = publish.autograder_files()
    assert not [m for m in shipped if m.startswith("autograder/qa/")]
    for path in shipped:
        text = (course_paths.REPO_ROOT / path).read_text(encoding="utf-8")
        assert "autograder.qa.design" not in text and "from .design" not in text and "from ..design" not in text, path
