"""One request's timestamps, which every engine fills (the engine on the wall clock, the simulator on the cost
model's) and serving/metrics.py turns into TTFT, TPOT, throughput and goodput.

It lives below the engine, not in serving/, so that the engine records times without importing serving/ (which
imports the engine): the packages stay layered, serving above engine (pyproject.toml's import-linter contracts).
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class RequestTimeline:
    """When things happened to one request, in seconds on one clock (wall or simulated)."""

    arrival: float
    prompt_tokens: int = 0
    token_times: list[float] = dataclasses.field(default_factory=list)  # when each output token was emitted
    scheduled: float | None = None  # when its prefill started: the end of queueing
    finish: float | None = None  # when it completed; None means "at its last token"
    request_id: object = None

    def record_token(self, t: float) -> None:
        """Called by an engine each time this request emits a token."""
        if self.token_times and t < self.token_times[-1]:
            raise ValueError(f"token times must not decrease, got {t} after {self.token_times[-1]}")
        self.token_times.append(t)

    @property
    def output_tokens(self) -> int:
        return len(self.token_times)

    @property
    def first_token_time(self) -> float:
        if not self.token_times:
            raise ValueError(f"request {self.request_id!r} has no output tokens yet")
        return self.token_times[0]

    @property
    def finish_time(self) -> float:
        return self.finish if self.finish is not None else self.token_times[-1] if self.token_times else math.nan


class VirtualClock:
    """Time moves only when the engine reads it (a fixed tick per call) or sleeps: every run is reproducible.

    Trace replay (``engine.replay(..., clock=VirtualClock())``) on it gives the same timestamps on every machine,
    which the tests and the labs' checks need; the wall clock is ``time.monotonic``."""

    def __init__(self, tick=0.01):
        self.t, self.tick = 0.0, tick

    def __call__(self):
        self.t += self.tick
        return self.t

    def sleep(self, seconds):
        self.t += max(0.0, seconds)
