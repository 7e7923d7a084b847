"""KV-cache layouts: where K/V live, and the attention backend that reads them.

The KV plug point.  ``LLM(..., kv=...)`` / ``EngineConfig.kv`` takes an object with

    can_allocate(seq) -> bool          is there KV memory for this waiting sequence now?
    allocate(seq)                      reserve it (sets ``seq.kv``)
    free(seq)                          give it back (finish, abort, preemption)
    backend(seqs, new_tokens)          this step's attention backend: positions(device),
                                       attend(layer, q, k, v), advance()
    capacity_tokens (optional)         the most positions one request may reserve; larger ones are refused

The course's layouts: :class:`ContiguousKV` (milestone 2, the default).  A
per-sequence cache class and backend class written in Lab 02 plug in through
:class:`PerSequenceKV`.
"""
from .contiguous import CachedBackend, ContiguousKV, KVArena, KVCache
from .per_sequence import PerSequenceKV

__all__ = ["CachedBackend", "ContiguousKV", "KVArena", "KVCache", "PerSequenceKV"]
