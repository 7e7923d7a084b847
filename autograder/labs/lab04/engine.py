"""Lab 04, Tasks 3, 4 and 6: your ContinuousBatching on the real engine (golden tokens, the scheduler's invariants),
on the simulator (the serving report), and inside LLM.

Reloaded by ``autograder.labs.lab04`` (see that module); the test cells call these through ``lab04``.
"""
from __future__ import annotations

import json

import numpy as np

import autograder.notebook_checks as checks
from autograder.labs.lab04.common import ANSWER_KEY, own_policy
from autograder.labs.shared import difference
from miniengine import LLM, EngineConfig, SamplingParams
from miniengine.engine import LLMEngine, TraceRequest, replay
from miniengine.timeline import VirtualClock


class Invariants:
    """Watches an engine's scheduler and checks its invariants after every step."""

    def __init__(self, engine, label):
        self.engine, self.sched, self.label = engine, engine.scheduler, label
        self.added, self.finished, self.steps = [], set(), 0
        add, schedule, postprocess = engine.add_request, self.sched.schedule, self.sched.postprocess

        def add_request(*a, **k):
            seq = add(*a, **k)
            self.added.append(seq)
            return seq

        def checked_schedule(now=0.0):
            self.head = [s.seq_id for s in self.sched.waiting]
            return schedule(now)

        def checked_postprocess(batch, tokens):
            done = postprocess(batch, tokens)
            self.check(batch, done)
            return done

        engine.add_request = add_request
        self.sched.schedule, self.sched.postprocess = checked_schedule, checked_postprocess

    def check(self, batch, done):
        s, c, where = self.sched, self.engine.config, f"{self.label}, step {self.steps}"
        self.steps += 1
        live = [q.seq_id for q in s.waiting] + [q.seq_id for q in s.running]
        assert len(live) == len(set(live)), f"{where}: a request is queued twice"
        self.finished |= {q.seq_id for q in done}
        assert not self.finished & set(live), f"{where}: a finished request is still queued"
        assert set(live) | self.finished == {q.seq_id for q in self.added}, f"{where}: a request was lost"
        assert len(batch.seqs) <= c.max_num_seqs, (
            f"{where}: {len(batch.seqs)} sequences ran, max_num_seqs={c.max_num_seqs}")
        assert batch.num_tokens <= c.max_num_batched_tokens, (
            f"{where}: the step fed {batch.num_tokens} tokens, max_num_batched_tokens={c.max_num_batched_tokens}")
        prefilled = [q.seq_id for q in batch.seqs if len(q.output_token_ids) == 1]
        assert prefilled == self.head[:len(prefilled)], (
            f"{where}: a later request was admitted before an earlier one (queue {self.head}, admitted {prefilled}): "
            f"admission must be first-come first-served")
        reserved = sum(q.max_len for q in s.running)
        assert self.engine.kv.arena.slots_reserved == reserved, (
            f"{where}: KV reservations do not match the running requests")


def watched_replay(trace, policy, label, **budgets):
    """Replay a trace on the real engine with a virtual clock, its invariants checked after every step."""
    clock = VirtualClock()
    # Milestone 4's memory model: each request reserves prompt + max_tokens up front (the invariant below)
    engine = LLMEngine(EngineConfig(scheduling_policy=policy, kv_layout="contiguous", **budgets), clock=clock,
                       sleep=clock.sleep)
    inv = Invariants(engine, label)
    return inv, replay(engine, trace)


def served(inv, label):
    starved = [q.request_id for q in inv.added if q.seq_id not in inv.finished]
    assert not starved, f"{label}: requests {starved} were never served"


def serve(trace, cases, policy, label, **budgets):
    """The replay's tokens must be every request's golden ones (visible cases); each request's tokens, and that the
    invariants held at every step, are observed for the grader."""
    inv, results = watched_replay(trace, policy, label, **budgets)
    runs = {}
    for r in results:
        case = cases[r.request.request_id]
        want = case["token_ids"][: r.request.params.max_tokens]
        got = checks.as_tokens(r.seq.output_token_ids, f"{label}, {case['name']}: output_token_ids")
        assert got == want, (f"{label}, {case['name']}: the tokens differ from the golden ones (got {got[:8]}..., "
                             f"expected {want[:8]}...); a policy only decides who runs when, never which tokens")
        runs[case["name"]] = got
    served(inv, label)
    # Every request of the trace, in the trace's order (a request never served would be reported as None).
    for t in trace:
        case = cases[t.request_id]
        checks.observe(f"{label}, {case['name']}: tokens", runs.get(case["name"]),
                       expect=case["token_ids"][: t.params.max_tokens])
    checks.observe(f"{label}: the scheduler's invariants held after every step", True, expect=True)
    return inv


def serve_for_report(trace, cases, policy, label, **budgets):
    """The replay's tokens by case name, every case served (hidden cases: the grader compares them)."""
    inv, results = watched_replay(trace, policy, label, **budgets)
    runs = {}
    for r in results:
        case = cases[r.request.request_id]
        runs[case["name"]] = checks.as_tokens(r.seq.output_token_ids, f"{label}, {case['name']}: output_token_ids")
    served(inv, label)
    missing = [c["name"] for c in cases if c["name"] not in runs]
    assert not missing, f"{label}: no result for {', '.join(missing)}"
    checks.observe(f"{label}: the scheduler's invariants held after every step", True, expect=True)
    return inv, runs


def poisson_trace(cases, rate, seed):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, len(cases)))
    order = rng.permutation(len(cases))
    return [TraceRequest(float(a), cases[i]["prompt_token_ids"], SamplingParams(**cases[i]["params"]),
                         request_id=int(i)) for a, i in zip(arrivals, order)]


def burst_trace(cases, max_tokens=None):
    """Longest prompts first, all at once, then the short ones: a queue where short requests could jump ahead."""
    order = sorted(range(len(cases)), key=lambda i: -len(cases[i]["prompt_token_ids"]))
    params = [cases[i]["params"] if max_tokens is None else {**cases[i]["params"], "max_tokens": max_tokens}
              for i in range(len(cases))]
    return [TraceRequest(1e-4 * k, cases[i]["prompt_token_ids"], SamplingParams(**params[i]), request_id=i)
            for k, i in enumerate(order)]


def check_replay(ContinuousBatching, ns, golden_path, seed, rate, n_burst, budgets, burst_budgets, label):
    """Two golden cases of each kind as a seeded Poisson trace, then the first n_burst as a burst of long prompts
    first (max_tokens=6), each under its budgets: golden tokens, invariants, nobody starved. ns: the notebook's
    globals, where the course's fits is lent. Returns (requests in the trace, steps)."""
    own_policy(ContinuousBatching, "ContinuousBatching")
    with open(golden_path) as f:
        golden = json.load(f)
    first = checks.one_case_per_kind(golden["cases"])
    cases = first + checks.one_case_per_kind([c for c in golden["cases"] if c not in first])  # two of each kind
    burst = golden["cases"][:n_burst]
    with checks.course_parts_under(ns, "fits"), \
            checks.reference_forbidden("ContinuousBatching on the engine", forbidden=ANSWER_KEY):
        inv = serve(poisson_trace(cases, rate, seed), cases, ContinuousBatching(), f"{label}Poisson trace", **budgets)
        serve(burst_trace(burst, max_tokens=6), burst, ContinuousBatching(), f"{label}burst of long prompts first",
              **burst_budgets)
    return len(cases), inv.steps


def report_replay(ContinuousBatching, ns, report, seed, rate, budgets, burst_budgets, label):
    """Two requests of each kind, as a Poisson trace and then as a burst of long prompts first, under the invariants.

    Both runs must give every request the same tokens; the burst's go to the grader, which compares them with the
    reference's.
    """
    own_policy(ContinuousBatching, "ContinuousBatching")
    cases = report.cases()  # two of each kind
    with checks.course_parts_under(ns, "fits"), \
            checks.reference_forbidden("ContinuousBatching on the engine", forbidden=ANSWER_KEY):
        inv, poisson = serve_for_report(poisson_trace(cases, rate, seed), cases, ContinuousBatching(),
                                        f"{label}Poisson trace", **budgets)
        _, burst = serve_for_report(burst_trace(cases), cases, ContinuousBatching(),
                                    f"{label}burst of long prompts first", **burst_budgets)
    for name, a in poisson.items():
        b = burst[name]
        t = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert a == b, (f"{label}{name}: the Poisson trace and the burst gave different tokens from step {t} on "
                        f"({len(a)} and {len(b)} tokens); a policy only decides who runs when, never which tokens")
        checks.observe(f"{label}Poisson trace, {name}: tokens", a)  # the sheet's: the reference's, as the burst's
    for case in cases:
        report.add("golden", case, "token_ids", burst[case["name"]])
    return len(cases), inv.steps


def check_sim(ContinuousBatching, ns, runs):
    """runs: (what, workload (n, rate, seed), paper GPU, seats, tokens per step[, the expected serving figures]); a
    hidden run has no figures: they stay with the grader.

    The simulator drives the engine's scheduler with your policy on a paper GPU (Llama-3-8B); the run must be the
    course's, to 1e-6, on each figure of SIM_KEYS. ns: the notebook's globals, where the course's fits is lent.
    """
    from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
    from miniengine.serving import metrics, simulator as sim

    own_policy(ContinuousBatching, "ContinuousBatching")
    with checks.course_parts_under(ns, "fits"), \
            checks.reference_forbidden("ContinuousBatching on the simulator", forbidden=ANSWER_KEY):
        for label, work, gpu, seats, tokens, *want in runs:
            run = sim.simulate(sim.chat_workload(*work), ContinuousBatching(), CostModel(llama3_8b(), GPUS[gpu]),
                               max_num_seqs=seats, max_num_batched_tokens=tokens)
            s = metrics.summarize(run.timelines)
            for key in SIM_KEYS:
                value = float(s[key])
                if not want:  # hidden: the course's figures stay with the grader, which compares them to 1e-6
                    checks.observe(f"{label}: {key}", value, rel=1e-6)
                    continue
                expected = want[0][key]
                checks.observe(f"{label}: {key}", value, expect=expected, rel=1e-6)
                assert abs(value - expected) <= 1e-6 * abs(expected), (
                    f"{label}: {key} = {value:.6g}, expected {expected:.6g}. The same requests, the same cost model: "
                    f"only which request joins which step can differ. Check the order, the budgets, and that nobody "
                    f"overtakes")


# The serving report's figures that the simulator tests compare (each to 1e-6 relative).
SIM_KEYS = ("goodput_req_s", "slo_attainment", "throughput_tok_s", "ttft_p99_s", "tpot_p50_s")


def generate(ContinuousBatching, cases, **budgets):
    """LLM with your ContinuousBatching serves every case; prefills join while others decode."""
    llm = LLM(scheduling_policy=ContinuousBatching(), **budgets)
    return llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])


def check_engine(ContinuousBatching, golden_path, label, **budgets):
    """Every golden case, token for token, with your fits inside your policy. Returns the number of cases."""
    own_policy(ContinuousBatching, "ContinuousBatching")
    with checks.reference_forbidden("your engine's scheduling policy", forbidden=ANSWER_KEY):
        with open(golden_path) as f:
            cases = json.load(f)["cases"]
        tok_ = checks.load_tokenizer()
        for case, out in zip(cases, generate(ContinuousBatching, cases, **budgets)):
            got, want = checks.as_tokens(out.token_ids, f"{label}{case['name']}: token_ids"), case["token_ids"]
            checks.observe(f"{label}{case['name']}: tokens", got, expect=want)
            assert got == want, f"your engine, {label}{case['name']} ({case['params']}): {difference(tok_, got, want)}"
    return len(cases)


def report_engine(ContinuousBatching, report, label, **budgets):
    """The report's cases through LLM with your policy; their tokens go to the grader."""
    own_policy(ContinuousBatching, "ContinuousBatching")
    with checks.reference_forbidden("your engine's scheduling policy", forbidden=ANSWER_KEY):
        cases = report.cases()
        outs = generate(ContinuousBatching, cases, **budgets)
        assert len(outs) == len(cases), f"your engine returned {len(outs)} outputs for {len(cases)} requests"
        for case, out in zip(cases, outs):
            got = checks.as_tokens(out.token_ids, f"{label}{case['name']}: token_ids")
            report.add("golden", case, "token_ids", got)
