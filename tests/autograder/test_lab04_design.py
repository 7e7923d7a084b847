"""Lab 04's design part, an SLO-aware scheduling policy: the harness's rules (lab04/design.py), the solution cell
against the instructors' designs (autograder/qa/design/lab04.py), the pasted FCFS figures, and the predictor.

The threshold's power (FCFS in the design slot fails it) is shown by ``autograder verify lab04``; here, what needs
no grading pipeline: the pasted FCFS goodputs are the course's ContinuousBatching's, the solution clears the target
on the visible traces with the margin the reference measured, and the planted bugs (a policy that starves, one that
loses a request, FCFS itself) get the score and the message they should.
"""
import functools
import inspect
import json
import textwrap

import pytest

from autograder.labs.lab04 import design
from autograder.notebook_checks.ledger import credit
from autograder.qa.design import lab04 as reference
from autograder_support import notebook_cell
from miniengine.engine.policy import Budget, ContinuousBatching
from miniengine.paths import REPO_ROOT
from miniengine.serving import metrics, simulator as sim

LAB04 = REPO_ROOT / "labs" / "lab04_continuous_batching" / "lab04_continuous_batching.ipynb"


cell = functools.partial(notebook_cell, LAB04)  # a cell's source by its grade_id


def notebook_class(source: str, name: str = "SLOAwarePolicy"):
    ns: dict = {"__name__": "__main__"}
    exec(cell("fits"), ns)  # the solution cell calls fits by name, as the notebook's does
    exec(source, ns)
    return ns[name]


def as_notebook_class(cls):
    """A planted design, compiled as if written in the notebook (own_policy insists on that)."""
    source = textwrap.dedent(inspect.getsource(cls))
    source = source.replace(f"class {cls.__name__}(", "class SLOAwarePolicy(").replace(
        f"class {cls.__name__}:", "class SLOAwarePolicy:")
    ns = {"__name__": "__main__", "Honest": reference.Honest, "ContinuousBatching": ContinuousBatching}
    exec(compile(source, "<cell>", "exec"), ns)
    return ns["SLOAwarePolicy"]


@pytest.mark.parametrize("key", sorted(design.FCFS_GOODPUT))
def test_the_pasted_fcfs_goodputs_are_the_course_policys(key):
    requests = design.serve(ContinuousBatching(), *key)
    got = metrics.goodput([r.timeline for r in requests], metrics.SLO())
    assert got == pytest.approx(design.FCFS_GOODPUT[key], rel=1e-8)


def test_the_solution_clears_the_target_on_the_visible_traces_as_the_reference_design_does():
    solution = notebook_class(cell("design-policy"))
    ratios = design.goodput_ratios(solution, reference.VISIBLE, "")
    mean = sum(ratios) / len(ratios)
    assert mean >= design.MIN_RATIO + 0.3, ratios  # measured 1.624: a margin, not a coin toss
    same = [reference.ratio(reference.Honest("work"), *t) for t in reference.VISIBLE]
    assert ratios == pytest.approx(same, rel=1e-12)  # the cell is the reference's "prompt + predicted output" rule


def test_fcfs_itself_earns_nothing():
    baseline = notebook_class(reference.BASELINE["design-policy"])
    ratios = design.goodput_ratios(baseline, reference.VISIBLE[:2], "")
    assert ratios == pytest.approx([1.0, 1.0], rel=1e-9)
    assert credit(sum(ratios) / 2, at_least=design.MIN_RATIO, baseline=design.FCFS_RATIO) == 0


def test_a_policy_that_starves_fails_however_good_its_goodput():
    with pytest.raises(AssertionError, match=r"had waited 5\.\d\d s when request \d+, which arrived after it, "
                                             r"started first"):
        design.goodput_ratios(as_notebook_class(reference.Starving), [(100.0, 0)], "")


def test_a_policy_that_loses_a_request_fails_naming_it():
    with pytest.raises(AssertionError, match=r"trace \(80 requests/s, seed 0\): the policy went idle with "
                                             r"unfinished requests \[47"):
        design.goodput_ratios(as_notebook_class(reference.Loses), [(80.0, 0)], "")


class Greedy:
    max_num_seqs = None

    def admit(self, waiting, running, budget):
        return list(waiting)  # everyone, whatever the seats and tokens


def test_a_policy_that_breaks_the_budget_fails_with_the_schedulers_rule():
    with pytest.raises(AssertionError, match=r"SLOAwarePolicy.admit returned \d+ (sequences|prompt tokens)"):
        design.goodput_ratios(as_notebook_class(Greedy), [(80.0, 0)], "")


def test_an_imported_policy_is_refused():
    with pytest.raises(AssertionError, match="must be a class written"):
        design.goodput_ratios(reference.Honest, [(80.0, 0)], "")


def test_the_solution_works_without_a_predictor():
    solution = notebook_class(cell("design-policy"))
    seqs = tuple(type("S", (), {"seq_id": i, "num_new_tokens": 10, "arrival_time": 0.0})() for i in range(3))
    got = solution().admit(seqs, (), Budget(2, 100, lambda s: True, now=0.5))
    assert [s.seq_id for s in got] == [0, 1]


def test_predictions_are_seeded_noisy_and_leave_the_workload_as_it_was():
    plain = sim.chat_workload(50, 10.0, seed=3)
    guessed = sim.with_predictions(sim.chat_workload(50, 10.0, seed=3), 0.5, seed=3)
    assert [(r.arrival, r.prompt_len, r.output_len) for r in plain] == [
        (r.arrival, r.prompt_len, r.output_len) for r in guessed]
    again = sim.with_predictions(sim.chat_workload(50, 10.0, seed=3), 0.5, seed=3)
    assert [r.predicted_len for r in guessed] == [r.predicted_len for r in again]
    assert any(r.predicted_len != r.output_len for r in guessed)
    exact = sim.with_predictions(sim.chat_workload(50, 10.0, seed=3), 0.0)
    assert all(r.predicted_len == r.output_len for r in exact)
    with pytest.raises(ValueError, match="sigma"):
        sim.with_predictions(plain, -1.0)


def test_the_simulator_shows_the_prediction_to_the_policy_and_nothing_else():
    seen = []

    class Peek(ContinuousBatching):
        def admit(self, waiting, running, budget):
            seen.extend(s.predicted_output_len for s in waiting)
            return super().admit(waiting, running, budget)

    requests = sim.with_predictions(sim.chat_workload(20, 5.0, seed=1), 0.5, seed=1)
    sim.simulate(requests, Peek(), design.CostModel(design.llama3_8b(), design.GPUS["H100"]))
    assert set(seen) <= {r.predicted_len for r in requests} and seen
    plain = sim.chat_workload(5, 5.0, seed=1)
    sim.simulate(plain, ContinuousBatching(), design.CostModel(design.llama3_8b(), design.GPUS["H100"]))
    assert all(r.seq.predicted_output_len is None for r in plain)


def test_on_the_real_engine_a_policy_reads_none_for_the_prediction():
    seen = []

    class Reads:
        max_num_seqs = None

        def admit(self, waiting, running, budget):
            seen.extend(s.predicted_output_len for s in waiting)  # no getattr: the task promises the attribute
            return [s for s in waiting][:budget.max_seqs][:1]

    golden = REPO_ROOT / "data" / "golden" / "visible.json"
    cases = json.loads(golden.read_text())["cases"][:2]
    outs = design.generate(lambda: design.NoPredictor(Reads()), cases, max_num_seqs=8, max_num_batched_tokens=64)
    assert [list(o.token_ids) for o in outs] == [c["token_ids"] for c in cases] and seen and set(seen) == {None}
