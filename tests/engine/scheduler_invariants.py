"""Checks the scheduler tests run after every engine step: the scheduler's invariants and the KV memory's
accounting, for either layout."""
from collections import Counter

import numpy as np

from miniengine import SamplingParams
from miniengine.engine import TraceRequest
from miniengine.engine.scheduler import fcfs_key
from miniengine.kv import ContiguousKV, PagedKV
from miniengine.timeline import VirtualClock  # noqa: F401  the tests import it from here


class Invariants:
    """Wraps an engine's scheduler and checks the invariants after every step: no request lost or duplicated,
    the budgets kept, a finished request leaves at its step, first-come first-served admission and queue order,
    and the KV memory's accounting (for the paged layout: no leaked block, reference counts, free + used)."""

    def __init__(self, engine):
        self.engine, self.sched = engine, engine.scheduler
        self.added, self.finished, self.steps, self.waited = [], set(), 0, {}
        add, schedule, postprocess = engine.add_request, self.sched.schedule, self.sched.postprocess

        def add_request(*a, **k):
            seq = add(*a, **k)
            self.added.append(seq)
            return seq

        def checked_schedule(now=0.0):
            self.head = [s.seq_id for s in self.sched.waiting]
            batch = schedule(now)
            self.batch = batch
            return batch

        def checked_postprocess(batch, tokens):
            done = postprocess(batch, tokens)
            self.check(batch, done)
            return done

        engine.add_request, self.sched.schedule, self.sched.postprocess = add_request, checked_schedule, checked_postprocess

    def check(self, batch, done):
        s, c = self.sched, self.engine.config
        self.steps += 1
        live = [q.seq_id for q in s.waiting] + [q.seq_id for q in s.running]
        assert len(live) == len(set(live)), "a request is queued twice"
        self.finished |= {q.seq_id for q in done}
        assert not self.finished & set(live), "a finished request is still queued"
        everyone = {q.seq_id for a in self.added for q in a.completions}  # n > 1: the forks too
        assert set(live) | self.finished == everyone, "a request was lost"
        assert len(batch.seqs) <= min(c.max_num_seqs, getattr(s.policy, "max_num_seqs", None) or c.max_num_seqs)
        assert batch.num_tokens <= c.max_num_batched_tokens
        for q in batch.seqs:  # a request leaves exactly at the step whose token stops it
            last, p = q.token_ids[-1], q.params
            stops = (last == s.eos_token_id and not p.ignore_eos) or len(q.output_token_ids) >= p.max_tokens
            assert stops == q.is_finished == (q in done), q
        prefilled = [q.seq_id for q in batch.seqs if q.seq_id in self.head]  # waiting before, running now
        assert prefilled == self.head[:len(prefilled)], "a later request was admitted before an earlier one"
        keys = [fcfs_key(q) for q in s.waiting]  # preempted sequences come back in their arrival order
        assert keys == sorted(keys), "the waiting queue lost its order"
        check_kv_accounting(self.engine.kv, s.running, f"step {self.steps}")
        for q in s.waiting:
            self.waited[q.seq_id] = self.waited.get(q.seq_id, 0) + 1


def poisson_trace(cases, rate, seed):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, len(cases)))
    order = rng.permutation(len(cases))
    return [TraceRequest(float(a), cases[i]["prompt_token_ids"], SamplingParams(**cases[i]["params"]), request_id=int(i))
            for a, i in zip(arrivals, order)]


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
        stored = getattr(q, "num_cached_tokens", q.num_tokens)  # an engine Sequence, or a bare (seq_id, num_tokens)
        assert len(tables[q.seq_id]) * bm.block_size >= stored, f"{where}: {q} outgrew its table"
