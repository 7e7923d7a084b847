"""Serving metrics from per-request timestamps: latency, throughput, cost, SLOs and goodput.

A request's life, as a user sees it:

    arrival ── queue ── prefill ──▶ token 1 ── ITL ──▶ token 2 ── ... ──▶ token L_o (finish)
    │◀──────────── TTFT ──────────▶│
    │◀───────────────────────────── E2E ──────────────────────────────────▶│

- TTFT (time to first token) = first token - arrival: queueing plus prefill.
- ITL (inter-token latency): the gaps between consecutive tokens.
- TPOT (time per output token) = (finish - first token) / (L_o - 1): the mean ITL.
- E2E = finish - arrival = TTFT + (L_o - 1) * TPOT.

Streaming services set targets on TTFT and TPOT rather than E2E, because a user
reading tokens as they appear does not wait for the end.  Throughput counts every
token; goodput counts only requests that met their SLO, because a reply that
arrives 30 s late is not a success.  Report tails (P90, P99), not means: one slow
call in twenty sinks an agent that makes twenty calls.

Any engine fills a ``RequestTimeline`` (miniengine/timeline.py, below the engine, so that the engine records
times without importing serving; the simulator in ``simulator.py`` fills them on the cost model's clock);
everything here is computed from those timestamps alone.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np

from miniengine.timeline import RequestTimeline  # noqa: F401 - where every metric reads its timestamps


# ---------------------------------------------------------------- per request


def ttft(r: RequestTimeline) -> float:
    """Time to first token: queueing + prefill."""
    return r.first_token_time - r.arrival


def tpot(r: RequestTimeline) -> float:
    """Time per output token after the first; NaN for a one-token reply, which has no gaps to average."""
    if r.output_tokens < 2:
        return math.nan
    return (r.token_times[-1] - r.token_times[0]) / (r.output_tokens - 1)


def itl(r: RequestTimeline) -> np.ndarray:
    """Every gap between consecutive output tokens (TPOT is their mean; their tail is the stutter users feel)."""
    return np.diff(np.asarray(r.token_times, dtype=float))


def e2e(r: RequestTimeline) -> float:
    """End-to-end latency: arrival to finish."""
    return r.finish_time - r.arrival


def queueing_delay(r: RequestTimeline) -> float:
    """Time spent waiting before the prefill started (NaN if the engine did not record it)."""
    return math.nan if r.scheduled is None else r.scheduled - r.arrival


# ---------------------------------------------------------------- SLOs


@dataclasses.dataclass(frozen=True)
class SLO:
    """A per-request promise: TTFT <= ttft_s and TPOT <= tpot_s.

    The course's chat SLO is 1 s and 50 ms (miniengine/README.md, Serving metrics).
    """

    ttft_s: float = 1.0
    tpot_s: float = 0.05

    def met_by(self, r: RequestTimeline) -> bool:
        t = tpot(r)
        return ttft(r) <= self.ttft_s and (math.isnan(t) or t <= self.tpot_s)


def slo_attainment(requests: Sequence[RequestTimeline], slo: SLO) -> float:
    """Share of requests that met the SLO."""
    return sum(slo.met_by(r) for r in requests) / len(requests) if requests else math.nan


# ---------------------------------------------------------------- over a run


def duration(requests: Sequence[RequestTimeline]) -> float:
    """The span a run's rates are measured over: first arrival to last finish."""
    return max(r.finish_time for r in requests) - min(r.arrival for r in requests)


def _span(requests, span):
    if not requests:
        raise ValueError("need at least one finished request")
    return duration(requests) if span is None else span


def throughput(requests: Sequence[RequestTimeline], span: float | None = None) -> float:
    """Output tokens per second (prompt tokens are not counted: say so when you compare with papers)."""
    return sum(r.output_tokens for r in requests) / _span(requests, span)


def request_throughput(requests: Sequence[RequestTimeline], span: float | None = None) -> float:
    """Completed requests per second."""
    return len(requests) / _span(requests, span)


def goodput(requests: Sequence[RequestTimeline], slo: SLO, span: float | None = None) -> float:
    """Requests per second that met the SLO (goodput's first definition in miniengine/README.md, Serving metrics)."""
    return sum(slo.met_by(r) for r in requests) / _span(requests, span)


def goodput_tokens(requests: Sequence[RequestTimeline], slo: SLO, span: float | None = None) -> float:
    """Output tokens per second, counting only the tokens of requests that met the SLO."""
    return sum(r.output_tokens for r in requests if slo.met_by(r)) / _span(requests, span)


def max_rate_meeting_slo(rates: Sequence[float], attainments: Sequence[float], target: float = 0.9) -> float:
    """Goodput as DistServe defines it: the highest arrival rate served with SLO attainment >= target.

    ``rates`` is a sweep in increasing order; the answer is the last rate before attainment first
    drops below the target (0.0 if even the lowest rate misses it).
    """
    best = 0.0
    for rate, att in zip(rates, attainments):
        if att < target:
            break
        best = rate
    return best


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """{"p50": ..., "p90": ..., "p99": ...} by numpy's (linear) percentile; NaNs (e.g. one-token TPOTs) are skipped."""
    v = np.asarray(list(values), dtype=float)
    v = v[~np.isnan(v)]
    return {f"p{q:g}": (float(np.percentile(v, q)) if v.size else math.nan) for q in qs}


def cost_per_million_tokens(dollars_per_hour: float, tokens_per_s: float) -> float:
    """What a million tokens cost on a GPU rented by the hour at this throughput."""
    return dollars_per_hour / 3600 / tokens_per_s * 1e6


def fanout_tail_probability(n_calls: int, p_slow: float = 0.01) -> float:
    """Chance that a task of ``n_calls`` independent calls meets at least one call slower than the per-call P(1 - p_slow)."""
    return 1 - (1 - p_slow) ** n_calls


def per_call_tail_budget(n_calls: int, task_risk: float) -> float:
    """The per-call exceedance probability that keeps ``fanout_tail_probability`` at ``task_risk``."""
    return 1 - (1 - task_risk) ** (1 / n_calls)


def summarize(requests: Sequence[RequestTimeline], slo: SLO = SLO(), span: float | None = None) -> dict:
    """The usual serving report of one run, as plain floats."""
    span = _span(requests, span)
    out = {
        "requests": len(requests),
        "duration_s": span,
        "throughput_tok_s": throughput(requests, span),
        "throughput_req_s": request_throughput(requests, span),
        "goodput_req_s": goodput(requests, slo, span),
        "goodput_tok_s": goodput_tokens(requests, slo, span),
        "slo_attainment": slo_attainment(requests, slo),
    }
    for name, fn in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        for key, value in percentiles(fn(r) for r in requests).items():
            out[f"{name}_{key}_s"] = value
    gaps = np.concatenate([itl(r) for r in requests] + [np.zeros(0)])  # every inter-token gap of every request
    for key, value in (percentiles(gaps).items() if gaps.size else ()):
        out[f"itl_{key}_s"] = value
    return out
