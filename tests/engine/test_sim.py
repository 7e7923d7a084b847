"""Workloads, the event loop driving the engine's scheduler, the two baseline policies, and the queueing experiment.

The experiment is the worked example of Stanford CS349D "AI Inference Infrastructure" (Spring 2026),
lecture 1 "Introduction", as this course retells it in lecture 03 (miniengine/README.md, "Cost model"):
Llama-3-8B on one H100 (the paper GPU's default conventions), chat requests with lognormal
prompt/output lengths of means 512/256 arriving as a Poisson process, SLO TTFT <= 1 s and
TPOT <= 50 ms.  The worked example's own sample of requests is not published, so its figures that
depend on the sample (P99s, exact goodputs) are checked for their shape and rough size, not to 1%;
the figures that follow from the cost model (the throughput ceiling, its price) are checked to 1%.
"""
import functools
import math

import numpy as np
import pytest

from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
from miniengine.engine import FCFSPolicy
from miniengine.serving import metrics, simulator as sim
from miniengine.serving.metrics import SLO
from miniengine.serving.simulator import FCFS, SimRequest, StaticBatching

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)

H100_8B = CostModel(llama3_8b(), GPUS["H100"])
CHAT_SLO = SLO(ttft_s=1.0, tpot_s=0.05)


# ---------------------------------------------------------------- workload


def test_lognormal_lengths_have_the_requested_mean():
    # The worked example's chat workload: lognormal lengths with *means* 512 and 256.  With sigma = 1 the
    # median is mean * exp(-1/2), about 0.61 of the mean.
    rng = np.random.default_rng(123)
    for mean in (512, 256):
        x = sim.lognormal_lengths(rng, mean, 1.0, 200_000)
        assert x.mean() == pytest.approx(mean, rel=0.01)
        assert np.median(x) == pytest.approx(mean * math.exp(-0.5), rel=0.02)
        assert x.min() >= 1


def test_workload_is_seeded_and_rate_only_rescales_arrivals():
    a = sim.chat_workload(50, rate=1.0, seed=7)
    b = sim.chat_workload(50, rate=1.0, seed=7)
    c = sim.chat_workload(50, rate=4.0, seed=7)
    assert [(r.arrival, r.prompt_len, r.output_len) for r in a] == [(r.arrival, r.prompt_len, r.output_len) for r in b]
    assert [(r.prompt_len, r.output_len) for r in a] == [(r.prompt_len, r.output_len) for r in c]
    assert [r.arrival / 4 for r in a] == pytest.approx([r.arrival for r in c])
    assert [r.output_len for r in sim.chat_workload(50, 1.0, seed=8)] != [r.output_len for r in a]


def test_poisson_arrivals_have_the_requested_rate():
    reqs = sim.chat_workload(20_000, rate=0.5, seed=1)
    gaps = np.diff([0.0] + [r.arrival for r in reqs])
    assert gaps.mean() == pytest.approx(2.0, rel=0.03)
    assert gaps.std() == pytest.approx(2.0, rel=0.05)  # exponential: std = mean


@pytest.mark.parametrize("kwargs", [dict(n=0, rate=1.0), dict(n=5, rate=0.0)])
def test_workload_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        sim.chat_workload(**kwargs)


# ---------------------------------------------------------------- one request, idle system


def test_one_request_is_one_prefill_then_lo_minus_1_decodes():
    # the CS349D lecture 1 worked example: the prefill produces token 1; then L_o - 1 decode steps, each reading the growing cache.
    r = SimRequest(0, arrival=2.0, prompt_len=100, output_len=5)
    sim.simulate([r], FCFS(), H100_8B)
    prefill = H100_8B.prefill(1, 100).step_time_s
    decodes = [H100_8B.decode(1, 100 + k).step_time_s for k in range(4)]
    assert r.timeline.token_times == pytest.approx(list(2.0 + np.cumsum([prefill] + decodes)))
    assert metrics.ttft(r.timeline) == pytest.approx(prefill)  # no queue on an idle system
    assert r.cached == 104 and r.done  # the last token is never fed back


def test_a_2048_token_answer_takes_over_12_seconds():
    # the CS349D lecture 1 worked example (demo 1, idle system): generating 2048 tokens takes more than 12 s, whatever the prefill.
    r = SimRequest(0, 0.0, prompt_len=512, output_len=2048)
    sim.simulate([r], FCFS(), H100_8B)
    assert 12.0 < metrics.e2e(r.timeline) < 13.0
    assert metrics.tpot(r.timeline) < CHAT_SLO.tpot_s  # streaming itself is fast: ~6 ms per token


def test_mean_request_holds_the_gpu_about_1_6_s():
    # the CS349D lecture 1 worked example: an average request (512 in, 256 out) occupies the GPU about 1.6 s, so a
    # batch-1 server handles about 0.6 requests/s.
    r = SimRequest(0, 0.0, prompt_len=512, output_len=256)
    sim.simulate([r], FCFS(), H100_8B)
    assert round(metrics.e2e(r.timeline), 1) == 1.6
    assert round(1 / metrics.e2e(r.timeline), 1) == 0.6


# ---------------------------------------------------------------- policies


def test_fcfs_serves_in_arrival_order_one_at_a_time():
    reqs = [SimRequest(i, 0.001 * i, 50, 20) for i in range(3)]
    sim.simulate(reqs, FCFS(), H100_8B)
    for earlier, later in zip(reqs, reqs[1:]):
        assert later.timeline.scheduled == pytest.approx(earlier.timeline.finish_time)


def test_static_batch_waits_for_the_timeout_when_not_full():
    reqs = [SimRequest(0, 0.0, 10, 3), SimRequest(1, 0.05, 10, 3)]
    sim.simulate(reqs, StaticBatching(batch_size=4, timeout_s=0.2), H100_8B)
    assert reqs[0].timeline.scheduled == pytest.approx(0.2) == reqs[1].timeline.scheduled


def test_static_batch_starts_as_soon_as_it_is_full():
    reqs = [SimRequest(i, 0.01 * i, 10, 3) for i in range(5)]
    sim.simulate(reqs, StaticBatching(batch_size=4, timeout_s=10.0), H100_8B)
    assert [r.timeline.scheduled for r in reqs[:4]] == pytest.approx([0.03] * 4)
    assert reqs[4].timeline.scheduled == pytest.approx(0.04 + 10.0)  # alone: it waits out its timeout


def test_a_request_that_waited_past_its_timeout_starts_when_the_batch_ends():
    reqs = [SimRequest(i, 0.01 * i, 10, 20) for i in range(5)]
    sim.simulate(reqs, StaticBatching(batch_size=4, timeout_s=0.035), H100_8B)
    assert [r.timeline.scheduled for r in reqs[:4]] == pytest.approx([0.03] * 4)  # full before the timeout
    first_batch_end = max(r.timeline.finish_time for r in reqs[:4])
    assert first_batch_end > 0.04 + 0.035
    assert reqs[4].timeline.scheduled == pytest.approx(first_batch_end)


def test_static_batch_runs_until_its_longest_request_and_wastes_the_seats():
    short, long_ = SimRequest(0, 0.0, 10, 1), SimRequest(1, 0.0, 10, 3)
    nxt = SimRequest(2, 0.0, 10, 1)
    res = sim.simulate([short, long_, nxt], StaticBatching(batch_size=2, timeout_s=0.0), H100_8B)
    assert short.timeline.finish_time < long_.timeline.finish_time == pytest.approx(nxt.timeline.scheduled)
    # 2 decode steps x 2 seats, of which the finished short request holds 2: half the seats wasted.
    assert (res.decode_seat_steps, res.wasted_seat_steps, res.seat_waste) == (4, 2, 0.5)
    assert short.output_len == short.generated and long_.generated == 3


def test_not_padding_finished_requests_makes_steps_cheaper():
    def run(pad):
        reqs = [SimRequest(0, 0.0, 500, 2), SimRequest(1, 0.0, 500, 400)]
        sim.simulate(reqs, StaticBatching(2, 0.0, pad_finished=pad), H100_8B)
        return reqs[1].timeline.finish_time

    assert run(pad=False) < run(pad=True)


def test_the_engines_policy_object_runs_continuous_batching_on_the_simulated_clock():
    """FCFSPolicy with many seats is continuous batching: the very object LLM(scheduling_policy=...) runs."""
    reqs = sim.chat_workload(60, rate=4.0, seed=3)
    res = sim.simulate(reqs, FCFSPolicy(), H100_8B, max_num_seqs=64)
    assert all(r.generated == r.output_len for r in reqs)
    static = sim.simulate(sim.chat_workload(60, rate=4.0, seed=3), StaticBatching(32), H100_8B)
    assert metrics.summarize(res.timelines)["ttft_p50_s"] < metrics.summarize(static.timelines)["ttft_p50_s"]
    assert res.seat_waste == 0.0


def test_the_scheduler_learns_a_request_is_done_only_when_it_ends():
    """Policies see engine Sequences with no output length: max_tokens is unbounded, end-of-text stops them."""
    seen = []

    class Spy(FCFSPolicy):
        def admit(self, waiting, running, budget):
            seen.extend(s for s in waiting if not hasattr(s, "output_len"))
            return super().admit(waiting, running, budget)

    reqs = [SimRequest(0, 0.0, 10, 7)]
    sim.simulate(reqs, Spy(), H100_8B)
    assert seen and seen[0].params.max_tokens >= 1 << 40 and seen[0].finish_reason == "stop"
    assert len(seen[0].output_token_ids) == 7


def test_a_stalled_policy_is_reported():
    class Lazy:
        def admit(self, waiting, running, budget):
            return []

    with pytest.raises(RuntimeError, match="unfinished"):
        sim.simulate([SimRequest(0, 0.0, 5, 5)], Lazy(), H100_8B)


# ---------------------------------------------------------------- the queueing experiment (CS349D lecture 1)

RATES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 2.0)


@functools.lru_cache(maxsize=None)
def run(policy: str, rate: float, batch: int = 32, pad: bool = True) -> sim.SimResult:
    make = FCFS if policy == "fcfs" else functools.partial(StaticBatching, batch, 0.2, pad)
    return sim.simulate(sim.chat_workload(400, rate, seed=0), make(), H100_8B)


def report(result, slo=CHAT_SLO):
    return metrics.summarize(result.timelines, slo)


def test_sweep_returns_one_row_per_rate():
    rows = sim.sweep([0.1, 0.3], FCFS, H100_8B, n_requests=50)
    assert [row["rate"] for row in rows] == [0.1, 0.3]
    assert {"throughput_tok_s", "goodput_req_s", "goodput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p99_s",
            "slo_attainment", "utilization", "seat_waste"} <= set(rows[0])


def test_batch1_throughput_ceiling_and_its_price():
    overloaded = report(run("fcfs", 2.0))
    # the CS349D lecture 1 worked example: the ceiling is only about 160 tokens/s ...
    assert round(overloaded["throughput_tok_s"], -1) == 160
    # ... which at $3/hour for the H100 is $5.14 per million output tokens (the CS349D lecture 1 worked example).
    assert metrics.cost_per_million_tokens(3.0, overloaded["throughput_tok_s"]) == pytest.approx(5.14, rel=0.01)
    assert 0.55 < overloaded["throughput_req_s"] < 0.7  # about 0.6 requests/s
    assert run("fcfs", 2.0).utilization == pytest.approx(1.0, abs=0.01)


def test_batch1_tail_latency_at_low_utilization():
    # the CS349D lecture 1 worked example: at about 36% utilization the median TTFT is just the prefill, yet the P99
    # is several seconds (9 s in the worked example's sample): long outputs block the queue.
    rate = min(RATES, key=lambda r: abs(run("fcfs", r).utilization - 0.36))
    row = report(run("fcfs", rate))
    assert row["ttft_p50_s"] < 0.05
    assert row["ttft_p99_s"] > 3.0


def test_batch1_queueing_is_a_hockey_stick():
    p50 = [report(run("fcfs", r))["ttft_p50_s"] for r in RATES]
    assert all(a <= b for a, b in zip(p50, p50[1:]))
    assert p50[RATES.index(0.6)] > 10 * p50[RATES.index(0.3)]  # the curve bends up near saturation


def test_batch1_goodput_rises_then_collapses():
    # the CS349D lecture 1 worked example: goodput first rises a little, then falls fast to ~0; at saturation the
    # GPU is 100% busy and almost no request is "good".
    good = [report(run("fcfs", r))["goodput_req_s"] for r in RATES]
    peak = int(np.argmax(good))
    assert 0 < peak < RATES.index(0.6)
    assert good[RATES.index(0.6)] < 0.6 * good[peak]
    assert good[RATES.index(0.8)] < 0.1 * good[peak] and good[-1] < 0.1 * good[peak]


@pytest.mark.slow  # a whole measurement (make quick leaves it out)
def test_static_batching_raises_throughput_not_goodput():
    # the CS349D lecture 1 worked example policy 2: overloaded, static batches of 8 / 32 / 128 give several times the
    # batch-1 throughput (3 / 6 / 9 x in the worked example's sample) while seats are mostly wasted ...
    base = report(run("fcfs", 2.0))["throughput_tok_s"]
    tput = {b: report(run("static", 16.0, b))["throughput_tok_s"] for b in (8, 32, 128)}
    assert 2 * base < tput[8] < tput[32] < tput[128]
    waste = {b: run("static", 16.0, b).seat_waste for b in (8, 32, 128)}
    assert 0.6 < waste[8] < waste[32] < waste[128] < 0.9  # "60%-80%": the longer batch waits longer
    # ... at 1 request/s the median TTFT already exceeds 1.5 s and only about 30% meet the SLO ...
    at1 = report(run("static", 1.0, 32))
    assert at1["ttft_p50_s"] > 1.5 and 0.25 < at1["slo_attainment"] < 0.45
    # ... and the best goodput is only about twice batch-1's (0.34 vs 0.16 in the worked example), a far
    # smaller gain than the throughput's.
    best = lambda policy: max(report(run(policy, r))["goodput_req_s"] for r in RATES)
    gain = best("static") / best("fcfs")
    assert 1.3 < gain < 3.0
    assert gain < 0.5 * tput[32] / base


def test_exercise4_a_looser_slo_favours_static_batching():
    # CS349D lecture 1, exercise 4(b), DistServe's goodput (highest rate with >= 90% attainment): with TTFT <= 1 s
    # both policies sustain only about 0.1 requests/s; with TTFT <= 5 s static B = 32 sustains about
    # 3x batch-1 (0.8 vs 0.25 in the worked example).
    def sustained(policy, slo):
        return metrics.max_rate_meeting_slo(RATES, [metrics.slo_attainment(run(policy, r).timelines, slo)
                                                    for r in RATES])

    strict, loose = CHAT_SLO, SLO(ttft_s=5.0, tpot_s=0.05)
    assert sustained("fcfs", strict) <= 0.15 and sustained("static", strict) <= 0.15
    assert sustained("static", loose) >= 2.5 * sustained("fcfs", loose)


def test_exercise5_stopping_the_padding_is_not_enough():
    # CS349D lecture 1, exercise 5, overloaded (16 requests/s): computing only unfinished requests raises the
    # throughput (+21% at B = 32, +67% at B = 128 in the worked example), more for the bigger batch, yet goodput
    # stays near zero: the cost of wasted seats is that they cannot go to waiting requests.
    gain = {b: report(run("static", 16.0, b, pad=False))["throughput_tok_s"]
            / report(run("static", 16.0, b))["throughput_tok_s"] for b in (32, 128)}
    assert 1.1 < gain[32] < gain[128]
    assert report(run("static", 16.0, 128, pad=False))["goodput_req_s"] < 0.2


def test_a_cost_model_built_from_three_functions_prices_the_same_timeline():
    """Lab 03's plug: forward_flops, forward_bytes and step_time make a cost model the simulator runs on."""
    from miniengine.cost import roofline

    cfg, gpu = llama3_8b(), GPUS["H100"]
    plug = sim.CostModelFromFunctions(
        cfg, gpu,
        lambda c, n, ctx: roofline.forward_cost(c, n, ctx).flops,
        lambda c, n, ctx: roofline.forward_cost(c, n, ctx).bytes,
        lambda f, b, g: max(f / (0.7 * g.peak_flops), b / (0.8 * g.bandwidth)) + 5e-4)
    a = sim.simulate(sim.chat_workload(40, 2.0, seed=1), FCFSPolicy(), plug, max_num_seqs=8)
    b = sim.simulate(sim.chat_workload(40, 2.0, seed=1), FCFSPolicy(), H100_8B, max_num_seqs=8)
    for x, y in zip(a.timelines, b.timelines):
        assert x.token_times == pytest.approx(y.token_times, rel=1e-9)


@functools.lru_cache(maxsize=None)
def five_seeds():
    from miniengine.course.commands.simulate import compare_policies  # the `simulate` command's comparison

    return compare_policies(H100_8B, rate=1.0, seeds=range(5), n_requests=300, slo=CHAT_SLO)


def test_continuous_batching_beats_static_batching_in_goodput_over_five_seeds():
    """At the worked example's load (1 request/s), on every seed, not just on average."""
    r = five_seeds()
    static, continuous = r["static B=32"], r["continuous (256 seats)"]
    assert (continuous["goodput_req_s"] > 1.5 * static["goodput_req_s"]).all()
    assert continuous["slo_attainment"].mean() > 0.9 > 0.6 > static["slo_attainment"].mean()


def test_static_batching_shows_head_of_line_blocking_in_p99_ttft():
    r = five_seeds()
    static, continuous = r["static B=32"], r["continuous (256 seats)"]
    assert (static["ttft_p99_s"] > 20 * continuous["ttft_p99_s"]).all()  # seconds against tens of milliseconds
    assert (static["tpot_p50_s"] < 1.1 * continuous["tpot_p50_s"]).all()  # once running, a token costs the same


def test_simulate_prints_every_metric_for_every_policy(capsys):
    from miniengine.__main__ import main
    assert main(["simulate", "--seeds", "2", "--requests", "40"]) == 0
    out = capsys.readouterr().out
    for name in ("batch-1 FCFS", "static B=32", "continuous (256 seats)", "goodput_req_s", "itl_p99 (ms)", "ttft_p90 (ms)"):
        assert name in out


def test_a_policy_that_changes_a_sequence_is_refused_by_name():
    """A policy chooses; marking a prompt cached would make its prefill free on any clock (a steered measurement)."""
    from miniengine.engine.policy import ContinuousBatching

    class FreePrefill(ContinuousBatching):
        def admit(self, waiting, running, budget):
            for s in waiting:
                s.num_cached_tokens = s.num_tokens - 1
            return super().admit(waiting, running, budget)

    with pytest.raises(RuntimeError, match=r"FreePrefill.admit changed sequence \d+ \(num_cached_tokens 0 -> \d+"):
        sim.simulate(sim.chat_workload(4, 1.0), FreePrefill(), H100_8B)
