"""Automatic prefix caching: a full KV block is found again by a hash of its tokens and of every token before it.

Requests often share a beginning (a system prompt, a few-shot preamble, an earlier turn of the same chat).
Their K/V for those positions are identical, so a block computed once can serve every later request that
starts the same way, as in vLLM's automatic prefix caching (https://docs.vllm.ai/en/latest/design/prefix_caching.html).

* **Keys.** Block i of a sequence holds positions ``[i * block_size, (i + 1) * block_size)``.  Its key chains
  the key of block i - 1 with its own tokens: ``h_i = hash((h_{i-1}, tokens of block i))``.  K/V at a position
  depend on every token before it, so two blocks may share K/V only if their whole prefixes are equal: the
  chain makes the key of block i differ whenever any earlier token differs.
* **Only full blocks, only once written.**  A block is keyed after the step that filled it
  (``register``), never before: its K/V must exist before anyone else reads them.  The block holding a
  sequence's last token is never reused, so at least one token is fed and the step has logits to sample.
* **Reference counts do the sharing.**  ``allocate`` finds the longest run of keyed blocks that starts the
  sequence, takes each of them (count + 1) and computes only the rest: the sequence starts with
  ``num_cached_tokens`` = the positions it found.
* **Eviction, least recently used.**  A keyed block that no table holds any more stays keyed, in
  ``evictable``; a new block comes from the plain free list first, and only then from the least recently
  freed keyed block, whose key is dropped.  A block some table holds is never handed out.

SGLang's RadixAttention keeps the same thing as a radix tree of token sequences instead of a hash per
block (Zheng et al., 2023, https://arxiv.org/abs/2312.07104): it shares prefixes at any token, not just at
block boundaries, at the cost of a tree walk.  Lecture 08 compares the two.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from miniengine.kv.block_manager import BlockManager, blocks_needed

NO_PARENT = b""  # the key "before" block 0


def block_key(parent: bytes, tokens) -> bytes:
    """The key of a full block: SHA-256 of the key of the block before it and its own tokens.

    A cryptographic hash rather than Python's 64-bit ``hash``: a collision would silently hand one request
    another's K/V, so it must be out of the question, not merely rare."""
    return hashlib.sha256(parent + np.asarray(tokens, dtype=np.int64).tobytes()).digest()


def block_keys(token_ids, block_size: int) -> list[bytes]:
    """The key of every full block of ``token_ids``, in order (a partly filled last block has none)."""
    keys, parent = [], NO_PARENT
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_key(parent, token_ids[start:start + block_size])
        keys.append(parent)
    return keys


class PrefixCachingBlockManager(BlockManager):
    """A :class:`BlockManager` whose full blocks outlive their sequences until the memory is needed.

    ``num_free_blocks`` counts both kinds of unused block: plain free ones and evictable keyed ones.
    """

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.cached: dict[bytes, int] = {}  # key -> block
        self.key_of: dict[int, bytes] = {}  # block -> key
        self.evictable: OrderedDict[int, None] = OrderedDict()  # keyed, in no table: least recently freed first
        self.queried_tokens = self.hit_tokens = 0  # prompt positions looked up, and found

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks) + len(self.evictable)

    def _take(self) -> int:
        if self.free_blocks:
            block = self.free_blocks.popleft()
        else:  # evict: the least recently freed keyed block forgets its key
            block, _ = self.evictable.popitem(last=False)
            del self.cached[self.key_of.pop(block)]
        self.ref_count[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            if block in self.key_of:
                self.evictable[block] = None  # the most recently freed: evicted last
            else:
                self.free_blocks.append(block)

    def match(self, seq) -> list[int]:
        """The keyed blocks that start ``seq``, in order: its longest cached prefix, in whole blocks.

        The last token is left out, so a fully cached sequence still feeds one token."""
        found = []
        for key in block_keys(seq.token_ids[: seq.num_tokens - 1], self.block_size):
            block = self.cached.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def can_allocate(self, seq) -> bool:
        found = self.match(seq)
        unused = sum(self.ref_count[b] == 0 for b in found)  # found blocks that were counted as free
        need = blocks_needed(seq.num_tokens, self.block_size) - len(found)
        return need <= self.num_free_blocks - unused

    def allocate(self, seq) -> int:
        """Give ``seq`` a table covering its tokens, reusing its cached prefix; returns the positions reused."""
        if seq.seq_id in self.block_tables:
            raise RuntimeError(f"sequence {seq.seq_id} already has a block table")
        if not self.can_allocate(seq):
            raise MemoryError(f"KV pool: {seq.num_tokens} positions need more blocks than the "
                              f"{self.num_free_blocks} free ones")
        found = self.match(seq)
        for block in found:
            if self.ref_count[block] == 0:
                del self.evictable[block]
            self.ref_count[block] += 1
        rest = blocks_needed(seq.num_tokens, self.block_size) - len(found)
        self.block_tables[seq.seq_id] = found + [self._take() for _ in range(rest)]
        self.queried_tokens += seq.num_tokens
        self.hit_tokens += len(found) * self.block_size
        return len(found) * self.block_size

    def register(self, seq, num_tokens: int) -> None:
        """Key the full blocks among ``seq``'s first ``num_tokens`` positions (their K/V are written now).

        A block whose key another block already has stays unkeyed: two requests that prefilled the same
        prefix in one step keep one copy in the cache, and the other goes back to the free list when freed."""
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return
        for i, key in enumerate(block_keys(seq.token_ids[:num_tokens], self.block_size)):
            block = table[i]
            if block in self.key_of or key in self.cached:
                continue
            self.cached[key] = block
            self.key_of[block] = key

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
