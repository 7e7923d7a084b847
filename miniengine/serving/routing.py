"""Several replicas behind a router, on the simulator: round-robin, least-loaded and prefix-aware routing.

Beyond one machine, a service runs several copies (replicas) of the engine and a router in front of them.  A
request that shares a long prefix (a system prompt, a few-shot preamble, an agent's history) with an earlier one
is cheap only on a replica whose prefix cache still holds it: round-robin scatters a prefix over every replica,
each of which then computes it again.  A prefix-aware router (SGLang's router, llm-d's inference scheduler) sends
requests that share a prefix to the same replica, unless that replica is much busier than the least-loaded one.

The model here, stated so its numbers can be read for what they are:

* each replica is the simulator (the engine's scheduler on the cost model's clock) with a prefix cache of
  ``cache_prefixes`` whole prefixes, least recently used first out; a request whose prefix is cached feeds only
  its own tokens (``PrefixHitKV`` sets ``num_cached_tokens``, as the paged engine's prefix cache does);
* the router decides at arrival, from what it has seen: which replica it last sent each prefix to, and each
  replica's load, estimated as the requests it routed there in the last ``load_window_s`` seconds (a router reads
  ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` from each replica's /metrics for this);
* a cache entry is warm from its request's arrival on (the prefill that fills it is not waited for).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools

import numpy as np

from miniengine.serving.simulator import UnlimitedKV, simulate
from miniengine.serving.workloads import SimRequest, lognormal_lengths


@dataclasses.dataclass
class PrefixedRequest:
    request: SimRequest
    prefix: int      # which shared prefix it starts with
    prefix_len: int  # its length in tokens


def shared_prefix_workload(n: int, rate: float, num_prefixes: int = 32, prefix_len: int = 2048,
                           user_mean: float = 256, output_mean: float = 128, zipf: float = 1.1,
                           seed: int = 0) -> list[PrefixedRequest]:
    """``n`` Poisson arrivals; each starts with one of ``num_prefixes`` prefixes, drawn with Zipf-like popularity
    (prefix k with weight 1 / (k + 1) ** zipf), then its own lognormal user part and output."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, num_prefixes + 1) ** zipf
    prefixes = rng.choice(num_prefixes, size=n, p=weights / weights.sum())
    users = lognormal_lengths(rng, user_mean, 1.0, n)
    outputs = lognormal_lengths(rng, output_mean, 1.0, n)
    arrivals = np.cumsum(rng.standard_exponential(n)) / rate
    return [PrefixedRequest(SimRequest(i, float(a), prefix_len + int(u), int(o)), int(p), prefix_len)
            for i, (a, p, u, o) in enumerate(zip(arrivals, prefixes, users, outputs))]


class PrefixHitKV(UnlimitedKV):
    """The simulator's KV plug with prefix-cache hits: a hit request's prefix counts as already computed."""

    def __init__(self, hits: dict):
        self.hits = hits  # request id -> tokens served from the cache

    def allocate(self, seq) -> None:
        super().allocate(seq)
        seq.num_cached_tokens = self.hits.get(seq.request_id, 0)


class _Load:
    def __init__(self, replicas: int, window_s: float):
        self.recent = [collections.deque() for _ in range(replicas)]
        self.window_s = window_s

    def at(self, now: float) -> list[int]:
        for q in self.recent:
            while q and q[0] <= now - self.window_s:
                q.popleft()
        return [len(q) for q in self.recent]

    def add(self, replica: int, now: float) -> None:
        self.recent[replica].append(now)


class RoundRobin:
    name = "round-robin"

    def __init__(self):
        self._next = itertools.count()

    def route(self, r: PrefixedRequest, loads: list[int], owner: dict) -> int:
        return next(self._next) % len(loads)


class LeastLoaded:
    name = "least-loaded"

    def route(self, r, loads, owner) -> int:
        return int(np.argmin(loads))


class PrefixAware:
    """To the replica that last served the prefix, unless its load exceeds the least-loaded one's by more than
    ``balance`` requests; otherwise (and for a new prefix) to the least-loaded replica."""
    name = "prefix-aware"

    def __init__(self, balance: int = 8):
        self.balance = balance

    def route(self, r, loads, owner) -> int:
        least = int(np.argmin(loads))
        home = owner.get(r.prefix)
        return home if home is not None and loads[home] - loads[least] <= self.balance else least


def serve_replicas(workload: list[PrefixedRequest], router, replicas: int, make_policy, model,
                   cache_prefixes: int = 8, load_window_s: float = 2.0, max_num_seqs: int = 128,
                   max_num_batched_tokens: int = 8192) -> dict:
    """Route every request, then simulate each replica on its share; returns the timelines and the hit rate."""
    load = _Load(replicas, load_window_s)
    caches = [collections.OrderedDict() for _ in range(replicas)]
    owner: dict[int, int] = {}
    shares: list[list[SimRequest]] = [[] for _ in range(replicas)]
    hits: dict = {}
    for r in sorted(workload, key=lambda w: w.request.arrival):
        now = r.request.arrival
        k = router.route(r, load.at(now), owner)
        load.add(k, now)
        owner[r.prefix] = k
        cache = caches[k]
        if r.prefix in cache:
            cache.move_to_end(r.prefix)
            hits[r.request.id] = r.prefix_len
        else:
            cache[r.prefix] = True
            if len(cache) > cache_prefixes:
                cache.popitem(last=False)  # the least recently used prefix leaves
        shares[k].append(dataclasses.replace(r.request, timeline=None, seq=None, cached=0))
    timelines = []
    for share in shares:
        if share:
            result = simulate(share, make_policy(), model, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens, kv=PrefixHitKV(hits))
            timelines += result.timelines
    prompt = sum(r.request.prompt_len for r in workload)
    return {"timelines": timelines, "hit_rate": len(hits) / len(workload),
            "prefill_tokens": prompt - sum(hits.values()), "prompt_tokens": prompt,
            "requests_per_replica": [len(s) for s in shares]}
