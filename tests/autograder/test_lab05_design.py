"""Lab 05's design part, the Lab 01 search on paged memory (autograder/labs/lab05/search.py): the session's contract,
the measured designs against the targets, and the solution cell's completions against Lab 01's beam search.

The threshold's power (the unshared layout fails it) is shown by ``autograder verify lab05``; here, what needs no
grading pipeline: the worked example's numbers, a leak and a pass outside the session caught, the honest designs of
autograder/qa/design/lab05.py meeting both targets on the visible prompts and the baseline and greedy decoding
missing one, and the solution's completions equal to Lab 01's reference beam on every visible prompt.
"""
import functools

import numpy as np
import pytest
import torch

import autograder.notebook_checks as checks
from autograder.labs.lab01 import search as lab01
from autograder.labs.lab05 import search
from autograder.notebook_checks.ledger import credit
from autograder.qa.design import lab01 as lab01_designs, lab05 as designs
from autograder_support import notebook_cell
from miniengine.attention import NoCacheBackend
from miniengine.paths import REPO_ROOT

LAB05 = REPO_ROOT / "labs" / "lab05_paged_attention" / "lab05_paged_attention.ipynb"
BLOCKS_TARGET, BLOCKS_BASELINE, LL_TARGET = 14, 23, -1.0202  # the visible test cell's


cell = functools.partial(notebook_cell, LAB05)  # a cell's source by its grade_id


def notebook_function(source: str):
    ns = {"__name__": "__main__", "np": np}
    exec(source, ns)
    return ns["paged_search"]


@pytest.fixture(scope="module")
def model64():
    return checks.load_model(torch.float64)


def measured(design, model64):
    data = lab01.visible_search()
    peaks, scores, completions = [], [], []
    for case in data["cases"]:
        p = case["params"]
        tokens, passes, peak, left = search.run_paged(design, model64, case["prompt_token_ids"], p["max_tokens"],
                                                      p["budget"], data["eos_token_id"], case["name"])
        assert left == 0 and passes <= p["budget"]
        peaks.append(peak)
        completions.append(tokens)
        scores.append(lab01.mean_log_likelihood(model64, case["prompt_token_ids"], tokens))
    return float(np.mean(peaks)), float(np.mean(scores)), completions


def test_the_worked_example_fork_shares_and_copy_does_not(model64):
    for share, want in (("fork", (3, 6, 5)), ("copy", (12, 12, 9))):
        session = search.SearchSession(model64)
        root, _ = session.start(list(range(1, 10)))
        cands = [root] + [getattr(session, share)(root) for _ in range(3)]
        held = [session.blocks_in_use]
        session.extend(cands, [11, 12, 13, 14])
        held.append(session.blocks_in_use)
        session.free(cands[0])
        held.append(session.blocks_in_use)
        assert tuple(held) == want, share


def test_a_forked_candidate_reads_the_same_history_as_a_fresh_one(model64):
    session = search.SearchSession(model64)
    root, _ = session.start([5, 6, 7, 8, 9])
    child = session.fork(root)
    forked = session.extend([root, child], [10, 11])  # both write position 5, in the block they shared
    assert np.allclose(forked[0], _last(model64, [5, 6, 7, 8, 9, 10]), atol=1e-9)
    assert np.allclose(forked[1], _last(model64, [5, 6, 7, 8, 9, 11]), atol=1e-9)


def _last(model, ids):
    with torch.no_grad():
        rows = model(torch.tensor(ids), torch.arange(len(ids)), NoCacheBackend([len(ids)]))
    return torch.log_softmax(rows[-1].double(), -1).numpy()


def test_a_leak_a_pass_outside_the_session_and_a_dead_candidate_are_caught(model64):
    def leaky(session, prompt_ids, max_tokens, budget, eos):
        session.fork(session.start(prompt_ids)[0])
        return [1]

    assert search.run_paged(leaky, model64, [5, 6, 7], 1, 4, 0, "leaky")[3] > 0

    def outside(session, prompt_ids, max_tokens, budget, eos):
        model64(torch.tensor(prompt_ids), torch.arange(3), NoCacheBackend([3]))
        return [1]

    with pytest.raises(AssertionError, match="ran the model itself"):
        search.run_paged(outside, model64, [5, 6, 7], 1, 4, 0, "outside")

    def dead(session, prompt_ids, max_tokens, budget, eos):
        cand, _ = session.start(prompt_ids)
        session.free(cand)
        session.extend([cand], [1])

    with pytest.raises(AssertionError, match="is not a live candidate"):
        search.run_paged(dead, model64, [5, 6, 7], 1, 4, 0, "dead")

    def spendthrift(session, prompt_ids, max_tokens, budget, eos):
        for _ in range(budget + 1):
            session.free(session.start(prompt_ids)[0])

    with pytest.raises(AssertionError, match="pass 5 of a budget of 4"):
        search.run_paged(spendthrift, model64, [5, 6, 7], 1, 4, 0, "spendthrift")


@pytest.mark.slow
def test_honest_designs_meet_both_targets_and_the_baseline_and_greedy_miss_one(model64):
    for name, design in designs.DESIGNS.items():
        peak, score, _ = measured(design, model64)
        share = min(credit(peak, at_most=BLOCKS_TARGET, baseline=BLOCKS_BASELINE),
                    credit(score, at_least=LL_TARGET, baseline=-1.11))
        honest = "copies" not in name and "greedy" not in name
        assert (share == 1) == honest, (name, peak, score, share)
    peak, _, _ = measured(notebook_function(designs.BASELINE["design-paged-search"]), model64)
    assert peak == BLOCKS_BASELINE  # the baseline's value is the one the cell states


@pytest.mark.slow
def test_the_solution_finds_lab01s_completions_on_paged_memory(model64):
    _, _, paged = measured(notebook_function(cell("design-paged-search")), model64)
    data = lab01.visible_search()
    naive = [lab01_designs.beam(model64, c["prompt_token_ids"], c["params"]["max_tokens"], c["params"]["budget"],
                                data["eos_token_id"]) for c in data["cases"]]
    assert paged == naive


def test_a_search_cannot_lower_the_peak_the_harness_reads(model64):
    """The search gets a view of the session that takes no attributes: the counter the harness reads stays its own."""
    for attack in ("session._peak = 0", "session.peak_blocks = 0"):
        def steer(session, prompt_ids, max_tokens, budget, eos, attack=attack):
            cand, _ = session.start(prompt_ids)
            session.free(cand)
            exec(attack, {"session": session})
            return [1]

        with pytest.raises(AttributeError):
            search.run_paged(steer, model64, [5, 6, 7, 8, 9], 1, 4, 0, "steer")
