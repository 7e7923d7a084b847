"""Admission at arrival, Clockwork-style, for a server that runs one request at a time (Lecture 3, section 7).

Clockwork (Gujarati et al., OSDI 2020) rejects a request the moment it arrives if it predicts that the request
cannot meet its latency target, instead of queueing it, running it and missing anyway. That needs a prediction of
how long every request ahead will still hold the server. For an image classifier the prediction is exact; for an
LLM request it depends on how many tokens the request will generate, which nobody knows when it arrives.

:func:`admit_at_arrival` plays that controller over a list of requests. It knows each request's prefill time (the
prompt is known) and is given ``estimate_s``, its guess of every request's service time: the true times (an
oracle), a guess from the mean output length, a noisy predictor, or nothing at all (accept everything). The server
itself always takes the true time, first come first served. The result says, per request, whether it was
accepted, the time to first token it got (or would have got, had it been accepted at that moment) and what the
controller predicted, so that a lecture can count the two kinds of mistake: accepted but late, and rejected
although it would have been on time.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class AdmissionResult:
    """What happened to each request (arrays indexed like the requests) under one admission controller."""

    accepted: np.ndarray  # bool: the controller let it in
    ttft_s: np.ndarray  # TTFT it got if accepted; for a rejected one, the TTFT it would have got if accepted then
    predicted_ttft_s: np.ndarray  # what the controller predicted at arrival (NaN when it accepts everything)
    slo_ttft_s: float

    @property
    def on_time(self) -> np.ndarray:
        return self.accepted & (self.ttft_s <= self.slo_ttft_s)

    @property
    def late(self) -> np.ndarray:
        """Accepted, and still missed the target: server time spent on an answer that comes too late."""
        return self.accepted & (self.ttft_s > self.slo_ttft_s)

    @property
    def wrongly_rejected(self) -> np.ndarray:
        """Rejected, although accepting it then would have met the target."""
        return ~self.accepted & (self.ttft_s <= self.slo_ttft_s)

    @property
    def attainment(self) -> float:
        """Share of all requests (rejected ones included) served within the target."""
        return float(self.on_time.mean())

    @property
    def late_share(self) -> float:
        """Share of the accepted requests that were late."""
        return float(self.late.sum() / max(1, self.accepted.sum()))

    @property
    def wrong_reject_share(self) -> float:
        """Share of the rejected requests that would have been on time."""
        return float(self.wrongly_rejected.sum() / max(1, (~self.accepted).sum()))


def _times(name: str, values, n: int | None = None) -> np.ndarray:
    """A 1-D float array of finite times >= 0, checked so that a bad input names its field."""
    a = np.asarray(values, dtype=float)
    if a.ndim != 1 or (n is not None and len(a) != n):
        want = "a 1-D sequence" + (f" of {n} times (one per request)" if n is not None else "")
        raise ValueError(f"{name} must be {want}, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must hold finite times >= 0 (seconds)")
    return a


def admit_at_arrival(arrivals_s, prefill_s, service_s, slo_ttft_s: float, estimate_s=None) -> AdmissionResult:
    """One server, first come first served, one request at a time; each arrival is accepted or rejected at once.

    ``service_s[i]`` is how long request i really holds the server (its prefill, ``prefill_s[i]``, then its decode
    steps). The controller accepts request i if its predicted TTFT, the predicted wait for everyone accepted ahead
    of it plus its own prefill, is at most ``slo_ttft_s``. For the requests ahead it uses ``estimate_s``; of the
    one running it also knows how long it has run, so it never predicts that one to end before now.
    ``estimate_s=None`` accepts everything.
    """
    arrivals = _times("arrivals_s", arrivals_s)
    n = len(arrivals)
    prefill, service = _times("prefill_s", prefill_s, n), _times("service_s", service_s, n)
    estimate = None if estimate_s is None else _times("estimate_s", estimate_s, n)
    if np.any(np.diff(arrivals) < 0):
        raise ValueError("arrivals_s must be in arrival order (non-decreasing)")
    if np.any(prefill > service):
        raise ValueError("prefill_s must not exceed service_s: a request's service time includes its prefill")
    ok = isinstance(slo_ttft_s, (int, float)) and not isinstance(slo_ttft_s, bool) and slo_ttft_s > 0
    if not (ok and np.isfinite(slo_ttft_s)):
        raise ValueError(f"slo_ttft_s must be a time > 0 (seconds), got {slo_ttft_s!r}")

    accepted = np.zeros(n, dtype=bool)
    ttft, predicted = np.empty(n), np.full(n, np.nan)
    free_at = -np.inf  # when the server really finishes everyone accepted so far
    ahead: list[tuple[float, float, float]] = []  # (start, finish, estimate) of the accepted, unfinished requests
    for i, now in enumerate(arrivals):
        ahead = [r for r in ahead if r[1] > now]
        start = max(now, free_at)  # the true start, had it been accepted now
        ttft[i] = start - now + prefill[i]
        if estimate is not None:
            # The controller's view: the running request ends at its estimate, but not before now; the
            # queued ones follow it, each taking its estimate.
            guess = now
            for k, (started, _, est) in enumerate(ahead):
                guess = started + max(est, now - started) if k == 0 else guess + est
            predicted[i] = guess - now + prefill[i]
        if estimate is None or predicted[i] <= slo_ttft_s:
            accepted[i] = True
            free_at = start + service[i]
            ahead.append((start, free_at, 0.0 if estimate is None else estimate[i]))
    return AdmissionResult(accepted, ttft, predicted, float(slo_ttft_s))
