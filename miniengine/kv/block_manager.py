"""The block manager: PagedAttention's bookkeeping, with no tensors in it.

KV memory is a fixed pool of ``num_blocks`` blocks of ``block_size`` token
positions each.  A sequence owns a *block table*: the list of blocks that hold
its positions, in order (position p lives in block ``table[p // block_size]``
at offset ``p % block_size``).  Blocks need not be adjacent, so a sequence takes
memory one block at a time as it grows, and nothing is reserved for tokens it
may never generate (Kwon et al., "Efficient Memory Management for Large Language
Model Serving with PagedAttention", SOSP 2023, https://arxiv.org/abs/2309.06180).

Every block has a reference count: how many block tables hold it.  ``fork``
lets a child share all its parent's blocks (the prompt is stored once); the
first write into a shared block copies it first (copy-on-write), which is what
``append_slot`` reports back so that the KV layout can copy the block's K/V.

The interface (Lab 05 writes a class with these methods)::

    can_allocate(seq) -> bool      blocks for all of seq.num_tokens are free
    allocate(seq)                  give seq a table covering its seq.num_tokens positions
    can_append(seq) -> bool        a block is free if the next append needs one
    append_slot(seq) -> (src, dst) | None
                                   make the table cover seq.num_tokens positions, the last one
                                   writable; returns (shared block, its private copy) after a
                                   copy-on-write, else None
    fork(parent, child)            child's table = parent's, every block's count + 1
    free(seq)                      drop seq's table; blocks whose count reaches 0 are free again
    truncate(seq, num_tokens)      (speculative decoding's rollback) keep the blocks of positions
                                   [0, num_tokens), give the ones after back

Tables are kept here, keyed by ``seq.seq_id``: ``block_tables[seq.seq_id]``.
"""
from __future__ import annotations

from collections import deque


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` positions: the last one may be partly empty."""
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_count = [0] * num_blocks
        self.block_tables: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def _take(self) -> int:
        block = self.free_blocks.popleft()
        self.ref_count[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free_blocks.append(block)

    def can_allocate(self, seq) -> bool:
        return blocks_needed(seq.num_tokens, self.block_size) <= self.num_free_blocks

    def allocate(self, seq) -> None:
        if seq.seq_id in self.block_tables:
            raise RuntimeError(f"sequence {seq.seq_id} already has a block table")
        n = blocks_needed(seq.num_tokens, self.block_size)
        if n > self.num_free_blocks:
            raise MemoryError(f"KV pool: {seq.num_tokens} positions need {n} blocks, {self.num_free_blocks} are free")
        self.block_tables[seq.seq_id] = [self._take() for _ in range(n)]

    def _needs_block(self, seq) -> bool:
        """Does making position seq.num_tokens - 1 writable take a free block (a new one, or a private copy)?"""
        table = self.block_tables[seq.seq_id]
        if seq.num_tokens > len(table) * self.block_size:
            return True
        return self.ref_count[table[(seq.num_tokens - 1) // self.block_size]] > 1

    def can_append(self, seq) -> bool:
        return not self._needs_block(seq) or self.num_free_blocks > 0

    def append_slot(self, seq):
        table = self.block_tables[seq.seq_id]
        if seq.num_tokens > len(table) * self.block_size:
            table.append(self._take())
            return None
        i = (seq.num_tokens - 1) // self.block_size
        if self.ref_count[table[i]] == 1:
            return None
        # Copy-on-write: this sequence is about to write into a block others still read.
        src, dst = table[i], self._take()
        self._release(src)
        table[i] = dst
        return src, dst

    def fork(self, parent, child) -> None:
        table = list(self.block_tables[parent.seq_id])
        for block in table:
            self.ref_count[block] += 1
        self.block_tables[child.seq_id] = table

    def free(self, seq) -> None:
        for block in self.block_tables.pop(seq.seq_id, []):
            self._release(block)

    def truncate(self, seq, num_tokens: int) -> None:
        table = self.block_tables[seq.seq_id]
        keep = blocks_needed(num_tokens, self.block_size)
        while len(table) > keep:
            self._release(table.pop())
