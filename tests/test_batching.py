"""Continuous and static batching on the real engine: golden tokens under arrival traces, and the scheduler's
invariants checked after every step (no request lost or duplicated, budgets kept, a finished request leaves at
its step, first-come first-served among the waiting, every request served)."""
import numpy as np
import pytest

from miniengine import EngineConfig, SamplingParams
from miniengine.engine import ContinuousBatching, LLMEngine, StaticBatching, TraceRequest, replay
from kv_checks import check_kv_accounting


class VirtualClock:
    """Time moves only when the engine looks at it (a fixed cost per call) or sleeps: runs are reproducible."""

    def __init__(self, tick=0.01):
        self.t, self.tick = 0.0, tick

    def __call__(self):
        self.t += self.tick
        return self.t

    def sleep(self, seconds):
        self.t += max(0.0, seconds)


class Invariants:
    """Wraps an engine's scheduler and checks the invariants after every step."""

    def __init__(self, engine):
        self.engine, self.sched = engine, engine.scheduler
        self.added, self.finished, self.steps, self.waited = [], set(), 0, {}
        add, schedule, postprocess = engine.add_request, self.sched.schedule, self.sched.postprocess

        def add_request(*a, **k):
            seq = add(*a, **k)
            self.added.append(seq)
            return seq

        def checked_schedule(now=0.0):
            self.head = [s.seq_id for s in self.sched.waiting]
            batch = schedule(now)
            self.batch = batch
            return batch

        def checked_postprocess(batch, tokens):
            done = postprocess(batch, tokens)
            self.check(batch, done)
            return done

        engine.add_request, self.sched.schedule, self.sched.postprocess = add_request, checked_schedule, checked_postprocess

    def check(self, batch, done):
        s, c = self.sched, self.engine.config
        self.steps += 1
        live = [q.seq_id for q in s.waiting] + [q.seq_id for q in s.running]
        assert len(live) == len(set(live)), "a request is queued twice"
        self.finished |= {q.seq_id for q in done}
        assert not self.finished & set(live), "a finished request is still queued"
        assert set(live) | self.finished == {q.seq_id for q in self.added}, "a request was lost"
        assert len(batch.seqs) <= min(c.max_num_seqs, getattr(s.policy, "max_num_seqs", None) or c.max_num_seqs)
        assert batch.num_tokens <= c.max_num_batched_tokens
        for q in batch.seqs:  # a request leaves exactly at the step whose token stops it
            last, p = q.token_ids[-1], q.params
            stops = (last == s.eos_token_id and not p.ignore_eos) or len(q.output_token_ids) >= p.max_tokens
            assert stops == q.is_finished == (q in done), q
        prefilled = [q.seq_id for q in batch.seqs if q.seq_id in self.head]  # waiting before, running now
        assert prefilled == self.head[:len(prefilled)], "a later request was admitted before an earlier one"
        assert [q.seq_id for q in s.waiting] == sorted(q.seq_id for q in s.waiting), "the waiting queue lost its order"
        check_kv_accounting(self.engine.kv, s.running, f"step {self.steps}")
        for q in s.waiting:
            self.waited[q.seq_id] = self.waited.get(q.seq_id, 0) + 1


def poisson_trace(cases, rate, seed):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, len(cases)))
    order = rng.permutation(len(cases))
    return [TraceRequest(float(a), cases[i]["prompt_token_ids"], SamplingParams(**cases[i]["params"]), request_id=int(i))
            for a, i in zip(arrivals, order)]


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

    from miniengine import bench
    args = SimpleNamespace(model="target", requests=6, rate=500.0, mean_new_tokens=6, output_sigma=0.5, max_num_seqs=8,
                           static_batch=3, seed=1)
    assert bench.serve(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert "same tokens under every policy: True" in out
    assert out[-1].startswith("continuous/sequential throughput: ") and out[-1].endswith("x")
