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

from ..attention import RaggedBatch, attention


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


class _AttentionGroup:
    """A run of consecutive sequences of a step, laid out as one padded grid for one attention call."""

    def __init__(self, arena, caches, new_tokens, rows: slice):
        device = arena.k.device
        self.rows, self.layout = rows, RaggedBatch(new_tokens, device)
        lengths = [c.length for c in caches]
        history = torch.tensor(lengths, device=device)
        starts = torch.tensor([c.start for c in caches], device=device)
        positions = history[:, None] + self.layout.query_index  # [B, Tq]
        self.positions = self.layout.unpad(positions)  # [T], sequence after sequence
        self.slot_mapping = self.layout.unpad(starts[:, None] + positions)  # where each new token's K/V goes
        num_keys = max(n0 + n for n0, n in zip(lengths, new_tokens))
        keys = torch.arange(num_keys, device=device)
        self.gather = (starts[:, None] + keys[None, :]).clamp_(max=arena.num_slots - 1)  # [B, num_keys]
        self.gather_rows = self.gather.flatten()
        self.visible = self.layout.causal_visible(history, num_keys)

    def attend(self, kc, vc, q):
        # index_select of whole rows of a 2-D view is a row memcpy, several times faster than kc[self.gather]
        shape = tuple(self.gather.shape) + tuple(kc.shape[1:])  # [B, num_keys, kv_heads, head_dim]
        history_k = kc.flatten(1).index_select(0, self.gather_rows).view(shape)
        history_v = vc.flatten(1).index_select(0, self.gather_rows).view(shape)
        L = self.layout
        return L.unpad(attention(L.pad(q[self.rows]), history_k, history_v, self.visible))


class CachedBackend:
    """Attention for a ragged batch whose sequences each own a :class:`KVCache` in one arena.

    The step's flattened tokens are, for each sequence in order, ``new_tokens[i]``
    tokens that continue at position ``caches[i].length``: the whole prompt in
    prefill, one token in decode.  In every layer, one scatter writes their K/V,
    one gather reads the histories, and one attention call serves a whole group
    of sequences.  The scheduler puts decodes before prefills; the decodes then
    form a group of their own, so that their single queries are not padded to
    the length of the longest prompt in the step (selective batching).
    ``advance()`` moves each cache's length on after the pass.
    """

    def __init__(self, caches: list[KVCache], new_tokens: list[int]):
        self.caches, self.new_tokens = list(caches), [int(n) for n in new_tokens]
        arenas = {id(c.arena) for c in self.caches}
        if len(arenas) != 1:
            raise ValueError(f"CachedBackend serves caches of one KVArena, got caches from {len(arenas)} arenas")
        self.arena = self.caches[0].arena
        self._overflow = next((f"KV cache overflow: writing positions [{c.length}, {c.length + n}) into a cache of "
                               f"max_len={c.max_len}" for c, n in zip(self.caches, self.new_tokens)
                               if c.length + n > c.max_len), None)
        decodes = next((i for i, n in enumerate(self.new_tokens) if n != 1), len(self.new_tokens))
        cuts = [0, decodes, len(self.caches)] if 0 < decodes < len(self.caches) else [0, len(self.caches)]
        self.groups, row = [], 0
        for lo, hi in zip(cuts, cuts[1:]):
            n = sum(self.new_tokens[lo:hi])
            self.groups.append(_AttentionGroup(self.arena, self.caches[lo:hi], self.new_tokens[lo:hi], slice(row, row + n)))
            row += n
        self._positions = torch.cat([g.positions for g in self.groups])
        self.slot_mapping = torch.cat([g.slot_mapping for g in self.groups])

    def positions(self, device=None) -> torch.Tensor:
        return self._positions if device is None else self._positions.to(device)

    def attend(self, layer, q, k, v):
        if self._overflow:
            raise ValueError(self._overflow)
        kc, vc = self.arena.k[layer], self.arena.v[layer]  # [num_slots, kv_heads, head_dim]
        kc.index_copy_(0, self.slot_mapping, k)
        vc.index_copy_(0, self.slot_mapping, v)
        outs = [g.attend(kc, vc, q) for g in self.groups]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def advance(self) -> None:
        """Called once after the forward pass: the new tokens' K/V are now stored in every layer."""
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

    def backend(self, seqs, new_tokens) -> CachedBackend:
        return CachedBackend([s.kv for s in seqs], new_tokens)
