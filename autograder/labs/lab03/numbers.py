"""Lab 03, the numbers you derive: each answer of the "Numbers you derive" cell, checked for its form (visible) and
its value within a tolerance (hidden: the test hands your values to the grader, which compares them with the right
ones, the course's solution's, outside the notebook; they never enter it).

Reloaded by ``autograder.labs.lab03`` (see that module); the test cells call these through ``lab03``.
"""
from __future__ import annotations

import math
import numbers

import autograder.notebook_checks as checks

# name -> the kind of answer: "number" (a real number), "count" (an int >= 0), "count or None" (an int, or None
# for "never")
KINDS = {"number": "a number", "count": "a whole number (an int)", "count or None": "a whole number, or None"}


def plain(value, kind: str, name: str):
    """The answer as a plain int, float or None; an AssertionError naming the answer if it has the wrong form."""
    if kind == "count or None" and value is None:
        return None
    if kind in ("count", "count or None"):
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0
        assert ok, f"{name} must be {KINDS[kind]}, got {type(value).__name__} {value!r:.40}"
        return int(value)
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    assert ok, f"{name} must be {KINDS[kind]}, got {type(value).__name__} {value!r:.40}"
    return float(value)


def answers(namespace: dict, kinds: dict[str, str]) -> dict:
    missing = [name for name in kinds if name not in namespace]
    assert not missing, (f"not answered yet: {', '.join(missing)} (assign each in the answer cell above, then run "
                         f"it)")
    return {name: plain(namespace[name], kind, name) for name, kind in kinds.items()}


def check_answer_forms(namespace: dict, kinds: dict[str, str]):
    """Every answer is there and of its kind; the values are checked by the hidden tests."""
    got = answers(namespace, kinds)
    for name, kind in kinds.items():
        checks.observe(f"{name} is {KINDS[kind]}", True, expect=True)
    print("your answers: " + ", ".join(f"{k} = {v:,.6g}" if isinstance(v, float) else f"{k} = {v}"
                                       for k, v in got.items()))


def within(kind: str, tolerance) -> str:
    """How close an answer must be, in a student's words: '(within 1%)', '(within ±1)', '(exactly)'."""
    if kind == "number":
        return f"(within {100 * tolerance:g}%)"
    return f"(within ±{tolerance:g})" if tolerance else "(exactly)"


def report_answer_values(namespace: dict, tolerances: dict[str, tuple]):
    """tolerances: name -> (kind, tolerance): relative for a number, in units for a count; a "count or None" answer
    that should be None must be None.  Each answer of the right form is handed to the grader with its tolerance; the
    grader's message names the answers that are off, never a right value (which never enters the notebook)."""
    got = answers(namespace, {name: kind for name, (kind, _) in tolerances.items()})
    for name, (kind, tolerance) in tolerances.items():
        bound = {"rel": tolerance} if kind == "number" else {"tol": tolerance}
        checks.observe(f"{name} {within(kind, tolerance)}", got[name], **bound)
    print(f"your {len(tolerances)} answers are handed to the grader")
