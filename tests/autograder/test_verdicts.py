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


def test_a_hidden_label_that_says_hidden_is_not_said_twice():
    sheet = [{"label": "hidden: find_stop, two stops", "expect": ["a", 0, 1]}]
    r = verdicts.judge(passed(hidden=True), cell({"label": "hidden: find_stop, two stops", "value": ["b", 0, 1]}), sheet)
    assert r.message == "hidden: find_stop, two stops: your output differs from the reference (first difference at index 0 of 3)"
    r = verdicts.judge(passed(hidden=True), cell(*[dict(GOOD[0], value=0)] + GOOD[1:]), SHEET)
    assert r.message.startswith("hidden: greedy([1, 2]): your output differs")


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


# ---------------------------------------------------------------- partial credit for design targets

SCALED = [{"label": "bytes ratio", "expect": 0.2, "at_most": 0.3, "baseline": 1.0}]


@pytest.mark.parametrize("value,status,points", [(0.25, results.PASSED, 2.0), (0.3, results.PASSED, 2.0),
                                                 (0.65, results.PARTIAL, 1.0), (1.0, results.FAILED, 0.0),
                                                 (1.7, results.FAILED, 0.0), ("nan", results.FAILED, 0.0)])
def test_a_scaled_target_earns_a_share_between_the_baseline_and_the_target(value, status, points):
    r = verdicts.judge(passed(), cell({"label": "bytes ratio", "value": value}), SCALED)
    assert (r.status, r.points) == (status, points), r.message
    if status == results.PARTIAL:
        assert "partial credit, 1 of 2 points" in r.message and "none at 1 or beyond" in r.message


def test_a_wrong_output_beside_a_scaled_target_earns_nothing():
    sheet = SCALED + [{"label": "tokens", "expect": [1, 2]}]
    r = verdicts.judge(passed(), cell({"label": "bytes ratio", "value": 0.65}, {"label": "tokens", "value": [1, 3]}), sheet)
    assert (r.status, r.points) == (results.FAILED, 0.0) and "tokens" in r.message


def test_the_smallest_share_counts_and_a_judge_may_answer_a_share(monkeypatch):
    monkeypatch.setitem(verdicts.JUDGES, "quarter", lambda value, row: (0.25, f"{row['label']}: a quarter"))
    sheet = SCALED + [{"label": "hidden ppl", "expect": 0, "judge": "quarter"}]
    r = verdicts.judge(passed(), cell({"label": "bytes ratio", "value": 0.65}, {"label": "hidden ppl", "value": 1}), sheet)
    assert (r.status, r.points) == (results.PARTIAL, 0.5) and "a quarter" in r.message


def test_credit_is_linear_and_clamped_both_ways():
    assert ledger.credit(0.5, at_most=0.2, baseline=0.8) == pytest.approx(0.5)
    assert ledger.credit(14.0, at_least=20.0, baseline=10.0) == pytest.approx(0.4)
    assert ledger.credit(9.0, at_least=20.0, baseline=10.0) == 0.0 and ledger.credit(25.0, at_least=20.0) == 1.0
    assert ledger.credit(0.5, at_most=0.2) == 0.0 and ledger.credit(float("nan"), at_most=1.0, baseline=2.0) == 0.0
    with pytest.raises(ValueError, match="one target"):
        ledger.credit(1.0, at_most=1.0, at_least=0.0)
