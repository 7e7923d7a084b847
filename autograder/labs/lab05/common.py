"""Lab 05's shared checks: the answer key, your manager's state as plain ints, and the pool's invariants.

Every other part of this lab's harness reads your ``BlockManager`` through ``state`` and holds it to
``check_pool``. Reloaded by ``autograder.labs.lab05`` before its other parts (see that module).
"""
from __future__ import annotations

from collections import Counter

import numpy as np

import autograder.notebook_checks as checks

# This lab's answer key: any call into it while the tests run fails them (checks.reference_forbidden).
ANSWER_KEY = {
    "miniengine.kv.block_manager": ["blocks_needed", "BlockManager.__init__", "BlockManager.num_free_blocks",
                                    "BlockManager._take", "BlockManager._release", "BlockManager.can_allocate",
                                    "BlockManager.allocate", "BlockManager._needs_block", "BlockManager.can_append",
                                    "BlockManager.append_slot", "BlockManager.fork", "BlockManager.free"],
    "miniengine.kv.paged": ["gather_history"]}

# The methods your class must define itself: one inherited from the course's BlockManager would be the answer key.
METHODS = ("__init__", "can_allocate", "allocate", "can_append", "append_slot", "fork", "free")


def as_bool(x, what):
    """A plain bool: an object that only pretends to be True or False cannot answer can_allocate or can_append."""
    if not isinstance(x, (bool, np.bool_)):
        raise AssertionError(f"{what}: expected True or False, got {type(x).__name__} {x!r:.60}")
    return bool(x)


def as_ints(xs, what):
    """Block ids as a list of plain ints (a deque, a list, a tensor...)."""
    if isinstance(xs, (str, bytes, dict)) or not hasattr(xs, "__iter__"):
        raise AssertionError(f"{what}: expected a list of block ids, got {type(xs).__name__}")
    return [checks.as_count(x, f"{what}[{i}]") for i, x in enumerate(list(xs))]


def state(bm, where):
    """Your manager's free list, reference counts and block tables, as plain ints."""
    free = as_ints(bm.free_blocks, f"{where}: free_blocks")
    refs = as_ints(bm.ref_count, f"{where}: ref_count")
    if not isinstance(bm.block_tables, dict):
        raise AssertionError(f"{where}: block_tables must be a dict seq_id -> list of blocks, got "
                             f"{type(bm.block_tables).__name__}")
    tables = {checks.as_count(k, f"{where}: a key of block_tables"): as_ints(t, f"{where}: block_tables[{k!r}]")
              for k, t in bm.block_tables.items()}
    return free, refs, tables


def check_pool(free, refs, tables, num_blocks, where):
    """Reference counts equal the tables holding each block; the free list holds each free block once; no leak."""
    assert len(refs) == num_blocks, f"{where}: ref_count has {len(refs)} entries, expected one per block ({num_blocks})"
    held = Counter()
    for sid, table in sorted(tables.items()):
        bad = sorted({b for b in table if not 0 <= b < num_blocks})
        assert not bad, f"{where}: sequence {sid}'s table holds {bad}, which are not block ids (0..{num_blocks - 1})"
        twice = sorted(b for b, c in Counter(table).items() if c > 1)
        assert not twice, f"{where}: sequence {sid}'s table {table} holds block(s) {twice} twice"
        held.update(table)
    for b in range(num_blocks):
        holders = [sid for sid, t in sorted(tables.items()) if b in t]
        assert refs[b] == held[b], (f"{where}: block {b} is held by {held[b]} block table(s) (sequences {holders}), "
                                    f"but ref_count[{b}] is {refs[b]}")
    bad = sorted({b for b in free if not 0 <= b < num_blocks})
    assert not bad, f"{where}: the free list holds {bad}, which are not block ids (0..{num_blocks - 1})"
    twice = sorted(b for b, c in Counter(free).items() if c > 1)
    assert not twice, f"{where}: the free list holds block(s) {twice} more than once"
    busy = sorted(set(free) & set(held))
    assert not busy, (f"{where}: block(s) {busy} are on the free list, but a block table still holds them: a shared "
                      f"block may go back on the free list only when its last holder lets go of it")
    leaked = sorted(set(range(num_blocks)) - set(free) - set(held))
    assert not leaked, (f"{where}: {len(leaked)} block(s) leaked: {leaked} are neither on the free list nor in any "
                        f"block table")


def own_block_manager(cls):
    """Your BlockManager is a class of this notebook, and each graded method is its own, written with def."""
    assert isinstance(cls, type) and cls.__module__ == "__main__", (
        "BlockManager must be a class written with `class BlockManager:` in this notebook, not imported")
    for name in METHODS:
        assert name in vars(cls), f"BlockManager must define its own {name}"
        checks.require_own(vars(cls)[name], f"BlockManager.{name}")
