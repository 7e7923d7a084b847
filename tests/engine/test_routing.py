"""Replicas behind a router on the simulator (miniengine/serving/routing.py): every request served once, prefix hits
priced as cached tokens, and prefix-aware routing keeping prefixes together within its load bound."""
import pytest

from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
from miniengine.engine import ContinuousBatching
from miniengine.serving import metrics
from miniengine.serving.routing import (LeastLoaded, PrefixAware, RoundRobin, _Load, serve_replicas,
                                        shared_prefix_workload)

PAPER = CostModel(llama3_8b(), GPUS["H100"])


@pytest.fixture(scope="module")
def workload():
    return shared_prefix_workload(600, 200, seed=3)  # past what 4 replicas serve without the prefix cache


@pytest.mark.parametrize("router", [RoundRobin, LeastLoaded, PrefixAware])
def test_every_request_is_served_once_with_all_its_tokens(workload, router):
    out = serve_replicas(workload, router(), 4, ContinuousBatching, PAPER)
    assert sorted(t.request_id for t in out["timelines"]) == [w.request.id for w in workload]
    want = {w.request.id: w.request.output_len for w in workload}
    assert all(t.output_tokens == want[t.request_id] for t in out["timelines"])
    assert sum(out["requests_per_replica"]) == len(workload)
    assert out["prefill_tokens"] == out["prompt_tokens"] - out["hit_rate"] * len(workload) * workload[0].prefix_len


def test_prefix_aware_routing_hits_more_and_meets_the_slo_where_round_robin_does_not(workload):
    slo = metrics.SLO(1.0, 0.05)
    rr = serve_replicas(workload, RoundRobin(), 4, ContinuousBatching, PAPER)
    pa = serve_replicas(workload, PrefixAware(), 4, ContinuousBatching, PAPER)
    assert pa["hit_rate"] > rr["hit_rate"] + 0.2
    assert metrics.slo_attainment(pa["timelines"], slo) > metrics.slo_attainment(rr["timelines"], slo) + 0.2


def test_a_hit_feeds_only_the_requests_own_tokens():
    one = shared_prefix_workload(2, 0.001, num_prefixes=1, seed=0)  # far apart: the second finds the prefix cached
    out = serve_replicas(one, RoundRobin(), 1, ContinuousBatching, PAPER)
    assert out["hit_rate"] == 0.5
    first, second = sorted(out["timelines"], key=lambda t: t.request_id)
    cold = PAPER.forward([one[1].request.prompt_len], [0]).step_time_s
    warm = PAPER.forward([one[1].request.prompt_len - one[1].prefix_len], [one[1].prefix_len]).step_time_s
    assert metrics.ttft(second) == pytest.approx(warm) and warm < cold


def test_prefix_aware_never_exceeds_its_load_bound():
    router, load = PrefixAware(balance=2), _Load(3, window_s=100.0)
    owner = {}
    for i, w in enumerate(shared_prefix_workload(200, 50, num_prefixes=2, seed=1)):
        loads = load.at(w.request.arrival)
        k = router.route(w, loads, owner)
        assert loads[k] - min(loads) <= 2
        load.add(k, w.request.arrival)
        owner[w.prefix] = k
