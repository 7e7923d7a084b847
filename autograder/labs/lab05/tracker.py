"""Lab 05, Task 1 on its own: scripted and random operations on your BlockManager, checked after every one.

``Tracker`` drives your manager the way the scheduler does (can_allocate then allocate, can_append then
append_slot or a preemption, fork, free) and holds it, after every operation, to the pool's invariants
(lab05_common.check_pool) and to what that operation must have done. It also keeps each operation's outcome in
plain values that do not depend on which free block a manager picks (``Tracker.trace``: the answer, the free blocks
left, each table's length and shared blocks), which the checks observe for the grader (checks.observe): the grader
compares them with the course's solution's, outside the kernel. Reloaded by ``autograder.labs.lab05``.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

import autograder.notebook_checks as checks
from autograder.labs import shared
from autograder.labs.lab05.common import ANSWER_KEY, as_bool, check_pool, own_block_manager, state


def replayed(op):
    """An operation whose failure ends with the operations that led to it (Tracker.replay)."""
    @functools.wraps(op)
    def run(self, *args, **kwargs):
        with self.replay():
            return op(self, *args, **kwargs)
    return run


class Tracker:
    """Drives your BlockManager the way the scheduler does, and checks the invariants after every operation.

    To a block manager a sequence is seq.seq_id and seq.num_tokens; the tracker keeps the live sequences and the
    operations so far, so that a failure says how to reproduce it.
    """

    def __init__(self, BlockManager, num_blocks, block_size, label):
        self.num_blocks, self.block_size, self.label = num_blocks, block_size, label
        self.seqs, self.history, self.next_id, self.trace = {}, [], 0, []
        self.copies = self.preemptions = self.depth = 0
        self.bm = BlockManager(num_blocks, block_size)
        self.check()

    def where(self):
        return self.label

    def verdict(self, got, want):  # a hidden case's message says what the answer was, never what it should be
        return f"answered {got}, which is wrong" if self.label.startswith("hidden") else f"should be {want}"

    def replay(self):
        """A failure inside an operation ends with the operations that led to it, so that you can replay them.
        Only the outermost operation adds them: a preemption (free) happens inside a decode step (append)."""
        return shared.replaying(self)

    def call(self, name, *args):
        """Call one of your methods; an exception in it becomes a failure that names the operations so far."""
        try:
            return getattr(self.bm, name)(*args)
        except Exception as e:
            raise AssertionError(f"{self.where()}: {name} raised {type(e).__name__}: {e}") from e

    def state(self):
        return state(self.bm, self.where())

    def check(self):
        """The invariants after every operation: a table per live sequence, the pool adds up, tables are tight."""
        where = self.where()
        free, refs, tables = self.state()
        live = sorted(self.seqs)
        assert sorted(tables) == live, (
            f"{where}: block_tables holds tables for sequences {sorted(tables)}, but the live sequences are {live}"
            + (": free(seq) must remove the table of seq" if set(tables) > set(live) else ""))
        check_pool(free, refs, tables, self.num_blocks, where)
        for sid, table in tables.items():
            n = self.seqs[sid].num_tokens
            want = -(-n // self.block_size)
            assert len(table) == want, (
                f"{where}: sequence {sid} has {n} positions, so its table needs ceil({n} / {self.block_size}) = {want} "
                f"block(s), but it holds {len(table)}: {table}")
        n_free = checks.as_count(self.bm.num_free_blocks, f"{where}: num_free_blocks")
        assert n_free == len(free), f"{where}: num_free_blocks is {n_free}, but the free list holds {len(free)} blocks"
        return free, refs, tables

    def record(self, op, answer=None):
        """The operation's outcome, once it passed its checks: [op, answer, free blocks, [[seq, table length,
        shared blocks in it], ...]], the same for every correct manager whichever free blocks it picks."""
        free, refs, tables = self.state()
        self.trace.append([op, answer, len(free),
                           [[sid, len(t), sum(refs[b] > 1 for b in t)] for sid, t in sorted(tables.items())]])

    def unchanged(self, before, after, *mine):
        """An operation on one sequence changes no other sequence's table."""
        for sid, table in before.items():
            if sid not in mine and sid in after:
                assert after[sid] == table, (f"{self.where()}: sequence {sid}'s table changed from {table} to "
                                             f"{after[sid]}, but the operation was on sequence {mine[0]}")

    @replayed
    def allocate(self, num_tokens):
        """can_allocate, then allocate when it can; returns the new sequence's id, or None."""
        free, refs, tables = self.state()
        seq = SimpleNamespace(seq_id=self.next_id, num_tokens=num_tokens)
        self.next_id += 1
        need = -(-num_tokens // self.block_size)
        self.history.append(f"can_allocate(seq {seq.seq_id} with {num_tokens} positions)")
        got = as_bool(self.call("can_allocate", seq), f"{self.where()}: can_allocate")
        want = need <= len(free)
        assert got == want, (f"{self.where()}: can_allocate {self.verdict(got, want)}: {num_tokens} positions need "
                             f"{need} block(s) of {self.block_size}, and {len(free)} are free")
        if not got:
            self.record(f"allocate {num_tokens}", False)
            return None
        self.history[-1] = f"allocate(seq {seq.seq_id} with {num_tokens} positions)"
        self.seqs[seq.seq_id] = seq
        self.call("allocate", seq)
        free2, refs2, tables2 = self.check()
        taken = [b for b in tables2[seq.seq_id] if b not in free]
        assert not taken, f"{self.where()}: allocate gave sequence {seq.seq_id} block(s) {taken}, which were not free"
        self.unchanged(tables, tables2, seq.seq_id)
        self.record(f"allocate {num_tokens}", True)
        return seq.seq_id

    def append(self, sid, times=1):
        """The scheduler's decode step, `times` times: a token was sampled (num_tokens + 1); can_append, then
        append_slot. When can_append says no, the sequence is preempted (freed), as the scheduler does."""
        for _ in range(times):
            if sid not in self.seqs:
                return
            self.append_one(sid)

    @replayed
    def append_one(self, sid):
        seq, bs = self.seqs[sid], self.block_size
        free, refs, tables = self.state()
        seq.num_tokens += 1
        p, table = seq.num_tokens - 1, tables[sid]
        i = p // bs
        grow = i >= len(table)
        shared = not grow and refs[table[i]] > 1
        want = not (grow or shared) or len(free) > 0
        if grow:
            why = f"position {p} starts block {i} of its table, so it needs a new block"
        elif shared:
            why = f"position {p} lies in block {table[i]}, which {refs[table[i]]} tables share, so it needs a private copy"
        else:
            why = f"position {p} lies in block {table[i]}, which it holds alone, with room left"
        self.history.append(f"can_append(seq {sid}, now {seq.num_tokens} positions)")
        got = as_bool(self.call("can_append", seq), f"{self.where()}: can_append")
        assert got == want, (f"{self.where()}: can_append {self.verdict(got, want)}: {why}, and {len(free)} block(s) "
                             f"are free")
        if not got:
            self.preemptions += 1
            self.free(sid, preempted=True)
            self.record(f"append {sid}", "preempted")
            return
        self.history[-1] = f"append_slot(seq {sid}, now {seq.num_tokens} positions)"
        ret = self.call("append_slot", seq)
        where = self.where()
        if ret is not None:
            if isinstance(ret, (str, bytes)) or not hasattr(ret, "__len__") or len(ret) != 2:
                raise AssertionError(f"{where}: append_slot must return None or a pair (src, dst), got {ret!r:.60}")
            ret = tuple(checks.as_count(x, f"{where}: append_slot's result") for x in ret)
        free2, refs2, tables2 = self.check()
        new = tables2[sid]
        if grow:
            assert ret is None, f"{where}: append_slot returned {ret}, but {why}: there is nothing to copy, return None"
            assert new[:-1] == table and new[-1] in free, (
                f"{where}: {why}: the table should become {table} plus one free block, got {new}")
        elif shared:
            src = table[i]
            assert ret is not None, (
                f"{where}: {why}: append_slot must do a copy-on-write (give sequence {sid} a free block in place of "
                f"block {src}, in its own table only) and return (src, dst) = ({src}, the new block), so that the KV "
                f"layout copies the K/V before the step writes; it returned None (table now {new})")
            assert ret[0] == src, (f"{where}: append_slot returned {ret}, but the block copied from is {src}: "
                                   f"return (src, dst), the shared block first, then its private copy")
            assert ret[1] in free, f"{where}: append_slot returned {ret}, but dst={ret[1]} was not a free block"
            want_table = table[:i] + [ret[1]] + table[i + 1:]
            assert new == want_table, f"{where}: after the copy-on-write the table should be {want_table}, got {new}"
            self.copies += 1
        else:
            assert ret is None, f"{where}: append_slot returned {ret}, but {why}: nothing to copy, return None"
            assert new == table, f"{where}: {why}: the table should stay {table}, got {new}"
        last = new[p // bs]
        assert refs2[last] == 1, (f"{where}: after append_slot, position {p} lies in block {last}, which "
                                  f"{refs2[last]} tables hold: the sequence about to write it must hold it alone")
        self.unchanged(tables, tables2, sid)
        self.record(f"append {sid}", "new block" if grow else "copy" if shared else "in place")

    @replayed
    def fork(self, sid):
        """A new completion shares sequence sid's blocks; returns the child's id."""
        parent = self.seqs[sid]
        free, refs, tables = self.state()
        child = SimpleNamespace(seq_id=self.next_id, num_tokens=parent.num_tokens)
        self.next_id += 1
        self.history.append(f"fork(seq {sid} -> seq {child.seq_id})")
        self.seqs[child.seq_id] = child
        self.call("fork", parent, child)
        where = self.where()
        free2, refs2, tables2 = self.check()
        assert tables2[child.seq_id] == tables[sid], (
            f"{where}: the child's table should list the parent's blocks {tables[sid]} (shared, not copied), got "
            f"{tables2[child.seq_id]}")
        assert sorted(free2) == sorted(free), f"{where}: fork changed the free list; it only shares the parent's blocks"
        self.unchanged(tables, tables2, child.seq_id)
        assert self.bm.block_tables[child.seq_id] is not self.bm.block_tables[sid], (
            f"{where}: the child's table is the parent's list object itself: give the child a list of its own "
            f"(list(table)), or a block appended to one of them lands in both tables")
        self.record(f"fork {sid}")
        return child.seq_id

    @replayed
    def free(self, sid, preempted=False):
        free, refs, tables = self.state()
        seq = self.seqs.pop(sid)
        self.history.append(f"free(seq {sid})" + (" (preempted: no free block for its next position)" if preempted else ""))
        self.call("free", seq)
        where = self.where()
        free2, refs2, tables2 = self.check()
        alone = [b for b in tables[sid] if refs[b] == 1]
        missing = [b for b in alone if b not in free2]
        assert not missing, (f"{where}: sequence {sid} held block(s) {missing} alone; free must put them back on "
                             f"the free list")
        assert len(free2) == len(free) + len(alone), (
            f"{where}: freeing sequence {sid} should add exactly the {len(alone)} block(s) it held alone {alone} to "
            f"the free list, which went from {len(free)} to {len(free2)} blocks")
        self.unchanged(tables, tables2, sid)
        self.record(f"free {sid}")


def check_scripts(BlockManager, scripts, label):
    """Each script, (what, num_blocks, block_size, ops), on a fresh manager; ops are ("allocate", num_tokens),
    ("append", seq_id[, times]), ("fork", seq_id) or ("free", seq_id). Sequence ids count from 0 in the order
    sequences are created (a refused allocation uses one too). Each script's outcomes (Tracker.trace) are observed,
    also when an operation fails (up to it); the grader compares them with the solution's. Returns how many scripts
    passed."""
    own_block_manager(BlockManager)
    with checks.reference_forbidden("BlockManager", forbidden=ANSWER_KEY):
        for what, num_blocks, block_size, ops in scripts:
            t = Tracker(BlockManager, num_blocks, block_size, f"{label}{what}")
            try:
                for op, *args in ops:
                    getattr(t, op)(*args)
            finally:
                checks.observe(f"{label}{what}: the operations' outcomes", t.trace)
    return len(scripts)


def random_run(BlockManager, seed, num_blocks, block_size, n_ops, label):
    """Random operations, weighted like a server's: mostly decode steps, some admissions, forks and finishes."""
    rng = np.random.default_rng(seed)
    t = Tracker(BlockManager, num_blocks, block_size, f"{label}random run, seed {seed}")
    try:
        operate(t, rng, n_ops)
    finally:  # the outcomes up to a failure too; the grader compares them with the solution's
        checks.observe(f"{label}random run, seed {seed}: the operations' outcomes", t.trace)
    return t


def operate(t, rng, n_ops):  # n_ops random operations on the tracker's manager, then every sequence freed
    for _ in range(n_ops):
        live = sorted(t.seqs)
        r = rng.random()
        if not live or r < 0.15:
            t.allocate(int(rng.integers(1, 3 * t.block_size + 1)))
        elif r < 0.27 and len(live) < 8:
            t.fork(live[int(rng.integers(len(live)))])
        elif r < 0.35:
            t.free(live[int(rng.integers(len(live)))])
        else:
            t.append(live[int(rng.integers(len(live)))])
    for sid in sorted(t.seqs):  # everything finishes: the whole pool must be free again
        t.free(sid)


def check_random(BlockManager, runs, label):
    """Each run, (seed, num_blocks, block_size, n_ops), on a fresh manager; returns the copies-on-write and the
    preemptions they made, summed."""
    own_block_manager(BlockManager)
    copies = preemptions = 0
    with checks.reference_forbidden("BlockManager", forbidden=ANSWER_KEY):
        for seed, num_blocks, block_size, n_ops in runs:
            t = random_run(BlockManager, seed, num_blocks, block_size, n_ops, label)
            copies, preemptions = copies + t.copies, preemptions + t.preemptions
    return copies, preemptions
