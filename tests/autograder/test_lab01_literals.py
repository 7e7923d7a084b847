"""Lab 01: the targets pasted into search_completion's test cells are reachable and measured (greedy earns nothing),
the solution is the design reference, and the graded numbers' hidden values are what their formulas give.
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
    exec(source, {"lab": _Recorder(calls), "search_completion": None, "globals": lambda: {}})
    return calls


def lab01_solution(grade_id: str, namespace: dict) -> dict:
    """Run the lab's own answer cell ``grade_id`` (its solution) in ``namespace``; returns the namespace."""
    cell = next(c for c in json.loads(LAB01.read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    exec("".join(cell["source"]), namespace)
    return namespace


def bigram_best(table, prompt, max_tokens, eos=0) -> tuple[float, float]:
    """(the best normalised log-likelihood of any completion, greedy decoding's), by enumeration."""
    import itertools
    import math

    def score(tokens):
        last, total = prompt[-1], 0.0
        for t in tokens:
            total, last = total + math.log(table[last][t]), t
        return total / len(tokens)

    best = max(score(c) for n in range(1, max_tokens + 1) for c in itertools.product(range(len(table)), repeat=n)
               if eos not in c[:-1] and (n == max_tokens or c[-1] == eos))
    greedy, last = [], prompt[-1]
    while len(greedy) < max_tokens and (not greedy or greedy[-1] != eos):
        greedy.append(max(range(len(table)), key=lambda i: (table[last][i], -i)))
        last = greedy[-1]
    return best, score(greedy)


@pytest.mark.parametrize("cell", ["design-search-visible", "design-search-hidden"])
def test_lab01_bigram_targets_are_reachable_and_greedy_earns_nothing(cell):
    """Each hand-made case's target is reachable (the best completion's score is at least the target, and the design
    reference reaches it within the budget), and greedy decoding's score is at or below the case's baseline."""
    from autograder.labs.lab01.search import BigramModel, mean_log_likelihood
    from autograder.qa.design.lab01 import beam

    (_, (_, cases), _), = [c for c in lab01_calls(cell) if c[0] == "check_search_bigram"]
    for table, prompt, max_tokens, budget, target, baseline in cases:
        best, greedy = bigram_best(table, prompt, max_tokens)
        assert best >= target > baseline >= greedy, (cell, best, target, baseline, greedy)
        model = BigramModel(table, budget)
        got = beam(model, prompt, max_tokens, budget, 0)
        assert mean_log_likelihood(model, prompt, got) >= target and model.passes() <= budget


@pytest.mark.parametrize("cell,path", [("design-search-visible", "data/golden/lab01_search.json"),
                                       ("design-search-hidden", "autograder/hidden/lab01_search.json")])
def test_lab01_search_thresholds_are_the_measured_ones(cell, path):
    """The target and baseline in each cell are those autograder/qa/design/lab01_search.py measured and recorded."""
    data = json.loads((REPO_ROOT / path).read_text())
    (_, _, kwargs), = [c for c in lab01_calls(cell) if c[0] in ("check_search", "report_search")]
    assert kwargs == data["thresholds"]
    greedy = data["measurements"]["greedy"]["mean"]
    assert greedy <= kwargs["baseline"] < kwargs["target"]
    passing = [name for name, m in data["measurements"].items() if m["mean"] >= kwargs["target"] + 0.04]
    assert len(passing) >= 3, passing  # at least three designs pass with a margin of 0.04 nats per token


def test_lab01_solution_is_the_design_reference():
    """The lab's solution and autograder/qa/design/lab01.py's reference give the same completion on the bigram cases."""
    import numpy as np
    import torch

    from autograder.labs.lab01.search import BigramModel
    from autograder.qa.design.lab01 import beam
    from miniengine.attention import NoCacheBackend

    solution = lab01_solution("design-search", {"torch": torch, "np": np, "NoCacheBackend": NoCacheBackend})
    for cell in ("design-search-visible", "design-search-hidden"):
        (_, (_, cases), _), = [c for c in lab01_calls(cell) if c[0] == "check_search_bigram"]
        for table, prompt, max_tokens, budget, *_ in cases:
            want = beam(BigramModel(table), prompt, max_tokens, budget, 0)
            assert solution["search_completion"](BigramModel(table, budget), prompt, max_tokens, budget, 0) == want


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
