"""The trusted side's verdict on a test cell: what the kernel observed, against the lab's answer sheet.

A test cell's checks ``observe`` the student's outputs (autograder/notebook_checks/ledger.py) and hand them out of the
kernel.  Here, outside the sandbox, each observation is compared with the sheet's row of the same label
(autograder/grade/sheets.py: the same observations made on the course's solution, with what each must equal or stay
within).  A cell that passed in the kernel passes only if it reported exactly the sheet's labels and every value
holds; a failure in the kernel stands as it is.  A hidden test's message names the label and, for a list, where
it first differs, never the expected value.

A design target with a baseline (``ledger.credit``) that is missed earns a share of the cell's points, the smallest
share of its scaled rows, as long as every other row holds: status ``partial``, or ``failed`` at a share of 0.  A
judge of the worker's own (yardsticks.JUDGES) answers None (it holds), a message (it fails), or (share, message)
for a scaled target it missed.
"""
from __future__ import annotations

import dataclasses
import math

from autograder import results
from autograder.grade.yardsticks import JUDGES  # the grader's own comparisons, for truths that never enter the kernel
from autograder.notebook_checks.ledger import missed_target, observations, row_credit


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _same(a, b) -> bool:
    """Equal as plain values, a bool never equal to an int."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if _number(a) and _number(b):
        return a == b
    return type(a) is type(b) and a == b


def _close(a, b, tol: float, rel: float) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tol, rel) for x, y in zip(a, b))
    if _number(a) and _number(b):
        return abs(a - b) <= max(tol, rel * abs(b))
    return _same(a, b)


def _where(a, b) -> str:
    """Where two lists first differ: ' (first difference at index 3 of 24)'; '' for anything else."""
    if not (isinstance(a, list) and isinstance(b, list)):
        return ""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if not _same(x, y)), min(len(a), len(b)))
    if len(a) != len(b) and i == min(len(a), len(b)):
        return f" ({len(a)} entries where {len(b)} were expected)"
    return f" (first difference at index {i} of {len(b)})"


def _short(value, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


def compare(value, row: dict, hidden: bool):
    """None when ``value`` holds against the sheet's ``row``; else what is wrong, in the student's terms, or for a
    scaled target missed (a row with a baseline), (the share it earns, what is wrong)."""
    label = row["label"]
    if "judge" in row:
        judge = JUDGES.get(row["judge"])
        return judge(value, row) if judge else f"{label}: the grader has no judge named {row['judge']!r}"
    for key, op in (("at_most", lambda v, b: v <= b), ("at_least", lambda v, b: v >= b)):
        if key in row:
            if _number(value) and op(value, row[key]):
                return None
            message = missed_target(value, row)
            return (row_credit(value, row), message) if "baseline" in row else message
    want = row.get("expect")
    ok = (_close(value, want, row.get("tol", 0.0), row.get("rel", 0.0)) if ("tol" in row or "rel" in row)
          else _same(value, want))
    if ok:
        return None
    if hidden:
        return f"{label}: your output differs from the reference{_where(value, want)}"
    within = f" (within {row['tol']:g})" if "tol" in row else f" (within {row['rel']:g} relative)" if "rel" in row else ""
    return f"{label}: got {_short(value)}, expected {_short(want)}{within}{_where(value, want)}"


def judge(test: results.TestResult, cell, sheet_rows: list[dict] | None) -> results.TestResult:
    """The cell's result as the trusted side sees it.  ``sheet_rows``: the sheet's rows for this cell (None: the
    sheet does not know the cell, and the kernel's result stands, which verify reports)."""
    if sheet_rows is None or test.status != results.PASSED:
        return test

    def failed(message: str) -> results.TestResult:
        return dataclasses.replace(test, points=0.0, status=results.FAILED, message=message)

    try:
        rows = observations(cell)
    except ValueError:
        return failed("the test's observations are malformed; a submission may not alter them")
    if rows is None:
        return failed("the test handed no observations to the grader: it did not run its checks "
                      "(something in the notebook stopped or changed it)")
    got: dict[str, object] = {}
    for r in rows:
        if r["label"] in got:
            return failed(f"the test reported {r['label']!r} twice; a submission may not add observations")
        got[r["label"]] = r["value"]
    due = [r["label"] for r in sheet_rows]
    missing = [label for label in due if label not in got]
    extra = [label for label in got if label not in set(due)]
    if missing:
        return failed(f"the test did not report {len(missing)} of its {len(due)} observations (first: {missing[0]}): "
                      f"it stopped early or was changed")
    if extra:
        return failed(f"the test reported {len(extra)} observation(s) it does not make (first: {extra[0]!r})")
    problems = [p for row in sheet_rows if (p := compare(got[row["label"]], row, test.hidden))]
    if not problems:
        return test
    hard = [p for p in problems if isinstance(p, str)]
    first = hard[0] if hard else min(problems, key=lambda p: p[0])[1]
    head = "hidden: " if test.hidden and not first.startswith("hidden: ") else ""  # a hidden label may say it already
    if hard:  # something is wrong, not merely short of a target: no share
        words = [p if isinstance(p, str) else p[1] for p in problems]
        more = f" ({len(words) - 1} more)" if len(words) > 1 else ""
        return failed(f"{head}{hard[0]}{more}")
    return scaled(test, problems, head)


def scaled(test: results.TestResult, problems: list[tuple[float, str]], head: str = "") -> results.TestResult:
    """The cell's share of its points when only scaled targets were missed: the smallest share of them."""
    share, message = min(problems, key=lambda p: p[0])
    points = round(test.max_points * max(0.0, min(1.0, float(share))), 2)
    more = f" ({len(problems) - 1} more target(s) missed)" if len(problems) > 1 else ""
    if points <= 0:
        return dataclasses.replace(test, points=0.0, status=results.FAILED, message=f"{head}{message}{more}")
    return dataclasses.replace(test, points=points, status=results.PARTIAL,
                               message=f"{head}partial credit, {points:g} of {test.max_points:g} points: {message}{more}")
