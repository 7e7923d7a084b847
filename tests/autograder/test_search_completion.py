"""Lab 01's design part, the search for a likely completion: the harness (autograder/labs/lab01/search.py).

The pass meter counts every model of the course's class, whatever road the search takes to it (the model it was
given, another one, a freshly loaded one), refuses layers called one by one and a cache backend, and stops a search at
its budget.  The harness scores what a search returns, with its own float64 model: the reference clears the
targets, greedy decoding earns nothing, and planted mistakes get messages that name the case and the cause.
"""
from __future__ import annotations

import pytest
import torch

from autograder.labs.lab01 import search as harness
from autograder.notebook_checks import ledger
from autograder.qa.design import lab01 as design
from miniengine.attention import NoCacheBackend
from miniengine.model import load_model
from miniengine.paths import TARGET


@pytest.fixture(scope="module")
def model32():
    torch.set_num_threads(1)
    return load_model(TARGET)


def own(fn):
    """The harness accepts only functions written in a notebook (__module__ == "__main__")."""
    fn.__module__ = "__main__"
    return fn


def one_pass(model, seqs):
    lens = [len(s) for s in seqs]
    ids = torch.tensor([t for s in seqs for t in s])
    positions = torch.cat([torch.arange(n) for n in lens])
    return model(ids, positions, NoCacheBackend(lens))


def test_the_meter_counts_one_pass_per_sequence_on_any_model_of_the_class(model32):
    other = load_model(TARGET)  # what a search could load for itself
    with harness.PassMeter(10) as meter:
        one_pass(model32, [[1, 2, 3], [4, 5]])
        one_pass(other, [[1, 2]])
    assert (meter.passes, meter.calls, meter.tokens) == (3, 2, 7)


def test_the_meter_stops_a_search_at_its_budget(model32):
    with harness.PassMeter(4) as meter:
        one_pass(model32, [[1], [2], [3]])
        with pytest.raises(harness.BudgetSpent, match="pass 5 of a budget of 4"):
            one_pass(model32, [[1], [2]])
    assert meter.depth == 0  # the hooks closed the pass even though it raised


def test_the_meter_refuses_the_roads_around_it(model32):
    with harness.PassMeter(100):
        with pytest.raises(RuntimeError, match="called the model's Embedding on its own"):
            model32.forward(torch.tensor([1, 2]), torch.arange(2), NoCacheBackend([2]))  # no hook on forward itself
        with pytest.raises(RuntimeError, match="called the model's DecoderLayer on its own"):
            model32.model.layers[0](torch.zeros(2, model32.config.hidden_size), None, None, NoCacheBackend([2]))

        class Quiet(NoCacheBackend):
            pass

        with pytest.raises(RuntimeError, match="ran the model with Quiet"):
            model32(torch.tensor([1, 2]), torch.arange(2), Quiet([2]))
    one_pass(model32, [[1, 2]])  # outside a search nothing is counted or refused


def reference(model, prompt_ids, max_tokens, budget, eos_token_id):
    return design.beam(model, prompt_ids, max_tokens, budget, eos_token_id)


def baseline():
    """autograder/qa/design/lab01.py's BASELINE (greedy decoding), defined as the notebook would define it."""
    scope = {"torch": torch, "NoCacheBackend": NoCacheBackend, "__name__": "__main__"}
    exec(design.BASELINE["design-search"], scope)
    return scope["search_completion"]


def rows(label_part):
    return [r for r in ledger.pending() if label_part in r["label"]]


def test_the_reference_meets_the_visible_target_and_greedy_earns_nothing(model32):
    del ledger._rows[:]
    assert harness.check_search(own(reference), target=-1.0202, baseline=-1.11) == 16
    (mean,) = rows("mean normalised")
    assert mean["value"] >= -1.0202 and ledger.row_credit(mean["value"], mean) == 1.0
    assert [r["value"] for r in rows("the most passes")] == [45]
    del ledger._rows[:]
    harness.check_search(baseline(), target=-1.0202, baseline=-1.11)  # a missed target does not raise: the share
    (mean,) = rows("mean normalised")
    assert mean["value"] < -1.11 and ledger.row_credit(mean["value"], mean) == 0.0
    del ledger._rows[:]


def test_planted_mistakes_get_messages_that_name_the_case_and_the_cause(model32):
    def with_prompt(model, prompt_ids, max_tokens, budget, eos_token_id):
        return list(prompt_ids) + reference(model, prompt_ids, max_tokens, budget, eos_token_id)

    def with_score(model, prompt_ids, max_tokens, budget, eos_token_id):
        return reference(model, prompt_ids, max_tokens, budget, eos_token_id), -0.5

    def too_wide(model, prompt_ids, max_tokens, budget, eos_token_id):  # width 8 spends 1 + 8 * 11 = 89 passes
        return design.beam(model, prompt_ids, max_tokens, budget, eos_token_id, width=8)

    def global_model(model, prompt_ids, max_tokens, budget, eos_token_id):  # a closure over another, "uncounted" model
        return design.beam(model32, prompt_ids, max_tokens, budget, eos_token_id, width=8)

    with pytest.raises(AssertionError, match=r"^visible case v0: the completion starts with the prompt; return the generated tokens only"):
        harness.check_search(own(with_prompt), target=-1.0202, baseline=-1.11)
    with pytest.raises(AssertionError, match=r"^visible case v0: return the completion's token ids alone"):
        harness.check_search(own(with_score), target=-1.0202, baseline=-1.11)
    for search in (too_wide, global_model):
        with pytest.raises(AssertionError, match=r"^visible case v0: the search asked for pass 49 of a budget of 48"):
            harness.check_search(own(search), target=-1.0202, baseline=-1.11)
    del ledger._rows[:]


def test_the_bigram_cases_score_the_worked_example():
    del ledger._rows[:]
    table = [[0.25] * 4, [0.2, 0.3, 0.3, 0.2], [0.9, 0.05, 0.03, 0.02], [0.15, 0.5, 0.25, 0.1]]
    harness.check_search_bigram(own(reference), [(table, [3], 3, 9, -0.70, -1.03)])
    (row,) = rows("normalised log-likelihood")
    assert row["value"] == pytest.approx(-0.667494, abs=1e-6)
    del ledger._rows[:]
    harness.check_search_bigram(baseline(), [(table, [3], 3, 9, -0.70, -1.03)])
    (row,) = rows("normalised log-likelihood")
    assert row["value"] == pytest.approx(-1.033698, abs=1e-6) and ledger.row_credit(row["value"], row) == 0.0
    del ledger._rows[:]


def test_bad_arguments_raise_a_value_error_naming_the_argument():
    harness.check_search_arguments(own(reference_checked), [(dict(max_tokens=0), "max_tokens"),
                                                            (dict(budget=2), "budget"),
                                                            (dict(eos_token_id=None), "eos_token_id")])

    def silent(model, prompt_ids, max_tokens, budget, eos_token_id):
        return [0]

    with pytest.raises(AssertionError, match=r"search_completion\(max_tokens=0\) returned without an error"):
        harness.check_search_arguments(own(silent), [(dict(max_tokens=0), "max_tokens")])
    del ledger._rows[:]


def reference_checked(model, prompt_ids, max_tokens, budget, eos_token_id):
    """The reference behind the lab's argument checks (the solution's wording)."""
    for name, value, low in (("max_tokens", max_tokens, 1), ("budget", budget, max_tokens if isinstance(max_tokens, int) else 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int of at least {low}, got {value!r}")
    if isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int):
        raise ValueError(f"eos_token_id must be an int, got {eos_token_id!r}")
    return reference(model, prompt_ids, max_tokens, budget, eos_token_id)
