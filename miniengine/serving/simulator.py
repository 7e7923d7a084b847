"""Workloads and a discrete-event simulator that drives the engine's own scheduler on the paper GPU's clock.

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
lengths in advance.

The pieces:
- ``chat_workload``: requests with Poisson arrivals and long-tailed (lognormal)
  prompt and output lengths, seeded.
- ``simulate``: runs the event loop and fills each request's ``RequestTimeline``.
- ``sweep``: the same workload at many arrival rates, for the hockey-stick plots.

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

from miniengine.engine.policy import ContinuousBatching, FCFSPolicy, StaticBatching
from miniengine.engine.scheduler import ScheduledBatch, Scheduler
from miniengine.engine.sequence import Sequence
from miniengine.serving.metrics import SLO, RequestTimeline, duration, summarize
from miniengine.sampling import SamplingParams

EOS, OTHER = 0, 1  # the simulated model's tokens: end-of-text, and anything else
NO_LIMIT = 1 << 40  # a real server caps max_tokens; the simulated requests stop by end-of-text alone


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
    seq: Sequence | None = None  # the engine's view of it: what the scheduler and policy see

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

    Lengths follow a typical chat workload: lognormal with means 512 (prompt) and
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

    def __init__(self, requests, policy, model, max_num_seqs, max_num_batched_tokens, chunk_prefill=None):
        self.pending = sorted(requests, key=lambda r: r.arrival)
        self.policy, self.model = policy, model
        self.scheduler = Scheduler(UnlimitedKV(), EOS, max_num_seqs, max_num_batched_tokens, policy, chunk_prefill)
        self.by_seq: dict[int, SimRequest] = {}
        self.next, self.now, self.busy, self.seats, self.wasted = 0, 0.0, 0.0, 0, 0

    def admit_arrivals(self) -> None:
        while self.next < len(self.pending) and self.pending[self.next].arrival <= self.now:
            r = self.pending[self.next]
            r.seq = Sequence([OTHER] * r.prompt_len, SamplingParams(max_tokens=NO_LIMIT), r.id, r.arrival)
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
             max_num_batched_tokens: int = NO_LIMIT, chunk_prefill=None) -> SimResult:
    """Serves ``requests`` (fresh ones: their state is filled in) with the engine's scheduler running
    ``policy``, on ``model``'s clock.  ``max_num_seqs`` caps the batch unless the policy brings its own;
    ``chunk_prefill`` is the scheduler's chunking rule (None: every prompt in one step)."""
    loop = _Loop(requests, policy, model, max_num_seqs, max_num_batched_tokens, chunk_prefill)
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


COMPARED = ("throughput_tok_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
            "itl_p50_s", "itl_p90_s", "itl_p99_s", "slo_attainment", "goodput_req_s")


def compare_policies(model, rate: float, seeds=range(5), n_requests: int = 300, slo: SLO = SLO(),
                     static_batch: int = 32, max_num_seqs: int = 256, **workload) -> dict:
    """Batch-1 FCFS, static and continuous batching on the same seeded workloads, one per seed.

    Returns {policy: {metric: array of one value per seed}}: average them, and look at their spread.
    """
    policies = {"batch-1 FCFS": FCFS, f"static B={static_batch}": lambda: StaticBatching(static_batch),
                f"continuous ({max_num_seqs} seats)": ContinuousBatching}
    out = {name: {m: [] for m in COMPARED} for name in policies}
    for seed in seeds:
        for name, make in policies.items():
            run = simulate(chat_workload(n_requests, rate, seed, **workload), make(), model, max_num_seqs=max_num_seqs)
            row = summarize(run.timelines, slo)
            for m in COMPARED:
                out[name][m].append(row[m])
    return {name: {m: np.array(v) for m, v in rows.items()} for name, rows in out.items()}


def compare_table(results: dict) -> str:
    """mean ± standard deviation [min, max] over seeds, one column per policy; latencies in ms."""
    names = list(results)
    lines = [f"{'metric':<20}" + "".join(f"{n:>40}" for n in names)]
    for m in COMPARED:
        latency = m.startswith(("ttft", "tpot", "itl"))
        scale, label = (1e3, m[:-2] + " (ms)") if latency else (1.0, m)
        cells = []
        for n in names:
            v = results[n][m] * scale
            cells.append(f"{v.mean():.4g} ± {v.std():.2g} [{v.min():.4g}, {v.max():.4g}]")
        lines.append(f"{label:<20}" + "".join(f"{c:>40}" for c in cells))
    return "\n".join(lines)


def run_compare(args) -> int:
    """``python -m miniengine simulate``: the three policies on the paper GPU, averaged over seeds."""
    from miniengine.cost.roofline import GPUS, CostModel, llama3_8b

    model = CostModel(llama3_8b(), GPUS[args.gpu])
    slo = SLO(ttft_s=args.ttft, tpot_s=args.tpot)
    results = compare_policies(model, args.rate, range(args.seeds), args.requests, slo, args.static_batch, args.max_num_seqs)
    print(f"simulated: Llama-3-8B on a paper {args.gpu}, {args.requests} chat requests at {args.rate}/s, "
          f"SLO TTFT <= {args.ttft} s and TPOT <= {1e3 * args.tpot:.0f} ms, {args.seeds} seeds: mean ± std [min, max]")
    print(compare_table(results))
    return 0


def add_arguments(p) -> None:
    p.add_argument("--rate", type=float, default=1.0, help="arrivals per second")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--gpu", default="H100", choices=["H100", "H200", "A100-80GB", "T4"])
    p.add_argument("--ttft", type=float, default=1.0, help="SLO on time to first token, seconds")
    p.add_argument("--tpot", type=float, default=0.05, help="SLO on time per output token, seconds")
    p.add_argument("--static-batch", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.set_defaults(func=run_compare)
