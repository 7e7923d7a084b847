"""``GET /metrics``: the server's state and its requests' latencies, in Prometheus' text format.

Names and meanings are vLLM's (https://docs.vllm.ai/en/latest/design/metrics.html), so that a dashboard, an
autoscaler or a router written for vLLM reads this server unchanged: a load-aware router picks the replica with the
fewest ``vllm:num_requests_waiting`` or the lowest ``vllm:kv_cache_usage_perc``.  Every series carries the
``model_name`` label, as vLLM's do.  The latencies are the server's own view (from the moment the request reached
the engine); a client measures more, network and queueing in the HTTP stack included (``bench online``).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

# vLLM's bucket edges (seconds) for the request latencies and the per-token gaps
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)
FINISH_REASONS = ("stop", "length", "abort")


class ServerMetrics:
    """One registry per server (tests start several in one process)."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, model_name: str):
        disable_created_metrics()  # the *_created series: vLLM leaves them out too
        self.registry = CollectorRegistry()

        def series(kind, name: str, doc: str, **kw):  # one series of this server's model (vLLM's model_name label)
            return kind(name, doc, ["model_name"], registry=self.registry, **kw).labels(model_name)

        self.running = series(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = series(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = series(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = series(Counter, "vllm:num_preemptions", "Cumulative number of preemptions from the engine.")
        self.prompt_tokens = series(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = series(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          ["model_name", "finished_reason"], registry=self.registry)
        self.success = {reason: success.labels(model_name, reason) for reason in FINISH_REASONS}
        self.ttft = series(Histogram, "vllm:time_to_first_token_seconds",
                           "Histogram of time to first token in seconds.", buckets=_TTFT)
        self.itl = series(Histogram, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                          buckets=_TOKEN)
        self.tpot = series(Histogram, "vllm:time_per_output_token_seconds",
                           "Histogram of time per output token in seconds (per request: its decode time over its "
                           "tokens after the first).", buckets=_TOKEN)
        self.e2e = series(Histogram, "vllm:e2e_request_latency_seconds",
                          "Histogram of end to end request latency in seconds.", buckets=_E2E)
        self._preemptions_seen = 0

    def observe(self, running: int, waiting: int, kv_usage: float, preemptions: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        if preemptions > self._preemptions_seen:
            self.preemptions.inc(preemptions - self._preemptions_seen)
            self._preemptions_seen = preemptions

    def tokens(self, live, total_tokens: int, now: float) -> None:
        """A step gave the request ``total_tokens - live.tokens`` new tokens (``live`` is still the previous state)."""
        new = total_tokens - live.tokens
        if new <= 0:
            return
        self.generation_tokens.inc(new)
        if live.first_token is None:
            self.prompt_tokens.inc(live.prompt_tokens)
            self.ttft.observe(now - live.arrival)
        else:
            self.itl.observe(now - live.last_token)

    def request_done(self, live, finish_reason: str | None, now: float) -> None:
        self.finished(finish_reason or "stop")
        self.e2e.observe(now - live.arrival)
        if live.tokens > 1 and live.first_token is not None:
            self.tpot.observe((now - live.first_token) / (live.tokens - 1))

    def finished(self, reason: str) -> None:
        self.success[reason if reason in self.success else "stop"].inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
