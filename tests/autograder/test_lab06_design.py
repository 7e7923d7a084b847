"""Lab 06's design part, the prompt-lookup proposer: the harness's rules (lab06/design.py), the solution cell against
the instructors' reference (autograder/qa/design/lab06.py), and the graded numbers.

The thresholds' power (plain decoding fails them) is shown by ``autograder verify lab06``; here, what needs no grading
pipeline: the solution cell's argument errors, its drafts equal to the reference design's, the harness refusing a
model call or an over-long draft, and one run on the real engine clearing the targets with the margin the reference
measured.
"""
import functools
import json

import pytest
import torch

from autograder.labs.lab06 import design
from autograder.notebook_checks.ledger import credit
from autograder.qa.design import lab06 as reference
from autograder_support import notebook_cell
from miniengine.paths import REPO_ROOT

LAB06 = REPO_ROOT / "labs" / "lab06_speculative_decoding" / "lab06_speculative_decoding.ipynb"


cell = functools.partial(notebook_cell, LAB06)  # a cell's source by its grade_id


def solution_class():
    ns: dict = {"__name__": "__main__"}
    exec(cell("design-proposer"), ns)
    return ns["PromptLookupProposer"]


class FakeSeq:
    def __init__(self, seq_id, tokens):
        self.seq_id, self.token_ids, self.num_prompt_tokens, self.params = seq_id, tuple(tokens), 3, None

    @property
    def num_tokens(self):
        return len(self.token_ids)


@pytest.mark.parametrize("bad, field", [
    (dict(min_n=0), "min_n"), (dict(min_n=1.5), "min_n"), (dict(min_n=True), "min_n"),
    (dict(min_n=2, max_n=1), "max_n"), (dict(max_n="3"), "max_n"), (dict(min_gamma=0), "min_gamma"),
    (dict(min_gamma=4, max_gamma=3), "max_gamma"), (dict(max_gamma=8.0), "max_gamma")])
def test_the_solution_names_the_bad_field_and_its_range(bad, field):
    Proposer = solution_class()
    with pytest.raises(ValueError, match=field) as e:
        Proposer(**{**dict(min_n=1, max_n=3, min_gamma=1, max_gamma=8), **bad})
    assert "at least" in str(e.value)


def test_the_solution_drafts_what_the_reference_design_drafts():
    """The notebook's solution is the reference's "last 1-3, adaptive γ ±1 in 1..8", step for step."""
    ours, ref = solution_class()(), reference.Lookup(1, 3, 4, "pm1")
    text = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 5, 6]
    truth = text + [7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 1, 2, 3, 5, 6, 7, 8] * 3
    n = len(text)
    while n < len(truth):
        seqs = [FakeSeq(0, truth[:n]), FakeSeq(1, truth[:max(2, n - 5)])]
        a, b = ours.propose(seqs, [8, 3]), ref.propose(seqs, [8, 3])
        assert a[0] == b[0], n
        accepted = next((k for k, x in enumerate(a[0][0]) if truth[n + k:n + k + 1] != [x]), len(a[0][0]))
        n += accepted + 1


def test_the_watch_refuses_a_model_call_and_an_overlong_draft():
    class CallsAModel:
        layer = torch.nn.Linear(2, 2)

        def release(self, live):
            pass

        def propose(self, seqs, gammas):
            self.layer(torch.zeros(2))
            return [[] for _ in seqs], [[] for _ in seqs]

    class TooLong(CallsAModel):
        def propose(self, seqs, gammas):
            return [[1] * (g + 1) for g in gammas], [[None] * (g + 1) for g in gammas]

    seq = FakeSeq(0, [1, 2, 3])
    with pytest.raises(AssertionError, match="called a model"):
        design.Watched(CallsAModel(), "test").propose([seq], [4])
    assert torch.nn.Linear(2, 2)(torch.zeros(2)).shape == (2,)  # the guard is lifted after the call
    with pytest.raises(AssertionError, match="at most 4"):
        design.Watched(TooLong(), "test").propose([seq], [4])


def test_the_baseline_earns_nothing_and_the_thresholds_sit_between_the_designs():
    assert credit(design.PLAIN_DECODING, at_least=design.MIN_TOKENS_PER_CALL, baseline=design.PLAIN_DECODING) == 0
    assert design.PLAIN_DECODING < design.MIN_TOKENS_PER_CALL < 1.80  # the weakest honest design, hidden prompts
    assert 0.715 < design.MAX_REJECTED_PER_TOKEN < 1.04  # fixed γ=5 at worst passes; a blind γ=8 fails
    ns: dict = {}
    exec(reference.BASELINE["design-proposer"], ns)
    baseline = ns["PromptLookupProposer"]()
    assert baseline.propose([FakeSeq(0, [1, 2, 1, 2])], [8]) == ([[]], [[]])


def test_the_solution_clears_both_targets_on_the_visible_prompts():
    torch.set_num_threads(1)
    from autograder.notebook_checks import VISIBLE_GOLDEN, load_model

    with open(VISIBLE_GOLDEN) as f:
        prompts = design.prompts_of(json.load(f))
    model = load_model()
    run = design.run_lookup(model, solution_class()(), prompts, "solution")
    assert run["tokens_per_call"] >= 1.2 * design.MIN_TOKENS_PER_CALL  # 2.14 measured
    assert run["rejected_per_token"] <= 0.5 * design.MAX_REJECTED_PER_TOKEN  # 0.29 measured
    assert run["outputs"] == design.plain_outputs(model, prompts)


def test_the_numbers_solution_gives_the_best_gamma_with_a_clear_optimum():
    ns: dict = {}
    exec(cell("numbers-answers"), ns)
    assert (ns["BEST_GAMMA_DRAFT"], ns["BEST_GAMMA_LOOKUP"]) == (3, 4)
    assert abs(ns["SPEEDUP_DRAFT"] - 1.6738) < 1e-3

    def draft(g):
        return (1 - 0.6 ** (g + 1)) / (0.4 * (0.1 * g + 1))

    def lookup(g):
        return (1 - 0.75 ** (g + 1)) / (0.25 * (1 + 0.14 * g))

    for f, best in ((draft, 3), (lookup, 4)):  # the neighbours lose by more than rounding could hide
        assert f(best) - max(f(best - 1), f(best + 1)) > 0.02
