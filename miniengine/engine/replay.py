"""Replay an arrival trace on the engine, in real time: requests join when their arrival time comes.

    results = replay(engine, [TraceRequest(0.0, prompt_ids, params), TraceRequest(0.25, ...), ...])

Between steps, every request whose arrival time has passed is added; when nothing is running and the next
arrival is still ahead, the clock is waited out.  Each result carries the request's ``RequestTimeline``
(arrival, when its prefill started, when each token came out), so the serving metrics of
:mod:`miniengine.serving.metrics` apply to real runs exactly as to simulated ones.  Time is the engine's ``clock``
(and ``sleep``), which a test may replace by a virtual one.
"""
from __future__ import annotations

import dataclasses

from miniengine.timeline import RequestTimeline
from miniengine.sampling import SamplingParams
from miniengine.engine.sequence import Sequence


@dataclasses.dataclass
class TraceRequest:
    arrival: float  # seconds after the replay starts
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: object = None


@dataclasses.dataclass
class ReplayResult:
    request: TraceRequest
    seq: Sequence
    timeline: RequestTimeline


def replay(engine, trace) -> list[ReplayResult]:
    """Serve ``trace`` on ``engine``, on the engine's clock; returns one result per request, in trace order."""
    clock, sleep = engine.clock, engine.sleep
    pending = sorted(range(len(trace)), key=lambda i: trace[i].arrival)
    results: list[ReplayResult | None] = [None] * len(trace)
    by_seq: dict[int, RequestTimeline] = {}
    start, nxt = clock(), 0
    while nxt < len(pending) or engine.has_unfinished_requests():
        now = clock() - start
        while nxt < len(pending) and trace[pending[nxt]].arrival <= now:
            i = pending[nxt]
            r = trace[i]
            seq = engine.add_request(r.prompt_token_ids, r.params, r.request_id, arrival_time=start + r.arrival)
            results[i] = ReplayResult(r, seq, RequestTimeline(r.arrival, len(r.prompt_token_ids), request_id=seq.request_id))
            by_seq[seq.seq_id] = results[i].timeline
            nxt += 1
        if not engine.has_unfinished_requests():
            sleep(max(0.0, trace[pending[nxt]].arrival - (clock() - start)))  # idle until the next arrival
            continue
        stepped = engine.step()
        end = clock() - start
        for seq in stepped:
            timeline = by_seq[seq.seq_id]
            if timeline.scheduled is None:
                timeline.scheduled = now
            timeline.record_token(end)
    return results
