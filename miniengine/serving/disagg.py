"""Prefill/decode disaggregation on the cost model's clock: the same GPUs, colocated or split into two pools.

* **Colocated**: every GPU serves its share of the requests (round robin) with the engine's continuous
  batching, prefills and decodes in the same steps (:func:`miniengine.serving.simulator.simulate`).  A long prefill
  stalls every decode in its step.
* **Disaggregated**, as in DistServe (Zhong et al., OSDI 2024, https://arxiv.org/abs/2401.09670) and
  Splitwise (Patel et al., ISCA 2024, https://arxiv.org/abs/2311.18677): ``prefill_gpus`` GPUs only
  prefill, one prompt at a time, first come first served; the prompt's KV cache then crosses a link
  (``kv_bytes_per_token * prompt_len / link_bytes_per_s``); the other GPUs only decode, every running
  request one token per step.  A decode step never contains a prefill, so the time between tokens is the
  decode step's alone; the first token pays for the queue at the prefill pool and for the transfer.

The request's first token comes out of its prefill, as in the engine; the decode pool makes the rest.
Both modes price every step with the same cost model, so the difference is the arrangement alone.
The simulator puts one whole copy of the model on each GPU and does not cap KV memory (in the default run
below a decode GPU holds at most about 66,000 tokens of Llama-3-8B's KV cache over 5 seeds, under a sixth of
the 427,000 that fit next to the weights).

    python -m miniengine disagg                       # colocated vs every split of 4 paper H100s
    python -m miniengine disagg --rate 8 --prompt-mean 2048 --prefill-gpus 2

(the command's flags and table: :mod:`miniengine.course.commands.disagg`)
"""
from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from miniengine.serving import metrics
from miniengine.engine.policy import ContinuousBatching
from miniengine.serving.metrics import SLO, RequestTimeline
from miniengine.serving.simulator import NO_LIMIT, simulate
from miniengine.serving.workloads import SimRequest, chat_workload


@dataclasses.dataclass
class Arrangement:
    name: str
    timelines: list[RequestTimeline]

    def summary(self, slo: SLO = SLO()) -> dict:
        """metrics.summarize, plus ``itl_max_s``: the worst gap between two tokens of any request."""
        gaps = [float(np.max(metrics.itl(t))) for t in self.timelines if t.output_tokens > 1]
        return {**metrics.summarize(self.timelines, slo), "itl_max_s": max(gaps, default=float("nan"))}


def colocated(requests: list[SimRequest], cost, gpus: int, max_num_seqs: int = 256,
              max_num_batched_tokens: int = NO_LIMIT) -> Arrangement:
    """Every GPU runs continuous batching on every ``gpus``-th request (round robin, in arrival order); with no
    token budget, a whole prompt is prefilled in one step beside the running decodes."""
    _check(requests, gpus)
    ordered = sorted(requests, key=lambda r: r.arrival)
    timelines = []
    for g in range(gpus):
        share = [SimRequest(r.id, r.arrival, r.prompt_len, r.output_len) for r in ordered[g::gpus]]
        if share:
            run = simulate(share, ContinuousBatching(), cost, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens)
            timelines += [r.timeline for r in run.requests]
    return Arrangement(f"colocated ({gpus} GPUs)", sorted(timelines, key=lambda t: t.request_id))


def disaggregated(requests: list[SimRequest], cost, gpus: int, prefill_gpus: int, link_bytes_per_s: float,
                  max_num_seqs: int = 256) -> Arrangement:
    """``prefill_gpus`` prefill-only GPUs, ``gpus - prefill_gpus`` decode-only ones, a link between them."""
    _check(requests, gpus)
    if isinstance(prefill_gpus, bool) or not isinstance(prefill_gpus, int) or not 1 <= prefill_gpus < gpus:
        raise ValueError(f"prefill_gpus must be an integer in [1, {gpus - 1}] (gpus={gpus}: at least one GPU "
                         f"for each pool), got {prefill_gpus!r}")
    if not link_bytes_per_s > 0:
        raise ValueError(f"link_bytes_per_s must be > 0, got {link_bytes_per_s!r}")
    ordered = sorted(requests, key=lambda r: r.arrival)
    timelines = {r.id: RequestTimeline(r.arrival, r.prompt_len, request_id=r.id) for r in ordered}
    # Prefill pool: each request goes to the GPU that is free first.
    free_at = [(0.0, g) for g in range(prefill_gpus)]
    ready = []  # (time its KV arrives at the decode pool, request)
    for r in ordered:
        t, g = heapq.heappop(free_at)
        start = max(t, r.arrival)
        done = start + cost.forward([r.prompt_len], [0]).step_time_s
        heapq.heappush(free_at, (done, g))
        timelines[r.id].scheduled = start
        timelines[r.id].record_token(done)  # the first token comes out of the prefill
        if r.output_len > 1:
            ready.append((done + r.prompt_len * cost.kv_bytes_per_token / link_bytes_per_s, r))
    # Decode pool: round robin in the order the caches arrive; each GPU runs decode-only continuous batching.
    ready.sort(key=lambda x: x[0])
    decode_gpus = gpus - prefill_gpus
    for g in range(decode_gpus):
        _decode(ready[g::decode_gpus], cost, timelines, max_num_seqs)
    return Arrangement(f"disaggregated ({prefill_gpus} prefill + {decode_gpus} decode GPUs)",
                       [timelines[r.id] for r in sorted(ordered, key=lambda r: r.id)])


def _decode(queue, cost, timelines, max_num_seqs: int) -> None:
    """One decode-only GPU: every step, arrived requests join (up to max_num_seqs) and each running one emits a
    token; a request leaves after its last token."""
    t, nxt, running = 0.0, 0, []  # running: [request, context length, tokens still to make]
    while nxt < len(queue) or running:
        if not running and nxt < len(queue):
            t = max(t, queue[nxt][0])
        while nxt < len(queue) and queue[nxt][0] <= t and len(running) < max_num_seqs:
            r = queue[nxt][1]
            running.append([r, r.prompt_len + 1, r.output_len - 1])
            nxt += 1
        t += cost.forward([1] * len(running), [c for _, c, _ in running]).step_time_s
        for item in running:
            timelines[item[0].id].record_token(t)
            item[1] += 1
            item[2] -= 1
        running = [item for item in running if item[2] > 0]


def _check(requests, gpus: int) -> None:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be an integer >= 1, got {gpus!r}")
    if not requests:
        raise ValueError("requests must not be empty")


def compare(requests_factory, cost, gpus: int, prefill_gpus: int, link_bytes_per_s: float) -> list[dict]:
    """Both arrangements on fresh copies of the same requests: one summary (metrics.summarize) each, named."""
    out = []
    for arrangement in (colocated(requests_factory(), cost, gpus),
                        disaggregated(requests_factory(), cost, gpus, prefill_gpus, link_bytes_per_s)):
        out.append({"name": arrangement.name, **arrangement.summary()})
    return out


# ---------------------------------------------------------------- many seeds, every split, and the verdict

# SLO attainment, not metrics.goodput: on a finite trace goodput divides by the makespan, which differs between
# arrangements by the last few requests' luck even when all of them meet the SLO.
REPORTED = ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "itl_max_s", "slo_attainment")


def workload(n: int, rate: float, seed: int, prompt_mean: float, output_mean: float, context: int) -> list[SimRequest]:
    """``sim.chat_workload``'s requests, each cut to fit a ``context``-token window (prompt + output <= context):
    a lognormal's tail would otherwise send prompts no real server of this model accepts."""
    out = []
    for r in chat_workload(n, rate, seed, prompt_mean, output_mean):
        output = min(r.output_len, context // 2)
        out.append(SimRequest(r.id, r.arrival, min(r.prompt_len, context - output), output))
    return out


def compare_splits(make_requests, cost, gpus: int, splits, link_bytes_per_s: float, seeds, slo: SLO = SLO()) -> dict:
    """Colocated, then each ``prefill_gpus`` in ``splits``, on ``make_requests(seed)`` for every seed.

    Returns {arrangement name: {"prefill_gpus": 0 for colocated, "gpus", metric: median over the seeds}} for
    the metrics in REPORTED; medians, because one seed with an unlucky burst should not set the verdict.
    """
    runs = {}
    for seed in seeds:
        arrangements = [(0, colocated(make_requests(seed), cost, gpus))]
        arrangements += [(p, disaggregated(make_requests(seed), cost, gpus, p, link_bytes_per_s)) for p in splits]
        for p, a in arrangements:
            row = a.summary(slo)
            runs.setdefault(a.name, (p, []))[1].append([row[m] for m in REPORTED])
    return {name: {"prefill_gpus": p, "gpus": gpus, **dict(zip(REPORTED, np.median(np.array(v), axis=0).tolist()))}
            for name, (p, v) in runs.items()}


def _ratio(a: float, b: float, less: str, more: str) -> str:
    r = a / b
    r, word = (r, more) if r >= 1 else (1 / r, less)
    return f"{r:.1f}x {word}" if r >= 1.095 else f"{r:.2f}x {word}"


def verdict(rows: dict, slo: SLO = SLO()) -> list[str]:
    """Notes, then one line: the arrangement with the lowest TPOT P99, against colocated.

    A split whose prefill pool cannot keep up has a low TPOT for a bad reason (its decode GPUs are
    starved) and a TTFT far over target, so only arrangements whose TTFT P99 meets the SLO compete.
    """
    items = list(rows.items())
    colo = items[0][1]
    fair = [(n, r) for n, r in items if r["ttft_p99_s"] <= slo.ttft_s]
    notes = [f"{n} has TTFT P99 {r['ttft_p99_s']:.2f} s, over the {slo.ttft_s:g} s target: not a candidate"
             for n, r in items if r["ttft_p99_s"] > slo.ttft_s]
    if not fair:
        notes.append(f"no arrangement meets the {slo.ttft_s:g} s TTFT target at P99; all of them compete")
        fair = items

    def lowest_tpot(candidates):
        return min(candidates, key=lambda x: x[1]["tpot_p99_s"])[1]

    winner = lowest_tpot(fair)
    best = winner if winner is not colo else lowest_tpot([x for x in fair if x[1] is not colo] or items[1:])
    split = f"disaggregation ({best['prefill_gpus']} prefill + {best['gpus'] - best['prefill_gpus']} decode)"
    versus = (f"TPOT P99 {_ratio(best['tpot_p99_s'], colo['tpot_p99_s'], 'lower', 'higher')}, "
              f"TTFT P99 {_ratio(best['ttft_p99_s'], colo['ttft_p99_s'], 'lower', 'higher')} than colocated")
    gain = colo["tpot_p99_s"] / best["tpot_p99_s"]
    if max(gain, 1 / gain) < 1.05 and any(r is best for _, r in fair):
        return notes + [f"no clear winner on TPOT P99 (within 5%): {split} has {versus}"]
    if winner is colo:
        return notes + [f"colocated wins on TPOT P99 among the candidates; the closest split, {split}, has {versus}"]
    return notes + [f"{split}: {versus}"]
