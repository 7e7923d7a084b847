"""Serving workloads: requests with Poisson arrivals and long-tailed (lognormal) prompt and output lengths, seeded.

A :class:`SimRequest` is what :mod:`miniengine.serving.simulator` serves: its arrival, its prompt and output
lengths (only the simulator knows the output length in advance), and the progress the simulation fills in.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from miniengine.engine.sequence import Sequence
from miniengine.serving.metrics import RequestTimeline


@dataclasses.dataclass
class SimRequest:
    """A request and its progress: how many of its tokens are in the KV cache, and its timeline."""

    id: int
    arrival: float
    prompt_len: int
    output_len: int
    cached: int = 0  # tokens whose K/V are in the cache
    predicted_len: int | None = None  # a length predictor's guess at output_len (None: no predictor), see with_predictions
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


def with_predictions(requests: list[SimRequest], sigma: float, seed: int = 0) -> list[SimRequest]:
    """Give each request a predicted output length, as a noisy length predictor would: output_len * exp(sigma * z),
    z standard normal, rounded and at least 1 (sigma = 0: a perfect predictor).  The noise has its own seeded stream,
    so the requests' lengths and arrivals stay those of the workload.  Returns the same requests."""
    if not (isinstance(sigma, (int, float)) and sigma >= 0):
        raise ValueError(f"sigma must be a number >= 0, got {sigma!r}")
    z = np.random.default_rng([seed, 7919]).standard_normal(len(requests))
    for r, zi in zip(requests, z):
        r.predicted_len = max(1, int(np.rint(r.output_len * math.exp(sigma * zi))))
    return requests
