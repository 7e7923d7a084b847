"""What ``check`` shows of a visible cell's measurements (autograder/check.py, ``as_graded``): a design target's
value beside its target and the course baseline's, the share of points a missed target earns (as the grader gives
it), and values that only the grader can check, shown as such and counted as 0 points."""
from __future__ import annotations

import pytest

from autograder import check, results
from autograder.notebook_checks.ledger import MIME

pytestmark = pytest.mark.student_edition


def cell(*rows):
    return {"outputs": [{"output_type": "display_data", "data": {MIME: {"rows": list(rows)}}, "metadata": {}}]}


def passed(points=4.0):
    return results.TestResult("design-visible", points, points, results.PASSED)


def test_a_met_target_is_shown_with_its_target_and_baseline():
    r, shown = check.as_graded(passed(), cell({"label": "bytes ratio", "value": 0.21, "at_most": 0.3, "baseline": 1.0}))
    assert r.status == results.PASSED and r.points == 4.0
    assert shown == ["measured bytes ratio: 0.21 (target: at most 0.3; no points at 1 or beyond)"]


def test_a_missed_target_earns_its_share_and_says_so():
    r, shown = check.as_graded(passed(), cell({"label": "bytes ratio", "value": 0.65, "at_most": 0.3, "baseline": 1.0}))
    assert (r.status, r.points) == (results.PARTIAL, 2.0)
    assert r.message == ("partial credit, 2 of 4 points: bytes ratio: 0.65; full points need at most 0.3, "
                         "none at 1 or beyond: 50% of them")
    r, _ = check.as_graded(passed(), cell({"label": "bytes ratio", "value": 1.2, "at_most": 0.3, "baseline": 1.0}))
    assert (r.status, r.points) == (results.FAILED, 0.0) and "0% of them" in r.message


def test_values_checked_only_when_graded_count_no_points_here():
    rows = [{"label": "tokens_naive is a number", "value": True, "expect": True},
            {"label": "tokens_naive", "value": 12.0, "when_graded": True}]
    r, shown = check.as_graded(passed(2.0), cell(*rows))
    assert (r.status, r.points) == (results.PASSED, 0.0)
    assert shown == ["checked only when graded, 0 of 2 points counted here: tokens_naive"]


def test_a_failure_in_the_kernel_stands_and_still_shows_what_was_measured():
    failed = results.TestResult("design-visible", 0.0, 4.0, results.FAILED, "wrong tokens")
    r, shown = check.as_graded(failed, cell({"label": "passes", "value": 40, "at_most": 32}))
    assert r == failed and shown == ["measured passes: 40 (target: at most 32)"]


def test_answers_for_a_ta_are_the_manually_graded_cells_with_points():
    import nbformat

    nb = nbformat.v4.new_notebook()
    meta = lambda gid, pts, solution: {"nbgrader": {"grade": True, "solution": solution, "grade_id": gid, "points": pts}}
    nb.cells = [nbformat.v4.new_markdown_cell("answer", metadata=meta("answer-q1", 2, True)),
                nbformat.v4.new_markdown_cell("answer", metadata=meta("answer-q2", 0, True)),
                nbformat.v4.new_code_cell("assert True", metadata=meta("numbers", 2, False))]
    assert results.answer_cells(nb) == [("answer-q1", 2.0)]


def test_the_grade_table_counts_partial_results():
    r = results.StudentResult("ada", "lab01", "ada.ipynb", [results.TestResult("design", 1.5, 4.0, results.PARTIAL, "x")])
    head, _, row = results.table([r], details=False).splitlines()[:3]
    assert head.split()[:6] == ["student", "lab", "score", "passed", "partial", "failed"]
    assert row.split()[:6] == ["ada", "lab01", "1.5/4", "0", "1", "0"]
