"""The paged KV layout: a pool of fixed-size blocks, a block table per sequence (PagedAttention).

K and V live in a pool of ``num_blocks`` blocks of ``block_size`` positions,
every layer: ``[layers, num_blocks * block_size, kv_heads, head_dim]``, where
block b covers slots ``b * block_size .. (b + 1) * block_size - 1``.  The
:class:`~miniengine.kv.block_manager.BlockManager` decides which blocks a
sequence holds; this module moves the tensors:

* ``slot_mapping`` for the step's new tokens: position p of sequence b writes
  to slot ``table[p // block_size] * block_size + p % block_size``;
* :func:`gather_history`: each sequence's history through its block table, as a
  padded ``[B, num_keys]`` grid for the one attention function;
* the copy of a block's K/V when a shared block is written (copy-on-write).

Two plug points, for Lab 05: ``PagedKV(..., block_manager=..., gather=...)`` (``plugs.BlockAllocator``, with
``truncate`` for Lab 06 and ``register`` for Lab 08's prefix cache; ``plugs.HistoryGather``).

vLLM's PagedAttention kernel reads the blocks in place, inside the attention
kernel.  Here the gather copies them into a padded grid first and then calls the
ordinary attention: the same result, paid for with one extra read and write of
the history per layer (lecture 05 measures that cost).
"""
from __future__ import annotations

import numpy as np
import torch

from miniengine import plugs
from miniengine.kv.block_manager import BlockManager, blocks_needed
from miniengine.kv.pool_backend import PoolBackend
from miniengine.plugs.conformance import check


def gather_history(cache: torch.Tensor, block_tables: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Each sequence's first ``num_keys`` positions, read through its block table.

    cache: one layer's K (or V) pool as blocks, [num_blocks, block_size, kv_heads, head_dim];
    block_tables: [B, max_blocks] long, row b lists sequence b's blocks in order (padded with any valid block).
    Returns [B, num_keys, kv_heads, head_dim]; key j of sequence b is
    ``cache[block_tables[b, j // block_size], j % block_size]``.  Positions a sequence does not have
    read whatever its padding blocks hold: the attention mask hides them.
    """
    B, block_size = block_tables.shape[0], cache.shape[1]
    used = blocks_needed(num_keys, block_size)
    blocks = cache.index_select(0, block_tables[:, :used].flatten())  # whole blocks: one memcpy each
    return blocks.view(B, used * block_size, *cache.shape[2:])[:, :num_keys]


def block_table_tensor(tables: list[list[int]], width: int, device=None) -> torch.Tensor:
    """The tables as one [len(tables), width] long tensor, each padded with block 0 (any real block will do: what
    padding keys read is masked out).  Built in numpy: ``torch.tensor`` of nested lists costs about 5x as much
    per number, 0.3 ms for 64 tables of 32 blocks, which is a decode step's worth of time on a GPU."""
    grid = np.zeros((len(tables), width), dtype=np.int64)
    for row, t in zip(grid, tables):
        row[:len(t)] = t
    return torch.from_numpy(grid).to(device)


class PagedBackend(PoolBackend):
    """One step's attention over the paged pool.  ``tables[i]``: sequence i's block table, long enough for its
    history plus its new tokens (the scheduler's ``allocate``/``append_slot`` saw to that)."""

    def __init__(self, kv: "PagedKV", tables: list[list[int]], history, new_tokens):
        self.kv, self.block_size = kv, kv.block_size
        device = kv.pool_k.device
        self.block_tables = block_table_tensor(tables, max(len(t) for t in tables), device)
        self._short = next((f"block table of step row {i} has {len(t)} blocks ({len(t) * self.block_size} positions), "
                            f"but it writes positions [{h}, {h + n})" for i, (t, h, n) in
                            enumerate(zip(tables, history, new_tokens)) if h + n > len(t) * self.block_size), None)
        super().__init__(kv.pool_k, kv.pool_v, history, new_tokens)

    def slots(self, group, positions):
        tables = self.block_tables[group.lo:group.hi]
        # Padding cells of the grid may point past a short table: any real block will do, they are dropped.
        blocks = (positions // self.block_size).clamp_(max=tables.shape[1] - 1)
        return tables.gather(1, blocks) * self.block_size + positions % self.block_size

    def gather(self, cache, group):
        blocks = cache.view(self.kv.num_blocks, self.block_size, *cache.shape[1:])
        return self.kv.gather(blocks, self.block_tables[group.lo:group.hi], group.num_keys)

    def check(self):
        if self._short:
            raise ValueError(self._short)


class _Ahead:
    """A sequence as the block manager sees it, ``num_tokens`` long: for covering positions ahead of it."""

    def __init__(self, seq_id, num_tokens):
        self.seq_id, self.num_tokens = seq_id, num_tokens


class PagedKV:
    """The paged KV plug: a :class:`BlockManager` for the bookkeeping, a block pool for the tensors.

    ``num_blocks * block_size`` positions in all.  The KV plug-point interface
    (miniengine/kv/__init__.py), plus what paging adds: ``can_append`` and
    ``append_slot`` before each decode (the scheduler preempts when no block is
    free), and ``fork`` for ``SamplingParams(n > 1)``.
    """

    def __init__(self, model_config, num_blocks: int, block_size: int = 16, dtype=torch.float32, device="cpu",
                 block_manager=None, gather=None, enable_prefix_caching: bool = False):
        if block_manager is None:
            from miniengine.kv.prefix_cache import PrefixCachingBlockManager

            block_manager = (PrefixCachingBlockManager if enable_prefix_caching else BlockManager)(num_blocks, block_size)
        else:  # a plug (Labs 05, 06, 08): held to its Protocol here, where it is taken
            check("block_manager", block_manager, plugs.BlockAllocator)
            if enable_prefix_caching or hasattr(block_manager, "register"):
                check("block_manager", block_manager, plugs.PrefixCache)
        self.block_manager = block_manager
        self.num_blocks, self.block_size = num_blocks, block_size
        self.gather = gather_history if gather is None else check("gather", gather, plugs.HistoryGather)
        shape = (model_config.num_hidden_layers, num_blocks * block_size, model_config.num_key_value_heads,
                 model_config.head_dim)
        # Zeros, not empty: masked-out history is multiplied by a probability of exactly 0, and 0 * NaN is NaN.
        self.pool_k = torch.zeros(shape, dtype=dtype, device=device)
        self.pool_v = torch.zeros(shape, dtype=dtype, device=device)
        self.copies = 0  # copy-on-write block copies so far

    @property
    def capacity_tokens(self) -> int:
        """The whole pool: a request longer than this could never run, even alone."""
        return self.num_blocks * self.block_size

    def table(self, seq) -> list[int]:
        return self.block_manager.block_tables[seq.seq_id]

    def can_allocate(self, seq) -> bool:
        return self.block_manager.can_allocate(seq)

    def allocate(self, seq) -> None:
        reused = self.block_manager.allocate(seq)  # a prefix-caching manager says how many positions it found
        if reused:
            seq.num_cached_tokens = reused  # their K/V are in the pool already: the step feeds only the rest
        seq.kv = self

    def commit(self, seq) -> None:
        """After a step: the positions ``seq`` has cached are written, so a prefix cache may key its full blocks."""
        register = getattr(self.block_manager, "register", None)
        if register is not None and seq.seq_id in self.block_manager.block_tables:
            register(seq, seq.num_cached_tokens)

    def can_append(self, seq) -> bool:
        return self.block_manager.can_append(seq)

    def append_slot(self, seq) -> None:
        copy = self.block_manager.append_slot(seq)
        if copy is not None:
            self.copy_block(*copy)
            self.copies += 1

    def copy_block(self, src: int, dst: int) -> None:
        """Block ``dst`` gets block ``src``'s K and V, in every layer at once."""
        bs = self.block_size
        for pool in (self.pool_k, self.pool_v):
            pool[:, dst * bs:(dst + 1) * bs] = pool[:, src * bs:(src + 1) * bs]

    def cover(self, seq, num_positions: int) -> None:
        """Make seq's table cover ``num_positions`` positions, all writable from seq.num_tokens - 1 on
        (speculative decoding writes drafted tokens past the end): ``append_slot`` one position at a time."""
        for n in range(max(seq.num_tokens, 1), num_positions + 1):
            self.append_slot(_Ahead(seq.seq_id, n))

    def can_cover(self, seq, num_positions: int) -> bool:
        bm, bs = self.block_manager, self.block_size
        table = bm.block_tables[seq.seq_id]
        need = max(0, blocks_needed(num_positions, bs) - len(table))
        last = (seq.num_tokens - 1) // bs
        if last < len(table) and bm.ref_count[table[last]] > 1:
            need += 1  # its first write copies the shared block
        return need <= bm.num_free_blocks

    def truncate(self, seq, num_positions: int) -> None:
        """Forget every position from ``num_positions`` on (a rejected draft's K/V); whole blocks go back."""
        self.block_manager.truncate(seq, num_positions)

    def fork(self, parent, child) -> None:
        self.block_manager.fork(parent, child)
        child.kv = self

    def free(self, seq) -> None:
        self.block_manager.free(seq)
        seq.kv = None

    def backend(self, seqs, new_tokens):
        return PagedBackend(self, [self.table(s) for s in seqs], [s.num_cached_tokens for s in seqs], new_tokens)
