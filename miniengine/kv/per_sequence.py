"""Lab 02's shape of KV cache as an engine plug: one cache object per sequence, one backend per step.

    cache = cache_class(model_config, max_len, dtype, device)   # at admission: max_len = Lp + max_tokens
    backend = backend_class([cache, ...], new_tokens)           # every step: positions(), attend(), advance()

(``plugs.CacheFactory``, ``plugs.BackendFactory``, ``plugs.AttentionBackend``.)

Each sequence's memory is its own allocation, so memory never runs out here:
only ``max_num_seqs`` bounds the batch.
"""
from __future__ import annotations

from miniengine import plugs
from miniengine.plugs.conformance import check


class PerSequenceKV:
    def __init__(self, cache_class, backend_class, model_config, dtype, device):
        self.cache_class = check("cache_class", cache_class, plugs.CacheFactory)
        self.backend_class = check("backend_class", backend_class, plugs.BackendFactory)
        self.config, self.dtype, self.device = model_config, dtype, device

    def can_allocate(self, seq) -> bool:
        return True

    def allocate(self, seq) -> None:
        seq.kv = self.cache_class(self.config, seq.max_len, self.dtype, self.device)

    def free(self, seq) -> None:
        seq.kv = None

    def backend(self, seqs, new_tokens):
        return self.backend_class([s.kv for s in seqs], list(new_tokens))
