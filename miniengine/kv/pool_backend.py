"""The attention backend shared by every KV layout that stores K/V in one pool of token slots.

A pool holds K and V for ``num_slots`` token positions, every layer:
``[layers, num_slots, kv_heads, head_dim]``.  A layout decides which slot holds
position p of sequence b; the backend does the rest, the same way for all:

* ``slot_mapping``: where each of the step's new tokens writes its K/V (one
  ``index_copy_`` per layer for the whole step);
* a gather of each sequence's history, laid out as a padded ``[B, num_keys]``
  grid (one call per layer for a whole group of sequences, no loop over them);
* the one :func:`~miniengine.attention.attention` call per group.

Decodes and prefills form separate groups, so that decodes' single queries are
not padded to the longest prompt of a mixed step (selective batching).  The
contiguous layout maps positions to ``start + p``; the paged layout goes through
a block table.  That mapping, and the gather it implies, is all that differs.
"""
from __future__ import annotations

import torch

from miniengine.attention import RaggedBatch, attention


class AttentionGroup:
    """A run of consecutive sequences of a step, laid out as one padded grid for one attention call.

    ``history[i]`` positions of sequence i are already stored; it brings ``new_tokens[i]`` more,
    rows ``rows`` of the step's flattened tokens.  ``lo:hi`` are its sequences' indices in the step.
    """

    def __init__(self, history, new_tokens, lo: int, hi: int, rows: slice, device):
        self.lo, self.hi, self.rows = lo, hi, rows
        self.layout = RaggedBatch(new_tokens, device)
        self.history = torch.tensor(history, device=device)
        self.new_positions = self.history[:, None] + self.layout.query_index  # [B, Tq]
        self.positions = self.layout.unpad(self.new_positions)  # [T], sequence after sequence
        self.num_keys = max(h + n for h, n in zip(history, new_tokens))
        self.visible = self.layout.causal_visible(self.history, self.num_keys)

    def attend(self, q, history_k, history_v):
        """q: the step's [T, n_heads, d]; history_k/v: [B, num_keys, kv_heads, d] for this group."""
        L = self.layout
        return L.unpad(attention(L.pad(q[self.rows]), history_k, history_v, self.visible))


class PoolBackend:
    """One step's attention over a pool; subclasses say where positions live (:meth:`slots`, :meth:`gather`).

    ``history[i]``: positions sequence i already has in the pool; ``new_tokens[i]``: tokens it feeds now.
    """

    def __init__(self, pool_k: torch.Tensor, pool_v: torch.Tensor, history, new_tokens):
        self.pool_k, self.pool_v = pool_k, pool_v
        self.history, self.new_tokens = [int(h) for h in history], [int(n) for n in new_tokens]
        device = pool_k.device
        decodes = next((i for i, n in enumerate(self.new_tokens) if n != 1), len(self.new_tokens))
        cuts = [0, decodes, len(self.new_tokens)] if 0 < decodes < len(self.new_tokens) else [0, len(self.new_tokens)]
        self.groups, row = [], 0
        for lo, hi in zip(cuts, cuts[1:]):
            n = sum(self.new_tokens[lo:hi])
            self.groups.append(AttentionGroup(self.history[lo:hi], self.new_tokens[lo:hi], lo, hi, slice(row, row + n), device))
            row += n
        self._positions = torch.cat([g.positions for g in self.groups])
        self.slot_mapping = torch.cat([g.layout.unpad(self.slots(g, g.new_positions)) for g in self.groups])

    def slots(self, group: AttentionGroup, positions: torch.Tensor) -> torch.Tensor:
        """[b, P] pool slots of the given positions ([b, P]) of the group's sequences."""
        raise NotImplementedError

    def gather(self, cache: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
        """[b, num_keys, kv_heads, d]: the group's histories from one layer's pool [num_slots, kv_heads, d]."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise before any write if a sequence has no room for its new tokens."""

    def positions(self, device=None) -> torch.Tensor:
        return self._positions if device is None else self._positions.to(device)

    def attend(self, layer, q, k, v):
        self.check()
        kc, vc = self.pool_k[layer], self.pool_v[layer]  # [num_slots, kv_heads, head_dim]
        kc.index_copy_(0, self.slot_mapping, k)
        vc.index_copy_(0, self.slot_mapping, v)
        outs = [g.attend(q, self.gather(kc, g), self.gather(vc, g)) for g in self.groups]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def advance(self) -> None:
        """Called once after the forward pass: the new tokens' K/V are now stored in every layer."""


def gather_slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache[slots] for a [b, P] slot grid: whole rows of a 2-D view, a row memcpy, several times faster than
    advanced indexing."""
    rows = cache.flatten(1).index_select(0, slots.flatten())
    return rows.view(tuple(slots.shape) + tuple(cache.shape[1:]))
