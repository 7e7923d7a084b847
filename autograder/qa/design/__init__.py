"""The labs' design parts, for instructors only: their references and the baselines that must fail them.

A design part (a lab's task that the course's engine does not ship) has no answer key in the student edition:
its solution lives only in the lab's solution region, and what the instructors need besides lives here, in a
package ``publish`` never copies (tests/autograder/test_publish.py proves it absent from the edition).  A module
``autograder/design/labNN.py`` per lab with a design part holds:

* whatever made the lab's golden data for the part (a reference implementation, a fit), used by the tests
  and by whoever regenerates the data, never at grading time;
* ``BASELINE_NAME``: the course's baseline in words (for example "plain greedy decode");
* ``BASELINE``: ``{solution cell grade id: source}``, the cells that plug the baseline in where the student's
  part goes;
* ``MUST_FAIL``: the grade ids of the design test cells the baseline must fail.  ``autograder verify`` grades
  the solution with the baseline cells swapped in and reports the lab unsound unless each of them fails: a
  threshold the baseline passes has no power.
"""
from __future__ import annotations

import importlib
from types import ModuleType


def for_lab(lab_name: str) -> ModuleType | None:
    """The design module of a lab (``lab01_naive_decode`` -> ``autograder.qa.design.lab01``), or None if it has none."""
    short = lab_name.split("_", 1)[0]
    try:
        module = importlib.import_module(f"{__name__}.{short}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{short}":
            raise
        return None
    for attr in ("BASELINE_NAME", "BASELINE", "MUST_FAIL"):
        if not hasattr(module, attr):
            raise AttributeError(f"{module.__name__} has no {attr} (see autograder/qa/design/__init__.py)")
    return module
