"""Prefill/decode disaggregation on the cost model's clock: the same GPUs, colocated or split into two pools.

* **Colocated**: every GPU serves its share of the requests (round robin) with the engine's continuous
  batching, prefills and decodes in the same steps (:func:`miniengine.sim.simulate`).  A long prefill
  stalls every decode in its step.
* **Disaggregated**, as in DistServe (Zhong et al., OSDI 2024, https://arxiv.org/abs/2401.09670) and
  Splitwise (Patel et al., ISCA 2024, https://arxiv.org/abs/2311.18677): ``prefill_gpus`` GPUs only
  prefill, one prompt at a time, first come first served; the prompt's KV cache then crosses a link
  (``kv_bytes_per_token * prompt_len / link_bytes_per_s``); the other GPUs only decode, every running
  request one token per step.  A decode step never contains a prefill, so the time between tokens is the
  decode step's alone; the first token pays for the queue at the prefill pool and for the transfer.

The request's first token comes out of its prefill, as in the engine; the decode pool makes the rest.
Both modes price every step with the same cost model, so the difference is the arrangement alone.
"""
from __future__ import annotations

import dataclasses
import heapq

from . import metrics
from .engine.policy import ContinuousBatching
from .metrics import RequestTimeline
from .sim import NO_LIMIT, SimRequest, simulate


@dataclasses.dataclass
class Arrangement:
    name: str
    timelines: list[RequestTimeline]

    def summary(self) -> dict:
        return metrics.summarize(self.timelines)


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
