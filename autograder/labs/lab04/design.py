"""Lab 04's design part, an SLO-aware scheduling policy, and the graded numbers. Reloaded by ``autograder.labs.lab04``.

Your ``SLOAwarePolicy`` goes where ``ContinuousBatching`` goes (the policy plug point: ``admit(waiting, running,
budget)``). The harness builds each trace itself (seeded chat requests, each carrying a noisy predicted output length),
runs the course's simulator with your policy on the course's clock (Llama-3-8B on a paper H100, 128 seats, 8,192
tokens per step), and computes goodput from the requests' timelines (requests per second that met TTFT <= 1 s and
TPOT <= 50 ms). Your policy never reports a number: it only answers admit. So:

  * goodput ratio: your goodput over FCFS continuous batching's on the same trace (FCFS's figures were computed once
    by the course's ContinuousBatching and are pasted below; tests/autograder/test_lab04_design.py recomputes them),
    averaged over the traces;
  * bounded waiting: once a request has waited MAX_WAIT_S, no request that arrived after it may start before it
    (starvation by design fails, however good the goodput);
  * every request served: a policy that never admits some request leaves the simulator idle with work left, and
    fails.
"""
from __future__ import annotations

import json

import numpy as np

import autograder.notebook_checks as checks
from autograder.labs.lab04.common import own_policy
from autograder.labs.lab04.engine import generate
from autograder.labs.shared import difference
from autograder.notebook_checks.ledger import credit
from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
from miniengine.serving import metrics, simulator as sim

SEATS, TOKENS_PER_STEP, MAX_PROMPT = 128, 8192, 4096  # the server: seats, step token budget, longest prompt accepted
N_REQUESTS, SIGMA = 400, 0.5  # requests per trace; the length predictor's noise (log-normal, see with_predictions)
MAX_WAIT_S = 5.0  # bounded waiting: past this, nobody younger may start first
# Thresholds, set from the honest policies measured in autograder/qa/design/lab04.py (visible and hidden traces).
MIN_RATIO = 1.15  # goodput over FCFS's on the same trace, averaged over the traces
FCFS_RATIO = 1.0  # the baseline: FCFS continuous batching itself
# FCFS continuous batching's goodput (requests/s) on each trace (rate, seed): the course's ContinuousBatching.
FCFS_GOODPUT = {(80.0, 0): 10.03396504, (80.0, 1): 11.40054164, (100.0, 0): 8.511271347, (100.0, 1): 8.90141638,
                (90.0, 5): 6.630394713, (90.0, 6): 10.4298809, (120.0, 7): 10.84975563, (120.0, 8): 4.769383212}


def trace(rate: float, seed: int, n: int = N_REQUESTS, sigma: float = SIGMA) -> list:
    """Seeded chat requests (prompts capped at MAX_PROMPT tokens, as a server's context limit would) with predictions."""
    requests = sim.chat_workload(n, rate, seed)
    for r in requests:
        r.prompt_len = min(r.prompt_len, MAX_PROMPT)
        r.timeline.prompt_tokens = r.prompt_len
    return sim.with_predictions(requests, sigma, seed)


def serve(policy, rate: float, seed: int):
    """One trace through the simulator with ``policy`` on the course's clock; the requests with their timelines."""
    requests = trace(rate, seed)
    sim.simulate(requests, policy, CostModel(llama3_8b(), GPUS["H100"]), max_num_seqs=SEATS,
                 max_num_batched_tokens=TOKENS_PER_STEP)
    return requests


def overtaken(requests) -> list[tuple[int, int, float]]:
    """(waiting request, younger request, how long the first had waited) wherever a request that had waited at least
    MAX_WAIT_S saw a younger one start before it."""
    arrival = np.array([r.arrival for r in requests])
    start = np.array([r.timeline.scheduled for r in requests])
    out = []
    for i in np.argsort(arrival):
        younger = (arrival > arrival[i]) & (start < start[i]) & (start - arrival[i] >= MAX_WAIT_S)
        if younger.any():
            j = int(np.flatnonzero(younger)[np.argmin(start[younger])])
            out.append((int(requests[i].id), int(requests[j].id), float(start[j] - arrival[i])))
    return out


def goodput_ratios(Policy, traces, label: str) -> list[float]:
    """Each trace served by a fresh ``Policy()``; its goodput over FCFS's, with the rules above enforced."""
    own_policy(Policy, "SLOAwarePolicy")
    ratios = []
    for rate, seed in traces:
        what = f"{label}trace ({rate:g} requests/s, seed {seed})"
        try:
            policy = Policy()
        except NotImplementedError:
            raise
        except Exception as e:
            raise AssertionError(f"{what}: SLOAwarePolicy() raised {type(e).__name__}: {e}") from e
        try:
            requests = serve(policy, rate, seed)
        except NotImplementedError:
            raise
        except RuntimeError as e:  # the scheduler's rules (budgets, duplicates) or a request never served
            raise AssertionError(f"{what}: {e}") from None
        late = overtaken(requests)
        checks.observe(f"{what}: nobody who waited {MAX_WAIT_S:g} s is overtaken", not late, expect=True)
        assert not late, (f"{what}: request {late[0][0]} had waited {late[0][2]:.2f} s when request {late[0][1]}, "
                          f"which arrived after it, started first ({len(late)} such requests): once a request has "
                          f"waited {MAX_WAIT_S:g} s, nobody younger may start before it (no starvation)")
        ratios.append(metrics.goodput([r.timeline for r in requests], metrics.SLO()) / FCFS_GOODPUT[(rate, seed)])
    return ratios


def check_policy(Policy, traces, label: str = "") -> float:
    """Your policy on the traces: the mean goodput ratio against the target, partial credit from FCFS's 1.0."""
    ratios = goodput_ratios(Policy, traces, label)
    mean = float(np.mean(ratios))
    checks.observe(f"{label}goodput over FCFS's, mean of {len(ratios)} traces", mean, at_least=MIN_RATIO,
                   baseline=FCFS_RATIO)
    print(f"{label}goodput over FCFS's on each trace: {', '.join(f'{r:.3f}' for r in ratios)}; mean {mean:.3f} "
          f"(target at least {MIN_RATIO}; FCFS {FCFS_RATIO:.1f}): "
          f"{credit(mean, at_least=MIN_RATIO, baseline=FCFS_RATIO):.0%} of this test's points")
    return mean


class NoPredictor:
    """Your policy on the real engine, which runs no length predictor: each waiting sequence's predicted_output_len
    is None there, as the task says, rather than missing."""

    def __init__(self, policy):
        self.policy, self.max_num_seqs = policy, getattr(policy, "max_num_seqs", None)

    def admit(self, waiting, running, budget):
        for seq in waiting:
            if not hasattr(seq, "predicted_output_len"):
                seq.predicted_output_len = None
        return self.policy.admit(waiting, running, budget)


def check_design_engine(Policy, golden_path, label: str = "", **budgets) -> int:
    """Your policy inside LLM on the real engine (no predictor there: predicted_output_len is None): every golden case,
    token for token. Returns the number of cases."""
    own_policy(Policy, "SLOAwarePolicy")
    with open(golden_path) as f:
        cases = json.load(f)["cases"]
    tok_ = checks.load_tokenizer()
    try:
        outs = generate(lambda: NoPredictor(Policy()), cases, **budgets)
    except NotImplementedError:
        raise
    except RuntimeError as e:  # the scheduler names the rule an answer broke
        raise AssertionError(f"{label}SLOAwarePolicy on the real engine: {e}") from None
    for case, out in zip(cases, outs):
        got, want = checks.as_tokens(out.token_ids, f"{label}{case['name']}: token_ids"), case["token_ids"]
        checks.observe(f"{label}SLOAwarePolicy, {case['name']}: tokens", got, expect=want)
        assert got == want, f"SLOAwarePolicy, {label}{case['name']} ({case['params']}): {difference(tok_, got, want)}"
    return len(cases)


# graded numbers: autograder/labs/shared.py (check_numbers, report_numbers), re-exported for the cells
from autograder.labs.shared import check_numbers, report_numbers  # noqa: E402, F401
