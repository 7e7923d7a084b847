"""Lab 06, Task 2: your BlockManager's state read as plain ints, the rules a pool keeps, what one truncate must
do, and the scripted rollbacks that drive your class the way the speculative engine does.

Reloaded by ``autograder.labs.lab06`` (see that module); the test cells call it through ``lab06``, and
``lab06_engine`` checks every rollback on the engine with ``check_truncate`` too.

Besides its assertions, a script ``observe``s what it read of your manager (autograder/notebook_checks/ledger.py), for the
grader to judge outside the notebook: the size of every sequence's table after every operation (a visible script
states the sizes its operations must give; a hidden one leaves them to the grader, who has the course's solution's),
that the pool's rules held throughout, and the free blocks at the end.
"""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import autograder.notebook_checks as checks
from autograder.labs import shared
from autograder.labs.lab06.common import TRUNCATE_KEY
from autograder.labs.shared import as_ints, check_pool, state  # noqa: F401  the pool, as labs 05 and 06 check it
from miniengine.kv import block_manager as course_blocks


def own_block_manager(BlockManager):
    """BlockManager is your class, on the course's base class, with a truncate of its own."""
    cls = BlockManager
    assert isinstance(cls, type) and cls.__module__ == "__main__", (
        "BlockManager must be the class written in this notebook (`class BlockManager(kv.BlockManager):`), "
        "not imported")
    assert issubclass(cls, course_blocks.BlockManager), (
        "BlockManager must keep the given base class, kv.BlockManager: the engine uses its other methods")
    assert "truncate" in vars(cls), "BlockManager must define its own truncate(self, seq, num_tokens)"
    checks.require_own(vars(cls)["truncate"], "BlockManager.truncate")


def check_truncate(before, after, sid, num_tokens, seq_tokens, block_size, num_blocks, where):
    """What truncate(seq, num_tokens) must have done, from the states before and after; returns the blocks it let go."""
    free, refs, tables = before
    free2, refs2, tables2 = after
    assert sid in tables2, (
        f"{where}: sequence {sid} has no block table any more: truncate shortens the table, it keeps it")
    old, new = tables[sid], tables2[sid]
    keep = min(len(old), -(-num_tokens // block_size))
    want = old[:keep]
    if new != want:
        if len(new) > len(want) and new[:keep] == want:
            why = (f"it keeps {len(new) - keep} block(s) too many: positions [0, {num_tokens}) fit in "
                   f"ceil({num_tokens} / {block_size}) = {keep} block(s)")
            if len(new) == -(-seq_tokens // block_size):
                why += (f" (if you used seq.num_tokens: it is {seq_tokens}, one more than num_tokens, as the sequence "
                        f"already holds the target's token, not cached yet; truncate to the num_tokens argument)")
        elif len(new) < keep:
            why = (f"it dropped block(s) that hold confirmed positions: [0, {num_tokens}) need ceil({num_tokens} / "
                   f"{block_size}) = {keep} block(s)")
        else:
            why = f"keep the first {keep} block(s) of the table, in order: they hold positions [0, {num_tokens})"
        raise AssertionError(f"{where}: the table {old} should become {want}, got {new}: {why}")
    released = old[keep:]
    for b in released:
        if refs2[b] == refs[b] - 1:
            continue
        if refs2[b] == refs[b]:
            why = "its reference count is unchanged: decrement it, one table less holds the block"
        elif refs2[b] == 0 and refs[b] > 1:
            why = (f"it was shared by {refs[b]} tables, and the others still hold it: its count drops by one, to "
                   f"{refs[b] - 1}, and it stays with them")
        else:
            why = f"its reference count should drop by one, to {refs[b] - 1}"
        raise AssertionError(f"{where}: block {b} left the table of sequence {sid}, ref_count[{b}] went from {refs[b]} "
                             f"to {refs2[b]}: {why}")
    others = [b for b in range(num_blocks) if b not in released and refs2[b] != refs[b]]
    assert not others, (f"{where}: the reference counts of block(s) {others} changed, but only the released blocks "
                        f"{released} left a table")
    for s, table in tables.items():
        if s != sid:
            assert tables2.get(s) == table, (f"{where}: sequence {s}'s table changed from {table} to {tables2.get(s)}, "
                                             f"but truncate was called for sequence {sid}")
    back = [b for b in released if refs[b] == 1]
    missing = [b for b in back if b not in free2]
    assert not missing, (f"{where}: block(s) {missing} were held by sequence {sid} alone; once no table holds a block "
                         f"(count 0) it goes back on the free list")
    shared = [b for b in released if refs[b] > 1 and b in free2]
    assert not shared, (f"{where}: block(s) {shared} went back on the free list, but other tables still hold them (a "
                        f"fork's shared blocks): the next sequence to take them would overwrite their K/V")
    assert Counter(free2) == Counter(free) + Counter(back), (
        f"{where}: the free list should gain exactly the blocks that no table holds any more, {back}; it went from "
        f"{len(free)} to {len(free2)} blocks")
    check_pool(free2, refs2, tables2, num_blocks, where)
    return len(released)


class Rollback:
    """Drives your BlockManager the way the speculative engine does, checking it after every operation.

    Sequences are numbered 0, 1, ... as they are created. A sequence's num_tokens counts its tokens, the last one
    sampled but not yet cached; 'draft' makes room for g drafted tokens ahead (the scheduler's lookahead, through the
    course's append_slot), 'accept' rolls back after the verifier kept k of them and added its own token.
    """

    def __init__(self, BlockManager, num_blocks, block_size, label):
        self.num_blocks, self.block_size, self.label = num_blocks, block_size, label
        self.bm = BlockManager(num_blocks, block_size)  # your class, with the course's __init__ and other methods
        self.seqs, self.expect, self.history, self.next_id, self.released = {}, {}, [], 0, 0
        self.depth = 0
        # after each operation: your tables' sizes, and the sizes the operations must give (in seq_id order)
        self.sizes, self.want_sizes = [], []

    def blocks(self, n):
        return -(-n // self.block_size)

    def replay(self):
        """A failure ends with the operations that led to it, so that you can replay them on your class."""
        return shared.replaying(self)

    def check_tables(self, where):
        free, refs, tables = state(self.bm, where)
        self.sizes.append([len(tables.get(sid, [])) for sid in sorted(self.expect)])
        self.want_sizes.append([self.expect[sid] for sid in sorted(self.expect)])
        for sid, n in self.expect.items():
            assert len(tables.get(sid, [])) == n, (
                f"{where}: sequence {sid}'s table should hold {n} block(s), it holds {tables.get(sid)}")
        check_pool(free, refs, tables, self.num_blocks, where)

    def allocate(self, num_tokens):
        with self.replay():
            seq = SimpleNamespace(seq_id=self.next_id, num_tokens=num_tokens)
            self.next_id += 1
            self.history.append(f"allocate(seq {seq.seq_id}, {num_tokens} tokens)")
            self.bm.allocate(seq)
            self.seqs[seq.seq_id], self.expect[seq.seq_id] = seq, self.blocks(num_tokens)
            self.check_tables(f"{self.label}: after allocate(seq {seq.seq_id})")

    def draft(self, sid, g):
        with self.replay():
            seq = self.seqs[sid]
            n = seq.num_tokens
            self.history.append(f"seq {sid} drafts {g} (its table covers {n + g} positions)")
            for m in range(n, n + g + 1):  # PagedKV.cover: each position from n - 1 on writable by seq alone
                self.bm.append_slot(SimpleNamespace(seq_id=sid, num_tokens=m))
            self.expect[sid] = max(self.expect[sid], self.blocks(n + g))
            self.check_tables(f"{self.label}: after seq {sid} drafted {g} tokens")

    def accept(self, sid, k):
        """The verifier kept k drafts and added one token: positions [0, n + k) stay cached."""
        seq = self.seqs[sid]
        self.truncate(sid, seq.num_tokens + k, f"seq {sid} keeps {k} draft(s)")

    def truncate(self, sid, num_tokens, why=None):
        with self.replay():
            seq = self.seqs[sid]
            seq.num_tokens = num_tokens + 1  # as in the engine: the target's own token, not cached yet
            self.history.append(f"{why + ': ' if why else ''}truncate(seq {sid}, {num_tokens})")
            where = f"{self.label}: truncate(seq {sid}, num_tokens={num_tokens})"
            before = state(self.bm, where)
            with checks.reference_forbidden("truncate", forbidden=TRUNCATE_KEY):
                try:
                    self.bm.truncate(seq, num_tokens)
                except Exception as e:
                    raise AssertionError(f"{where}: truncate raised {type(e).__name__}: {e}") from e
            after = state(self.bm, where)
            self.released += check_truncate(before, after, sid, num_tokens, seq.num_tokens, self.block_size,
                                            self.num_blocks, where)
            self.expect[sid] = min(self.expect[sid], self.blocks(num_tokens))
            self.check_tables(where)

    def fork(self, sid):
        with self.replay():
            parent = self.seqs[sid]
            child = SimpleNamespace(seq_id=self.next_id, num_tokens=parent.num_tokens)
            self.next_id += 1
            self.history.append(f"fork(seq {sid} -> seq {child.seq_id})")
            self.bm.fork(parent, child)
            self.seqs[child.seq_id], self.expect[child.seq_id] = child, self.expect[sid]
            self.check_tables(f"{self.label}: after fork(seq {sid} -> seq {child.seq_id})")

    def free(self, sid):
        with self.replay():
            self.history.append(f"free(seq {sid})")
            self.bm.free(self.seqs.pop(sid))
            del self.expect[sid]
            self.check_tables(f"{self.label}: after free(seq {sid})")


def check_scripts(BlockManager, scripts, label, hidden=False):
    """ops: ("allocate", num_tokens) | ("draft", seq, g) | ("accept", seq, k) | ("truncate", seq, num_tokens) |
    ("fork", seq) | ("free", seq). At the end every sequence is freed: the whole pool must be free again.
    hidden: the sizes the tables must have are left to the grader (the course's solution's)."""
    own_block_manager(BlockManager)
    released = 0
    for what, num_blocks, block_size, ops in scripts:
        t = Rollback(BlockManager, num_blocks, block_size, f"{label}{what}")
        for op, *args in ops:
            getattr(t, op)(*args)
        for sid in sorted(t.seqs):
            t.free(sid)
        free, refs, tables = state(t.bm, t.label)
        assert len(free) == num_blocks, (
            f"{t.label}: every sequence is freed, yet {num_blocks - len(free)} blocks are not free")
        checks.observe(f"{t.label}: the tables' sizes after every operation", t.sizes,
                       **({} if hidden else {"expect": t.want_sizes}))
        checks.observe(f"{t.label}: the pool's rules held after every operation, every truncate as the task says",
                       True, expect=True)
        checks.observe(f"{t.label}: free blocks once every sequence is freed", len(free), expect=num_blocks)
        released += t.released
    return len(scripts), released
