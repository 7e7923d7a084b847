"""Prefill/decode disaggregation on the simulator (miniengine/disagg.py)."""
from __future__ import annotations

import numpy as np
import pytest

from miniengine import disagg, metrics, sim
from miniengine.roofline import GPUS, CostModel, llama3_8b

COST = CostModel(llama3_8b(), GPUS["H100"])


def long_prompts():
    """Chats with some long prompts: the workload where colocated decodes get stalled by prefills."""
    return sim.chat_workload(120, 8.0, seed=1, prompt_mean=2048, output_mean=128)


def test_every_request_gets_all_its_tokens_in_both_arrangements():
    want = {r.id: r.output_len for r in long_prompts()}
    for arrangement in (disagg.colocated(long_prompts(), COST, 4),
                        disagg.disaggregated(long_prompts(), COST, 4, 1, 50e9)):
        got = {t.request_id: len(t.token_times) for t in arrangement.timelines}
        assert got == want, arrangement.name


def test_the_first_token_pays_the_prefill_and_the_rest_pay_the_transfer():
    reqs = [sim.SimRequest(0, 0.0, 1000, 3)]
    run = disagg.disaggregated(reqs, COST, 2, 1, 10e9)
    t = run.timelines[0]
    prefill = COST.forward([1000], [0]).step_time_s
    transfer = 1000 * COST.kv_bytes_per_token / 10e9
    assert t.token_times[0] == pytest.approx(prefill)
    assert t.token_times[1] == pytest.approx(prefill + transfer + COST.forward([1], [1001]).step_time_s)


def test_decodes_are_never_stalled_by_a_prefill_when_disaggregated():
    together = disagg.colocated(long_prompts(), COST, 4)
    apart = disagg.disaggregated(long_prompts(), COST, 4, 1, 50e9)
    worst = {a.name: max(float(np.max(metrics.itl(t))) for t in a.timelines if len(t.token_times) > 1)
             for a in (together, apart)}
    # a colocated step that holds a 2,000-token prefill is far longer than any decode-only step
    assert worst[apart.name] < worst[together.name] / 2, worst


@pytest.mark.parametrize("args, words", [
    ((4, 0, 1e9), "prefill_gpus must be an integer in \\[1, 3\\]"),
    ((4, 4, 1e9), "prefill_gpus must be an integer in \\[1, 3\\]"),
    ((0, 1, 1e9), "gpus must be an integer >= 1"),
    ((4, 1, 0.0), "link_bytes_per_s must be > 0"),
])
def test_bad_arrangements_are_named(args, words):
    with pytest.raises(ValueError, match=words):
        disagg.disaggregated(long_prompts(), COST, *args)
