"""miniengine.course.admission: Clockwork-style admission at arrival, as Lecture 3 runs it."""
from __future__ import annotations

import numpy as np
import pytest

from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
from miniengine.course.admission import admit_at_arrival
from miniengine.serving import metrics, simulator as sim

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def test_a_hand_traced_queue():
    # Three requests: A arrives at 0 and holds the server 3 s (prefill 1 s); B at 1 s, C at 2 s, each 1 s long.
    arrivals, prefill, service = [0.0, 1.0, 2.0], [1.0, 0.5, 0.5], [3.0, 1.0, 1.0]
    everyone = admit_at_arrival(arrivals, prefill, service, slo_ttft_s=2.0)
    assert everyone.accepted.all() and np.isnan(everyone.predicted_ttft_s).all()
    # B starts at 3 (TTFT 3 - 1 + 0.5), C at 4 (TTFT 4 - 2 + 0.5): both miss a 2 s target.
    assert everyone.ttft_s.tolist() == [1.0, 2.5, 2.5]
    assert everyone.late.tolist() == [False, True, True] and everyone.attainment == pytest.approx(1 / 3)

    # Guessing every request takes 1 s: A is predicted to end at 1 s, but at B's arrival it has already run 1 s,
    # so the guess is "now": B is predicted on time (0.5 s), accepted, and late (2.5 s).  For C the controller
    # still thinks A ends now and B runs 1 s: predicted TTFT 1.5 s, accepted, late too.
    guess = admit_at_arrival(arrivals, prefill, service, 2.0, estimate_s=[1.0, 1.0, 1.0])
    assert guess.predicted_ttft_s.tolist() == [1.0, 0.5, 1.5] and guess.accepted.all()
    assert guess.late_share == pytest.approx(2 / 3)

    # Overestimating (5 s each) rejects B, after which C would have started at 3 s, on time: a wrong rejection.
    cautious = admit_at_arrival(arrivals, prefill, service, 2.0, estimate_s=[5.0, 5.0, 5.0])
    assert cautious.accepted.tolist() == [True, False, False]
    assert cautious.ttft_s.tolist() == [1.0, 2.5, 1.5]
    assert cautious.wrongly_rejected.tolist() == [False, False, True] and cautious.wrong_reject_share == 0.5


def test_accepting_everyone_is_the_simulators_fcfs_run_and_the_oracle_never_errs():
    paper = CostModel(llama3_8b(), GPUS["H100"])
    requests = sim.chat_workload(120, rate=0.5, seed=3)
    prefill = np.array([paper.prefill(1, r.prompt_len).step_time_s for r in requests])
    service = prefill + np.array([paper.decode_run_times([r.prompt_len], r.output_len - 1).sum() for r in requests])
    arrivals = [r.arrival for r in requests]

    everyone = admit_at_arrival(arrivals, prefill, service, slo_ttft_s=1.0)
    served = sim.simulate(requests, sim.FCFS(), paper)
    assert np.allclose(everyone.ttft_s, [metrics.ttft(t) for t in served.timelines], rtol=0, atol=1e-9)

    oracle = admit_at_arrival(arrivals, prefill, service, 1.0, estimate_s=service)
    assert np.allclose(oracle.predicted_ttft_s, oracle.ttft_s, rtol=0, atol=1e-9)
    assert not oracle.late.any() and not oracle.wrongly_rejected.any()
    assert oracle.attainment > everyone.attainment


@pytest.mark.parametrize("kwargs, field", [
    ({"arrivals_s": [1.0, 0.0]}, "arrivals_s"),
    ({"prefill_s": [1.0]}, "prefill_s"),
    ({"service_s": [0.5, 2.0]}, "prefill_s"),  # a service time shorter than its prefill
    ({"service_s": [2.0, float("nan")]}, "service_s"),
    ({"estimate_s": [1.0, -1.0]}, "estimate_s"),
    ({"slo_ttft_s": 0}, "slo_ttft_s"),
])
def test_bad_input_names_its_field(kwargs, field):
    args = {"arrivals_s": [0.0, 1.0], "prefill_s": [1.0, 1.0], "service_s": [2.0, 2.0], "slo_ttft_s": 1.0,
            "estimate_s": None, **kwargs}
    with pytest.raises(ValueError, match=field):
        admit_at_arrival(**args)
