"""A contiguous KV cache: each sequence reserves one unbroken range of positions up front.

Naive decode recomputes K and V for the whole prefix at every step, although
they never change: a token's K and V depend only on the tokens before it.  The
cache keeps them.  Prefill runs the prompt once and fills the cache; each
decode step then feeds only the newest token, appends its K/V, and attends over
the stored history.  Same math (the same :func:`~miniengine.attention.attention`),
far fewer FLOPs: a request processes Lp + Lo - 1 tokens instead of sum(Lp + t).

The price is memory.  All sequences share one arena of ``num_slots`` positions,
and each reserves ``len(prompt) + max_tokens`` consecutive slots when it is
admitted, as early serving systems did, because nobody knows where it will
stop.  :attr:`KVCache.bytes_reserved` against :attr:`KVCache.bytes_used` is the
waste that PagedAttention (milestone 5) removes; the gaps between reservations
are external fragmentation.

The backend reads K/V through two index tensors built once per step: the slots
where the new tokens' K/V go (``slot_mapping``) and, for each sequence, the
slots of its whole history (``gather``).  A paged layout only builds those
indices differently.
"""
from __future__ import annotations

import torch

from miniengine.kv.pool_backend import PoolBackend, gather_slots


class KVArena:
    """K and V for ``num_slots`` token positions, every layer: [layers, num_slots, kv_heads, head_dim] each.

    ``reserve(n)`` hands out the first free run of n consecutive slots (first fit).
    """

    def __init__(self, config, num_slots: int, dtype=torch.float32, device="cpu"):
        shape = (config.num_hidden_layers, num_slots, config.num_key_value_heads, config.head_dim)
        # Zeros, not empty: masked-out history is multiplied by a probability of exactly 0, and 0 * NaN is NaN.
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self._taken: dict[int, int] = {}  # start -> length of each live reservation

    def find(self, n: int) -> int | None:
        """Start of the first free run of n slots, or None."""
        start = 0
        for s in sorted(self._taken):
            if s - start >= n:
                return start
            start = s + self._taken[s]
        return start if self.num_slots - start >= n else None

    def reserve(self, n: int) -> int:
        start = self.find(n)
        if start is None:
            raise MemoryError(f"KV arena: no run of {n} free slots among {self.num_slots}")
        self._taken[start] = n
        return start

    def release(self, start: int) -> None:
        del self._taken[start]

    @property
    def slots_reserved(self) -> int:
        return sum(self._taken.values())


class KVCache:
    """One sequence's K and V, for every layer, in a contiguous reservation of ``max_len`` positions.

    ``KVCache(config, max_len)`` on its own makes a private arena; the engine
    instead reserves ranges of one shared arena (:meth:`in_arena`).  ``k`` and
    ``v`` are views of shape [layers, max_len, kv_heads, head_dim].
    """

    def __init__(self, config, max_len: int, dtype=torch.float32, device="cpu"):
        self._attach(KVArena(config, max_len, dtype, device), 0, max_len)

    @classmethod
    def in_arena(cls, arena: KVArena, max_len: int) -> "KVCache":
        cache = cls.__new__(cls)
        cache._attach(arena, arena.reserve(max_len), max_len)
        return cache

    def _attach(self, arena, start, max_len):
        self.arena, self.start, self.max_len = arena, start, max_len
        self.length = 0  # positions whose K/V are stored (in every layer)

    @property
    def k(self) -> torch.Tensor:
        return self.arena.k[:, self.start : self.start + self.max_len]

    @property
    def v(self) -> torch.Tensor:
        return self.arena.v[:, self.start : self.start + self.max_len]

    @property
    def bytes_used(self) -> int:
        return 2 * self.k[:, : self.length].numel() * self.arena.k.element_size()

    @property
    def bytes_reserved(self) -> int:
        return 2 * self.k.numel() * self.arena.k.element_size()

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[0]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: writing positions [{start}, {end}) into a cache of max_len={self.max_len}")
        self.k[layer, start:end] = k
        self.v[layer, start:end] = v

    def free(self) -> None:
        self.arena.release(self.start)


class CachedBackend(PoolBackend):
    """Attention for a ragged batch whose sequences each own a :class:`KVCache` in one arena.

    The step's flattened tokens are, for each sequence in order, ``new_tokens[i]``
    tokens that continue at position ``caches[i].length``: the whole prompt in
    prefill, one token in decode.  In every layer, one scatter writes their K/V,
    one gather reads the histories, and one attention call serves a whole group
    of sequences (miniengine/kv/pool_backend.py).  Position p of a sequence lives
    in slot ``start + p`` of its reservation.  ``advance()`` moves each cache's
    length on after the pass.
    """

    def __init__(self, caches: list[KVCache], new_tokens: list[int]):
        self.caches = list(caches)
        arenas = {id(c.arena) for c in self.caches}
        if len(arenas) != 1:
            raise ValueError(f"CachedBackend serves caches of one KVArena, got caches from {len(arenas)} arenas")
        self.arena = self.caches[0].arena
        self._starts = torch.tensor([c.start for c in self.caches], device=self.arena.k.device)
        PoolBackend.__init__(self, self.arena.k, self.arena.v, [c.length for c in self.caches], new_tokens)
        self._overflow = next((f"KV cache overflow: writing positions [{c.length}, {c.length + n}) into a cache of "
                               f"max_len={c.max_len}" for c, n in zip(self.caches, self.new_tokens)
                               if c.length + n > c.max_len), None)
        for g in self.groups:
            keys = torch.arange(g.num_keys, device=self._starts.device).expand(g.hi - g.lo, -1)
            g.key_slots = self.slots(g, keys)

    def slots(self, group, positions):
        # Padded keys past a short reservation point at real (masked-out) slots, never past the arena.
        return (self._starts[group.lo:group.hi, None] + positions).clamp_(max=self.arena.num_slots - 1)

    def gather(self, cache, group):
        return gather_slots(cache, group.key_slots)

    def check(self):
        if self._overflow:
            raise ValueError(self._overflow)

    def advance(self) -> None:
        for cache, n in zip(self.caches, self.new_tokens):
            cache.length += n


class ContiguousKV:
    """The engine's default KV plug: one arena, one contiguous reservation per sequence.

    The KV plug-point interface (see miniengine/kv/__init__.py): ``can_allocate``,
    ``allocate``, ``free`` and ``backend``.
    """

    def __init__(self, model_config, num_slots: int, dtype=torch.float32, device="cpu"):
        self.arena = KVArena(model_config, num_slots, dtype, device)

    @property
    def capacity_tokens(self) -> int:
        """The most positions one sequence can ever reserve: a request needing more is rejected on arrival."""
        return self.arena.num_slots

    def can_allocate(self, seq) -> bool:
        return self.arena.find(seq.max_len) is not None

    def allocate(self, seq) -> None:
        seq.kv = KVCache.in_arena(self.arena, seq.max_len)

    def free(self, seq) -> None:
        seq.kv.free()
        seq.kv = None

    def truncate(self, seq, num_positions: int) -> None:
        """Forget every position from ``num_positions`` on (a rejected draft's K/V): the reservation stays."""
        seq.kv.length = min(seq.kv.length, num_positions)

    def backend(self, seqs, new_tokens) -> CachedBackend:
        return CachedBackend([s.kv for s in seqs], new_tokens)
