"""A discrete-event simulator that drives the engine's own scheduler on the paper GPU's clock.

Correctness comes from running the real (tiny) model; speed comes from this
simulator.  It never sleeps: the clock jumps from one event to the next (an
arrival, the end of a forward pass, a batching timeout), and each forward costs
what the cost model says it would cost on, say, an H100 running Llama-3-8B.
Minutes of traffic simulate in well under a second.

The simulator plays only the model's part.  The engine's ``Scheduler`` and the
same policy objects the real engine runs (``FCFS``, ``StaticBatching``, any
``admit(waiting, running, budget)`` policy) choose every step's batch; the
simulator prices that batch, and then "samples" a token for each sequence:
end-of-text when the request has reached its output length, another token
otherwise.  The scheduler therefore learns that a request is done only at the
step it ends, exactly as in the real engine.  Only the simulator knows output
lengths in advance; a workload may carry a length predictor's noisy guess
(``with_predictions``), which a policy reads as ``seq.predicted_output_len``
(None without a predictor).

The pieces:
- ``chat_workload`` (:mod:`miniengine.serving.workloads`, importable from here too): requests with
  Poisson arrivals and long-tailed (lognormal) prompt and output lengths, seeded.
- ``simulate``: runs the event loop and fills each request's ``RequestTimeline``.
- ``sweep``: the same workload at many arrival rates, for the hockey-stick plots.
The policy comparison over seeds behind ``python -m miniengine simulate`` is course tooling
(:mod:`miniengine.course.commands.simulate`).

A cost model is any object with ``forward(new_tokens, context).step_time_s``
(one ragged forward: sequence i feeds new_tokens[i] tokens on top of context[i]
cached ones); ``decode_run_times(contexts, steps)`` is optional and only makes
long stretches of unchanged decode batches faster to price.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence as Seq

import numpy as np

from miniengine import plugs
from miniengine.engine.policy import ContinuousBatching, FCFSPolicy, StaticBatching
from miniengine.engine.scheduler import ScheduledBatch, Scheduler
from miniengine.engine.sequence import Sequence
from miniengine.plugs.conformance import check
from miniengine.sampling import SamplingParams
from miniengine.serving.metrics import SLO, RequestTimeline, duration, summarize
from miniengine.serving.workloads import SimRequest, chat_workload, lognormal_lengths, with_predictions

__all__ = [
    # this module: the simulated model, the event loop and the rate sweep
    "EOS", "OTHER", "NO_LIMIT", "CostModelFromFunctions", "FCFS", "UnlimitedKV", "SimResult", "simulate", "sweep",
    # the workloads it serves (miniengine.serving.workloads)
    "SimRequest", "lognormal_lengths", "chat_workload", "with_predictions",
    # the engine's policies, which the simulator runs as they are (miniengine.engine.policy)
    "FCFSPolicy", "StaticBatching", "ContinuousBatching",
]

EOS, OTHER = 0, 1  # the simulated model's tokens: end-of-text, and anything else
NO_LIMIT = 1 << 40  # a real server caps max_tokens; the simulated requests stop by end-of-text alone


class CostModelFromFunctions:
    """The cost-model plug point built from Lab 03's three functions.

        forward_flops(config, new_tokens, context) -> FLOPs
        forward_bytes(config, new_tokens, context) -> bytes moved
        step_time(flops, bytes_moved, gpu) -> seconds

    The simulator only ever asks a cost model ``forward(new_tokens, context).step_time_s``.
    """

    def __init__(self, config, gpu, forward_flops, forward_bytes, step_time):
        self.config, self.gpu = config, gpu
        self.forward_flops, self.forward_bytes, self.step_time = forward_flops, forward_bytes, step_time

    def forward(self, new_tokens, context):
        flops = self.forward_flops(self.config, list(new_tokens), list(context))
        moved = self.forward_bytes(self.config, list(new_tokens), list(context))
        return _Priced(float(self.step_time(flops, moved, self.gpu)))


@dataclasses.dataclass
class _Priced:
    step_time_s: float


def FCFS() -> FCFSPolicy:
    """Batch size 1, first come first served: the baseline that leaves the GPU 99% idle."""
    return FCFSPolicy(max_num_seqs=1)


class UnlimitedKV:
    """The KV plug for the simulator: admission is limited by seats and tokens, not by KV memory."""

    def can_allocate(self, seq) -> bool:
        return True

    def allocate(self, seq) -> None:
        seq.kv = True

    def free(self, seq) -> None:
        seq.kv = None

    def backend(self, seqs, new_tokens):
        raise RuntimeError("the simulator prices steps with the cost model; it never runs attention")


# ---------------------------------------------------------------- the event loop


@dataclasses.dataclass
class SimResult:
    requests: list[SimRequest]
    busy_s: float  # time the GPU spent in forward passes
    decode_seat_steps: int  # seats x steps over all decode forwards
    wasted_seat_steps: int  # of those, seats held by requests that had already finished

    @property
    def timelines(self) -> list[RequestTimeline]:
        return [r.timeline for r in self.requests]

    @property
    def utilization(self) -> float:
        """Share of the run (first arrival to last finish) the GPU was busy."""
        return self.busy_s / duration(self.timelines)

    @property
    def seat_waste(self) -> float:
        """Share of decode seats occupied by requests that were already done (static batching's waste)."""
        return self.wasted_seat_steps / self.decode_seat_steps if self.decode_seat_steps else 0.0


class _Loop:
    """State of one simulation: the engine's scheduler, the clock, and the simulated model."""

    def __init__(self, requests, policy, model, max_num_seqs, max_num_batched_tokens, chunk_prefill=None, kv=None):
        self.pending = sorted(requests, key=lambda r: r.arrival)
        self.policy, self.model = policy, model
        self.scheduler = Scheduler(UnlimitedKV() if kv is None else kv, EOS, max_num_seqs, max_num_batched_tokens, policy, chunk_prefill)
        self.by_seq: dict[int, SimRequest] = {}
        self.next, self.now, self.busy, self.seats, self.wasted = 0, 0.0, 0.0, 0, 0

    def admit_arrivals(self) -> None:
        while self.next < len(self.pending) and self.pending[self.next].arrival <= self.now:
            r = self.pending[self.next]
            r.seq = Sequence([OTHER] * r.prompt_len, SamplingParams(max_tokens=NO_LIMIT), r.id, r.arrival)
            r.seq.predicted_output_len = r.predicted_len  # what a policy may read of the length: a guess, or None
            self.by_seq[r.seq.seq_id] = r
            self.scheduler.add(r.seq)
            self.next += 1

    def next_arrival(self) -> float:
        return self.pending[self.next].arrival if self.next < len(self.pending) else math.inf

    def step_times(self, batch: ScheduledBatch, padding, steps: int) -> np.ndarray:
        """What ``steps`` forwards of this batch (plus padded seats) cost; steps > 1 only for pure decode."""
        contexts = [s.num_cached_tokens for s in batch.seqs] + [self.by_seq[s.seq_id].cached for s in padding]
        if steps == 1:
            new = batch.num_new_tokens + [1] * len(padding)
            return np.array([self.model.forward(new, contexts).step_time_s])
        if hasattr(self.model, "decode_run_times"):
            return np.asarray(self.model.decode_run_times(contexts, steps))
        return np.array([self.model.forward([1] * len(contexts), [c + j for c in contexts]).step_time_s
                         for j in range(steps)])

    def run(self, batch: ScheduledBatch, steady: bool) -> None:
        """Price the batch, then feed the scheduler one simulated token per sequence per step.

        In a steady stretch (the same decode batch as the step before, nothing admitted), nothing can
        change the batch until a request finishes or a new one arrives, so that many steps are priced
        in one call and the scheduler's schedule() is skipped for them; postprocess() still runs per step.
        """
        padding = getattr(self.policy, "padding", lambda: [])()
        decode_only = all(n == 1 for n in batch.num_new_tokens)
        reqs = [self.by_seq[s.seq_id] for s in batch.seqs]
        steps = min(r.output_len - r.generated for r in reqs) if steady else 1
        ends = self.now + np.cumsum(self.step_times(batch, padding, steps))
        cut = int(np.searchsorted(ends, self.next_arrival()))  # the step during which the next arrival comes
        ends = ends[: min(steps, cut + 1)]
        chunked = [batch.partial(i) for i in range(len(reqs))]  # a chunk of a prefill: no token this step
        for end in ends.tolist():
            tokens = [EOS if r.generated + 1 == r.output_len else OTHER for r, c in zip(reqs, chunked) if not c]
            self.scheduler.postprocess(batch, tokens)
            batch = ScheduledBatch(batch.seqs, [1] * len(batch.seqs))  # after its first step, every seq decodes
            for r, c in zip(reqs, chunked):
                if r.timeline.scheduled is None:
                    r.timeline.scheduled = self.now
                r.cached = r.seq.num_cached_tokens
                if not c:
                    r.timeline.record_token(end)
            for s in padding:
                self.by_seq[s.seq_id].cached += 1
        if decode_only:
            self.seats += (len(reqs) + len(padding)) * len(ends)
            self.wasted += len(padding) * len(ends)
        self.busy += float(ends[-1]) - self.now
        self.now = float(ends[-1])


def simulate(requests: Seq[SimRequest], policy, model, max_num_seqs: int = 256,
             max_num_batched_tokens: int = NO_LIMIT, chunk_prefill=None, kv=None) -> SimResult:
    """Serves ``requests`` (fresh ones: their state is filled in) with the engine's scheduler running
    ``policy``, on ``model``'s clock.  ``max_num_seqs`` caps the batch unless the policy brings its own;
    ``chunk_prefill`` is the scheduler's chunking rule (None: every prompt in one step); ``kv`` replaces
    ``UnlimitedKV`` (serving/routing.py's gives prefix-cache hits: ``allocate`` sets ``seq.num_cached_tokens``)."""
    loop = _Loop(requests, policy, model, max_num_seqs, max_num_batched_tokens, chunk_prefill, kv)  # checks the policy
    check("model", model, plugs.ForwardCostModel)  # the clock is a plug point (Lab 03): say what it lacks
    previous = None
    while True:
        loop.admit_arrivals()
        batch = loop.scheduler.schedule(loop.now)
        if batch.seqs:
            ids = [s.seq_id for s in batch.seqs]
            steady = previous == ids and all(n == 1 for n in batch.num_new_tokens)
            previous = ids
            loop.run(batch, steady)
            continue
        previous = None
        wake = getattr(policy, "wake_time", lambda waiting: None)(tuple(loop.scheduler.waiting))
        wake = math.inf if wake is None else wake
        if wake <= loop.now:
            raise RuntimeError(f"the policy asked to be woken at {wake}, which is not after now={loop.now}")
        loop.now = min(wake, loop.next_arrival())
        if loop.now == math.inf:
            break
    stuck = [r.id for r in loop.pending if not r.done]
    if stuck:
        raise RuntimeError(f"the policy went idle with unfinished requests {stuck[:5]}")
    return SimResult(loop.pending, loop.busy, loop.seats, loop.wasted)


def sweep(rates: Seq[float], make_policy: Callable[[], object], model, *,
          n_requests: int = 300, seed: int = 0, slo: SLO = SLO(), **workload) -> list[dict]:
    """One row of metrics per arrival rate: throughput, goodput, SLO attainment, TTFT/TPOT/E2E percentiles,
    utilisation and seat waste.  The same seeded requests are replayed at every rate."""
    rows = []
    for rate in rates:
        result = simulate(chat_workload(n_requests, rate, seed, **workload), make_policy(), model)
        rows.append({"rate": rate, **summarize(result.timelines, slo),
                     "utilization": result.utilization, "seat_waste": result.seat_waste})
    return rows

