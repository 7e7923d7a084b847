"""The trusted side's verdict (autograder/grade/verdicts.py): a test cell passes only on what it handed out, judged
against the lab's answer sheet outside the kernel; nothing the kernel says about itself is taken on its word."""
from __future__ import annotations

import pytest

from autograder import results
from autograder.grade import verdicts
from autograder.notebook_checks import ledger
from autograder.notebook_checks.ledger import MIME


def cell(*rows, outputs=()):
    out = [{"output_type": "display_data", "data": {MIME: {"rows": list(rows)}}, "metadata": {}}] if rows else []
    return {"outputs": out + list(outputs)}


def passed(hidden=False):
    return results.TestResult("t", 2.0, 2.0, results.PASSED, "", hidden)


SHEET = [{"label": "greedy([1, 2])", "expect": 1}, {"label": "p0: tokens", "expect": [5, 6, 7]},
         {"label": "passes", "expect": 3, "at_most": 12}, {"label": "score", "expect": -1.5, "tol": 1e-4}]
GOOD = [{"label": "greedy([1, 2])", "value": 1}, {"label": "p0: tokens", "value": [5, 6, 7]},
        {"label": "passes", "value": 12}, {"label": "score", "value": -1.50005}]


def test_the_right_observations_pass():
    assert verdicts.judge(passed(), cell(*GOOD), SHEET).status == results.PASSED


def test_a_cell_that_handed_out_nothing_fails_whatever_the_kernel_said():
    r = verdicts.judge(passed(), cell(), SHEET)
    assert (r.status, r.points) == (results.FAILED, 0.0) and "no observations" in r.message


def test_a_wrong_value_fails_and_a_visible_message_shows_both_sides():
    rows = [dict(GOOD[0], value=0)] + GOOD[1:]
    r = verdicts.judge(passed(), cell(*rows), SHEET)
    assert r.status == results.FAILED and "greedy([1, 2]): got 0, expected 1" in r.message


def test_a_hidden_message_says_where_but_never_the_expected_value():
    rows = GOOD[:1] + [dict(GOOD[1], value=[5, 9, 7])] + GOOD[2:]
    r = verdicts.judge(passed(hidden=True), cell(*rows), SHEET)
    assert r.status == results.FAILED and "first difference at index 1 of 3" in r.message
    assert "[5, 6, 7]" not in r.message and "6" not in r.message.split("index")[0]


@pytest.mark.parametrize("label,value", [("passes", 13), ("score", -1.6), ("p0: tokens", [5, 6]),
                                         ("greedy([1, 2])", True), ("greedy([1, 2])", 1.0000001)])
def test_bounds_tolerances_and_kinds(label, value):
    rows = [dict(r, value=value) if r["label"] == label else r for r in GOOD]
    assert verdicts.judge(passed(), cell(*rows), SHEET).status == results.FAILED


def test_missing_extra_and_repeated_observations_fail():
    for rows in (GOOD[:-1], GOOD + [{"label": "more", "value": 1}], GOOD + GOOD[:1]):
        assert verdicts.judge(passed(), cell(*rows), SHEET).status == results.FAILED


def test_a_failure_in_the_kernel_stays_a_failure():
    failed = results.TestResult("t", 0.0, 2.0, results.FAILED, "greedy([1, 2]) should be 1, got 0", False)
    assert verdicts.judge(failed, cell(*GOOD), SHEET) == failed


def test_a_malformed_report_fails():
    bad = {"outputs": [{"output_type": "display_data", "data": {MIME: {"rows": "all passed"}}}]}
    assert "malformed" in verdicts.judge(passed(), bad, SHEET).message


def test_a_named_judge_decides(monkeypatch):
    monkeypatch.setitem(verdicts.JUDGES, "even", lambda value, row: None if value % 2 == 0 else f"{value} is odd")
    sheet = [{"label": "n", "expect": 2, "judge": "even"}]
    assert verdicts.judge(passed(), cell({"label": "n", "value": 4}), sheet).status == results.PASSED
    assert verdicts.judge(passed(), cell({"label": "n", "value": 3}), sheet).message == "3 is odd"


def test_observe_takes_plain_values_only():
    ledger.observe("ok", [1, 2.5, True, None, "x", {"k": [1]}])
    with pytest.raises(TypeError):
        ledger.observe("not plain", object())
    ledger.flush()  # outside a kernel: nobody to hand them to, and nothing is kept
    assert ledger.pending() == []
