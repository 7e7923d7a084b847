"""KV-cache layouts: where K/V live, and the attention backend that reads them.

The KV plug point (``plugs.KVLayout``; ``plugs.GrowingKVLayout``, ``plugs.AttentionBackend``).
``LLM(..., kv=...)`` / ``EngineConfig.kv`` takes an object with

    can_allocate(seq) -> bool          is there KV memory for this waiting sequence now?
    allocate(seq)                      reserve it (sets ``seq.kv``)
    free(seq)                          give it back (finish, abort, preemption)
    backend(seqs, new_tokens)          this step's attention backend: positions(device),
                                       attend(layer, q, k, v), advance()
    capacity_tokens (optional)         the most positions one request may reserve; larger ones are refused
    can_append(seq), append_slot(seq)  (optional) a layout that grows sequences as they decode: is a slot
                                       free for the token seq feeds next, and take it; without a free
                                       slot the scheduler preempts (miniengine/engine/scheduler.py)
    fork(parent, child)                (optional) child shares parent's memory: SamplingParams(n > 1)

The course's layouts: :class:`PagedKV` (milestone 5, the default: a block
table per sequence over a pool of blocks) and :class:`ContiguousKV` (milestone
2: one reservation of prompt + max_tokens per sequence).  A per-sequence cache
class and backend class written in Lab 02 plug in through
:class:`PerSequenceKV`; a block manager and a gather written in Lab 05 plug into
:class:`PagedKV`.
"""
from miniengine.kv.block_manager import BlockManager
from miniengine.kv.contiguous import CachedBackend, ContiguousKV, KVArena, KVCache
from miniengine.kv.paged import PagedBackend, PagedKV, gather_history
from miniengine.kv.per_sequence import PerSequenceKV

__all__ = ["BlockManager", "CachedBackend", "ContiguousKV", "KVArena", "KVCache", "PagedBackend", "PagedKV",
           "PerSequenceKV", "gather_history"]
