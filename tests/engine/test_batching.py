"""Continuous and static batching on the real engine: golden tokens under arrival traces, and the scheduler's
invariants checked after every step (no request lost or duplicated, budgets kept, a finished request leaves at
its step, first-come first-served among the waiting, every request served)."""
import numpy as np
import pytest
from scheduler_invariants import Invariants, VirtualClock, poisson_trace

from miniengine import EngineConfig, SamplingParams
from miniengine.engine import ContinuousBatching, LLMEngine, StaticBatching, TraceRequest, replay


def serve(cases, policy, seed=0, rate=20.0, **budgets):
    clock = VirtualClock()
    engine = LLMEngine(EngineConfig(scheduling_policy=policy, **budgets), clock=clock, sleep=clock.sleep)
    inv = Invariants(engine)
    results = replay(engine, poisson_trace(cases, rate, seed))
    for r in results:
        case = cases[r.request.request_id]
        assert r.seq.output_token_ids == case["token_ids"], (case["name"], type(policy).__name__)
        assert len(r.timeline.token_times) == len(case["token_ids"])
    assert inv.finished == {q.seq_id for q in inv.added}  # nobody starved: every request was served
    return engine, inv, results


@pytest.mark.parametrize("policy", [ContinuousBatching(), StaticBatching(batch_size=6, timeout_s=0.05)],
                         ids=["continuous", "static"])
def test_golden_tokens_under_a_poisson_trace(golden, hidden_golden, policy):
    """All 80 golden cases (greedy and sampled) arrive as a seeded Poisson trace; every one stays token-exact."""
    serve(golden["cases"] + hidden_golden["cases"], policy, max_num_seqs=16, max_num_batched_tokens=256,
          kv_cache_tokens=2048)


@pytest.mark.parametrize("seed", range(5))
def test_random_arrival_orders_and_budgets(golden, seed):
    """Property test: random arrival order and rate, random budgets, both policies."""
    rng = np.random.default_rng(100 + seed)
    policy = ContinuousBatching() if seed % 2 == 0 else StaticBatching(int(rng.integers(1, 8)), float(rng.uniform(0, 0.2)))
    longest = max(len(c["prompt_token_ids"]) + c["params"]["max_tokens"] for c in golden["cases"])
    serve(golden["cases"], policy, seed=seed, rate=float(rng.uniform(2, 200)),
          max_num_seqs=int(rng.integers(1, 12)), max_num_batched_tokens=int(rng.integers(64, 400)),
          kv_cache_tokens=int(rng.integers(longest, 6 * longest)))


def test_static_batching_admits_only_when_its_batch_is_done(golden):
    engine, inv, results = serve(golden["cases"][:12], StaticBatching(batch_size=4, timeout_s=0.0), rate=1000.0,
                                 max_num_seqs=16)
    starts = sorted({r.timeline.scheduled for r in results})
    ends = {}
    for r in results:
        ends.setdefault(r.timeline.scheduled, []).append(r.timeline.token_times[-1])
    for a, b in zip(starts, starts[1:]):
        assert b >= max(ends[a]), "a new batch started before the previous one had finished"


def test_continuous_batching_lets_a_request_join_at_the_next_step(golden):
    """A request that arrives while others decode gets its first token long before they finish."""
    cases = golden["cases"][:6]
    _, _, results = serve(cases, ContinuousBatching(), rate=5.0, max_num_seqs=16)
    for r in results:
        assert r.timeline.scheduled - r.timeline.arrival < 0.1  # it waited for one step at most


def test_the_invariant_checker_catches_a_policy_that_jumps_the_queue(golden):
    class NewestFirst:
        def admit(self, waiting, running, budget):
            return list(reversed(waiting))[: max(0, min(1, budget.max_seqs))]

    with pytest.raises(AssertionError, match="a later request was admitted before an earlier one"):
        serve(golden["cases"][:8], NewestFirst(), rate=1000.0, max_num_seqs=4)


def test_the_invariant_checker_catches_a_request_kept_after_it_stopped(golden, monkeypatch):
    from miniengine.engine import scheduler
    monkeypatch.setattr(scheduler, "stop_reason", lambda seq, tok, eos: None if len(seq.output_token_ids) < 3 else "length")
    with pytest.raises(AssertionError):
        serve(golden["cases"][:4], ContinuousBatching(), rate=1000.0)


def test_bench_serve_runs_every_policy_on_the_same_tokens(capsys):
    from types import SimpleNamespace

    from miniengine.course import bench
    args = SimpleNamespace(model="target", requests=6, rate=500.0, mean_new_tokens=6, output_sigma=0.5, max_num_seqs=8,
                           static_batch=3, seed=1)
    assert bench.serve(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert "same tokens under every policy: True" in out
    assert out[-1].startswith("continuous/sequential throughput: ") and out[-1].endswith("x")
