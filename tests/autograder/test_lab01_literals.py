"""Lab 01: the bigram cases pasted into beam_search's test cells are the design reference's beams, and the graded
numbers' hidden values are what their formulas give for the target model.
"""
import json

import pytest

from miniengine.paths import REPO_ROOT

LAB01 = REPO_ROOT / "labs" / "lab01_naive_decode" / "lab01_naive_decode.ipynb"


class _Recorder:
    """Stands in for `lab` when a test cell is run here: records every call made through it."""

    def __init__(self, calls, name=""):
        self.calls, self.name = calls, name

    def __getattr__(self, attr):
        return _Recorder(self.calls, f"{self.name}.{attr}".lstrip("."))

    def __call__(self, *args, **kwargs):
        self.calls.append((self.name, args, kwargs))
        return _Recorder(self.calls, self.name + "()")


def lab01_calls(grade_id: str) -> list:
    cell = next(c for c in json.loads(LAB01.read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    source = "".join(ln for ln in cell["source"] if "importlib" not in ln)  # the harness: the recorder instead
    calls: list = []
    exec(source, {"lab": _Recorder(calls), "beam_search": None, "globals": lambda: {}})
    return calls


def lab01_solution(grade_id: str, namespace: dict) -> dict:
    """Run the lab's own answer cell ``grade_id`` (its solution) in ``namespace``; returns the namespace."""
    cell = next(c for c in json.loads(LAB01.read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    exec("".join(cell["source"]), namespace)
    return namespace


def test_lab01_visible_bigram_beams_are_the_references():
    from autograder.labs.lab01.beams import BigramModel
    from autograder.qa.design.lab01 import beam_search

    (_, (_, cases), _), = [c for c in lab01_calls("design-beams-visible") if c[0] == "check_beams_bigram"]
    assert len(cases) >= 4
    for table, prompt, p, want in cases:
        got = beam_search(BigramModel(table), prompt, p["beam_width"], p["max_tokens"], p["length_penalty"],
                          p["eos_token_id"])
        assert [ids for ids, _ in got] == [ids for ids, _ in want], (prompt, p)
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6), (prompt, p)


def test_lab01_hidden_bigram_beams_of_the_solution_are_the_references():
    """The hidden cell holds inputs only; the answer sheet takes its beams from the lab's solution, so the solution
    must give the float64 reference's beams on them (autograder/grade/sheets.py)."""
    import numpy as np
    import torch

    from autograder.labs.lab01.beams import BigramModel
    from autograder.qa.design.lab01 import beam_search as reference
    from miniengine.attention import NoCacheBackend

    (_, (_, cases), kwargs), = [c for c in lab01_calls("design-beams-hidden") if c[0] == "check_beams_bigram"]
    assert kwargs == {"hidden": True} and len(cases) >= 4 and all(len(c) == 3 for c in cases)
    solution = lab01_solution("design-beam-search", {"torch": torch, "np": np, "NoCacheBackend": NoCacheBackend})
    for table, prompt, p in cases:
        args = (BigramModel(table), prompt, p["beam_width"], p["max_tokens"], p["length_penalty"], p["eos_token_id"])
        want, got = reference(*args), solution["beam_search"](*args)
        assert [ids for ids, _ in got] == [ids for ids, _ in want], (prompt, p)
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6), (prompt, p)


def test_lab01_numbers_of_the_solution_are_what_their_formulas_give():
    """The hidden numbers test reports the student's values; the sheet takes the right ones from the solution."""
    from miniengine.model import load_model
    from miniengine.paths import TARGET

    model = load_model(TARGET)
    (_, (_, tolerances), _), = [c for c in lab01_calls("numbers") if c[0] == "report_numbers"]
    got = lab01_solution("numbers-answers", {"model": model})
    assert {name: got[name] for name in tolerances} == {
        "tokens_naive": sum(100 + t for t in range(1000)), "tokens_once": 100 + 999,
        "kv_bytes_per_token": model.config.kv_bytes_per_token(4), "beam_tokens": 10 + 4 * sum(10 + t for t in range(1, 16))}
