"""``python -m autograder verify`` on every lab: the solution full marks with no cell raising, the stub zero, every
hidden test failing on the stub.  A file of its own: it is make test's longest test, and pytest-xdist hands out
whole files (--dist loadfile), so alone it can run beside the other long files."""
from __future__ import annotations

import re
import warnings

import pytest
from autograder_support import REPO, explain, isolated_env, run_cli

from autograder import results

pytestmark = pytest.mark.slow
LAB = "lab01_naive_decode"


def test_verify_proves_the_labs_sound(tmp_path):
    """Also where make test runs the labs top to bottom (tests/autograder/test_regress.py runs the lectures): the solution is
    graded with every cell, measurements included, in their short form, and no cell may raise. Rule 7's budget,
    each solution's grading under a minute with the kernel's start in the sandbox, is reported, not asserted."""
    r = run_cli("verify", env=isolated_env(tmp_path), cwd=tmp_path, timeout=1200)
    assert r.returncode == 0, explain(r)
    assert re.search(rf"{LAB}: solution 34/34 in [0-9.]+ s, stub 0/34", r.stdout) and "sound" in r.stdout
    times = {m[1]: float(m[2]) for m in re.finditer(r"^(lab\w+): solution \S+ in ([0-9.]+) s", r.stdout, re.M)}
    assert set(times) == {p.name for p in (REPO / "labs").iterdir() if (p / f"{p.name}.ipynb").exists()}
    # A time is a measurement, not a verdict (this machine is shared): over the budget is a warning, with the times.
    slow = {lab: s for lab, s in times.items() if s >= 60}
    if slow:
        warnings.warn(f"over the 60 s FAST budget when graded, sharing the cores with other tests: {slow}")


def test_verify_names_a_solution_cell_that_raises(tmp_path):
    """A measurement cell that crashes scores nothing, so only verify's own check can catch it."""
    from autograder.qa import verify
    from autograder.results import StudentResult, TestResult

    ok = [TestResult("t", 1.0, 1.0, results.PASSED, "", True)]
    solution = StudentResult("solution", LAB, "x", ok, ["cell 30 raised ValueError; the cells after it ran all the same"])
    stub = StudentResult("stub", LAB, "x", [TestResult("t", 0.0, 1.0, results.FAILED, "", True)])
    assert verify.problems_of(None, solution, stub) == [
        "the solution: cell 30 raised ValueError; the cells after it ran all the same"]
