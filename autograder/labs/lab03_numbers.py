"""Lab 03, the numbers you derive: each answer of the "Numbers you derive" cell, checked for its form (visible) and
its value within a tolerance (hidden, the expected values pasted into the hidden cells).

Reloaded by ``autograder.labs.lab03`` (see that module); the test cells call these through ``lab03``.
"""
from __future__ import annotations

import math
import numbers

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
    print("your answers: " + ", ".join(f"{k} = {v:,.6g}" if isinstance(v, float) else f"{k} = {v}"
                                       for k, v in got.items()))


def check_answer_values(namespace: dict, expected: dict[str, tuple]):
    """expected: name -> (kind, value, relative tolerance); a count must be exact (or within its tolerance, in units),
    None must be None.  The message names the answer, never the expected value."""
    got = answers(namespace, {name: kind for name, (kind, _, _) in expected.items()})
    wrong = []
    for name, (kind, want, tol) in expected.items():
        value = got[name]
        if want is None or value is None:
            ok = value is want
        elif kind == "number":
            ok = abs(value - want) <= tol * abs(want)
        else:
            ok = abs(value - want) <= tol
        if not ok:
            wrong.append(name + (f" (within {100 * tol:g}%)" if kind == "number" else ""))
    assert not wrong, f"hidden case numbers: {len(wrong)} of {len(expected)} answers are off: {', '.join(wrong)}"
    print(f"your {len(expected)} answers are right")
