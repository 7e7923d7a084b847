"""KV-memory accounting the scheduler tests check after every step, for either layout."""
from collections import Counter

from miniengine.kv import ContiguousKV, PagedKV


def kv_tokens_held(kv) -> int:
    """Positions of KV memory taken from the pool right now."""
    if isinstance(kv, PagedKV):
        bm = kv.block_manager
        return (bm.num_blocks - bm.num_free_blocks) * bm.block_size
    return kv.arena.slots_reserved


def check_kv_accounting(kv, running, where="") -> None:
    """Contiguous: the reservations are exactly the running sequences'.  Paged: the block invariants."""
    if isinstance(kv, ContiguousKV):
        assert kv.arena.slots_reserved == sum(q.max_len for q in running), f"{where}: KV reservations do not match"
        return
    check_block_invariants(kv.block_manager, running, where)


def check_block_invariants(bm, running, where="") -> None:
    """No leaked block, reference counts equal the tables holding each block, free + used = the pool, and
    exactly the running sequences hold tables, each covering the positions it has cached."""
    tables = bm.block_tables
    assert set(tables) == {q.seq_id for q in running}, f"{where}: block tables {sorted(tables)} belong to other " \
                                                        f"sequences than the running ones {[q.seq_id for q in running]}"
    held = Counter(b for t in tables.values() for b in t)
    for b in range(bm.num_blocks):
        assert bm.ref_count[b] == held.get(b, 0), f"{where}: block {b} has ref_count {bm.ref_count[b]}, " \
                                                   f"but {held.get(b, 0)} tables hold it"
    free = list(bm.free_blocks)
    assert len(free) == len(set(free)), f"{where}: a block is on the free list twice"
    assert not set(free) & set(held), f"{where}: a block in use is on the free list"
    assert len(free) + len(held) == bm.num_blocks, f"{where}: {bm.num_blocks - len(free) - len(held)} blocks leaked"
    for q in running:
        assert len(tables[q.seq_id]) * bm.block_size >= q.num_cached_tokens, f"{where}: {q} outgrew its table"
