"""Workloads and a discrete-event simulator of a serving engine on the paper GPU's clock.

Correctness comes from running the real (tiny) model; speed comes from this
simulator.  It never sleeps: the clock jumps from one event to the next (an
arrival, the end of a forward pass, a batching timeout), and each forward costs
what ``roofline.CostModel`` says it would cost on, say, an H100 running
Llama-3-8B.  Minutes of traffic simulate in well under a second.

The pieces:
- ``chat_workload``: requests with Poisson arrivals and long-tailed (lognormal)
  prompt and output lengths, seeded.
- ``Scheduler``: the policy.  Each time the GPU is free it is asked for a ``Plan``
  (which sequences the next forward passes feed, and how many tokens each), or
  for a time to be woken at, or for nothing.  ``FCFS`` serves one request at a
  time; ``StaticBatching`` gathers a batch and runs it until its longest request
  finishes.  Continuous batching is one more ``Scheduler`` that re-plans every
  step; the simulator needs no change for it.
- ``simulate``: runs the event loop and fills each request's ``RequestTimeline``.
- ``sweep``: the same workload at many arrival rates, for the hockey-stick plots.
"""
from __future__ import annotations

import abc
import collections
import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from .metrics import SLO, RequestTimeline, duration, summarize
from .roofline import CostModel

# ---------------------------------------------------------------- workload


@dataclasses.dataclass
class SimRequest:
    """A request and its progress: how many of its tokens are in the KV cache, and its timeline."""

    id: int
    arrival: float
    prompt_len: int
    output_len: int
    cached: int = 0  # tokens whose K/V are in the cache
    timeline: RequestTimeline = None

    def __post_init__(self):
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(f"prompt_len and output_len must be >= 1, got {self.prompt_len} and {self.output_len}")
        if self.timeline is None:
            self.timeline = RequestTimeline(self.arrival, self.prompt_len, request_id=self.id)

    @property
    def generated(self) -> int:
        return self.timeline.output_tokens

    @property
    def remaining(self) -> int:
        return self.output_len - self.generated

    @property
    def done(self) -> bool:
        return self.remaining == 0


def lognormal_lengths(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    """Integer lengths >= 1 whose distribution has the given *mean* (not median).

    A lognormal's mean is exp(mu + sigma^2 / 2), so mu = ln(mean) - sigma^2 / 2; the
    median, exp(mu), sits well below the mean, which is what makes the tail long.
    """
    mu = math.log(mean) - sigma**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, n))).astype(int)


def chat_workload(n: int, rate: float, seed: int = 0, prompt_mean: float = 512, output_mean: float = 256,
                  sigma: float = 1.0) -> list[SimRequest]:
    """``n`` chat-like requests arriving as a Poisson process of ``rate`` requests/s.

    Lengths follow the seed's chat workload: lognormal with means 512 (prompt) and
    256 (output).  sigma = 1 gives median outputs of about 155 tokens and a P99 near
    1,600: a few requests generate more than a thousand tokens and hold a batch-1
    GPU for ten seconds or more, the head-of-line blocking the lecture is about.

    The lengths and the *shape* of the arrival gaps depend only on ``seed``; ``rate``
    only rescales the gaps.  A sweep over rates therefore replays the same requests
    faster or slower (common random numbers), and its curves come out smooth.
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1 requests, got {n!r}")
    rng = np.random.default_rng(seed)
    prompts = lognormal_lengths(rng, prompt_mean, sigma, n)
    outputs = lognormal_lengths(rng, output_mean, sigma, n)
    arrivals = np.cumsum(rng.standard_exponential(n)) / rate
    return [SimRequest(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


# ---------------------------------------------------------------- the policy seam


@dataclasses.dataclass
class Work:
    """One sequence's part in a forward: ``new_tokens`` fed on top of its cached ones."""

    request: SimRequest
    new_tokens: int  # its prompt (prefill) or 1 (decode)
    emits: bool = True  # False: a finished request still holding its seat, computed but discarded


@dataclasses.dataclass
class Plan:
    """What the GPU runs next: ``steps`` consecutive forwards over the same sequences.

    ``steps > 1`` is a shortcut for a stretch of pure decode in which the batch does not
    change (every item feeds 1 token per step); the simulator prices it in one call.
    """

    work: list[Work]
    steps: int = 1


class Scheduler(abc.ABC):
    """Chooses each forward's batch.  The simulator owns the clock and the model; the scheduler owns the queue.

    ``plan(now)`` returns a ``Plan`` to run now, or a time at which to be asked again
    (for example a batching timeout), or ``None`` to wait for the next arrival.
    Request state (``cached``, ``generated``, ``done``) is updated by whoever runs the
    plan, so the same scheduler can drive the simulator or a real engine: it reads only
    ``arrival``, ``prompt_len``, ``cached``, ``remaining`` and ``done`` of a request.
    """

    def __init__(self):
        self.waiting: collections.deque[SimRequest] = collections.deque()

    def add(self, request: SimRequest, now: float) -> None:
        self.waiting.append(request)

    @abc.abstractmethod
    def plan(self, now: float) -> Plan | float | None: ...


def _prefill(batch: Sequence[SimRequest]) -> Plan:
    return Plan([Work(r, r.prompt_len) for r in batch])


class FCFS(Scheduler):
    """Batch size 1, first come first served: the baseline that leaves the GPU 99% idle."""

    def __init__(self):
        super().__init__()
        self.running: SimRequest | None = None

    def plan(self, now):
        if self.running is not None and self.running.done:
            self.running = None
        if self.running is None:
            if not self.waiting:
                return None
            self.running = self.waiting.popleft()
            return _prefill([self.running])
        # Nothing can change the plan until this request ends: price all its decode steps at once.
        return Plan([Work(self.running, 1)], steps=self.running.remaining)


class StaticBatching(Scheduler):
    """Request-level batching: gather ``batch_size`` requests (or wait ``timeout_s`` past the oldest's
    arrival), prefill them together, decode until the longest is done, then take the next batch.

    With ``pad_finished`` (the default, like FasterTransformer-era engines) finished requests keep
    their seats and are computed along with the others until the batch ends; without it they stop
    being computed, but their seats still cannot go to a waiting request.
    """

    def __init__(self, batch_size: int, timeout_s: float = 0.2, pad_finished: bool = True):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        self.batch_size, self.timeout_s, self.pad_finished = batch_size, timeout_s, pad_finished
        self.batch: list[SimRequest] = []

    def plan(self, now):
        if all(r.done for r in self.batch):
            self.batch = []
            if not self.waiting:
                return None
            deadline = self.waiting[0].arrival + self.timeout_s
            if len(self.waiting) < self.batch_size and now < deadline:
                return deadline
            self.batch = [self.waiting.popleft() for _ in range(min(self.batch_size, len(self.waiting)))]
            return _prefill(self.batch)
        live = [r for r in self.batch if not r.done]
        seats = self.batch if self.pad_finished else live
        # Re-plan when the next request finishes: its seat stops emitting (or stops being computed).
        return Plan([Work(r, 1, emits=not r.done) for r in seats], steps=min(r.remaining for r in live))


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


def _run(plan: Plan, now: float, model: CostModel) -> np.ndarray:
    """Prices a plan, advances the requests in it, and returns the end time of each of its forwards."""
    reqs = [w.request for w in plan.work]
    if plan.steps == 1:
        times = np.array([model.forward([w.new_tokens for w in plan.work], [r.cached for r in reqs]).step_time_s])
    else:
        if any(w.new_tokens != 1 for w in plan.work):
            raise ValueError("a multi-step plan must be pure decode (new_tokens == 1 for every item)")
        times = model.decode_run_times([r.cached for r in reqs], plan.steps)
    ends = now + np.cumsum(times)
    for w in plan.work:
        r = w.request
        if r.timeline.scheduled is None:
            r.timeline.scheduled = now
        r.cached += w.new_tokens + plan.steps - 1
        if w.emits:
            r.timeline.token_times.extend(ends.tolist())
            if r.generated > r.output_len:
                raise RuntimeError(f"scheduler overran request {r.id}: {r.generated} > {r.output_len} tokens")
    return ends


def simulate(requests: Sequence[SimRequest], scheduler: Scheduler, model: CostModel) -> SimResult:
    """Serves ``requests`` (fresh ones: their state is filled in) with ``scheduler`` on ``model``'s clock."""
    pending = sorted(requests, key=lambda r: r.arrival)
    i, now, busy, seats, wasted = 0, 0.0, 0.0, 0, 0
    while True:
        while i < len(pending) and pending[i].arrival <= now:
            scheduler.add(pending[i], now)
            i += 1
        decision = scheduler.plan(now)
        if isinstance(decision, Plan):
            ends = _run(decision, now, model)
            busy += ends[-1] - now
            now = float(ends[-1])
            if all(w.new_tokens == 1 for w in decision.work):
                seats += len(decision.work) * decision.steps
                wasted += sum(not w.emits for w in decision.work) * decision.steps
            continue
        wake = math.inf if decision is None else decision
        if wake <= now:
            raise RuntimeError(f"scheduler asked to be woken at {wake}, which is not after now={now}")
        now = min(wake, pending[i].arrival if i < len(pending) else math.inf)
        if now == math.inf:
            break
    stuck = [r.id for r in pending if not r.done]
    if stuck:
        raise RuntimeError(f"scheduler went idle with unfinished requests {stuck[:5]}")
    return SimResult(pending, busy, seats, wasted)


def sweep(rates: Sequence[float], make_scheduler: Callable[[], Scheduler], model: CostModel, *,
          n_requests: int = 300, seed: int = 0, slo: SLO = SLO(), **workload) -> list[dict]:
    """One row of metrics per arrival rate: throughput, goodput, SLO attainment, TTFT/TPOT/E2E percentiles,
    utilisation and seat waste.  The same seeded requests are replayed at every rate."""
    rows = []
    for rate in rates:
        result = simulate(chat_workload(n_requests, rate, seed, **workload), make_scheduler(), model)
        rows.append({"rate": rate, **summarize(result.timelines, slo),
                     "utilization": result.utilization, "seat_waste": result.seat_waste})
    return rows
