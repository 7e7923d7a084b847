"""Lab 08's checks of a PrefixCache on its own, without the engine (autograder/labs/lab08/__init__.py runs them).

Each check drives the student's class through ``allocate``, ``register``, ``append_slot`` and ``free`` on
small pools, the way the engine would, and reads its state (``block_tables``, ``ref_count``, ``free_blocks``,
``evictable``, ``cached``, ``key_of``) after each step:

* ``reuse_scenario``: a prompt seen before reuses its cached blocks, never the block of its last token; a
  shared block is counted in both tables; ``can_allocate`` does not count a found evictable block twice.
* ``lru_scenario``: an eviction drops the keyed block freed longest ago (least recently used) first.
* ``random_ops``: random admissions, growth and frees of prompts that share prefixes, on a pool small enough
  to run out; ``check_invariants`` after every operation.

Each scenario observes what the student's cache answered (reused positions, yes/no answers, reference counts) and
that the invariants held; a hidden case observes its answers without the expected ones (the grader holds the
solution's, from the answer sheet) and its messages say what the cache gave, never what it should have.

``as_key`` and ``as_bool``, the strict conversions of a key and of a yes/no answer, ``expected`` and the lab's
``ANSWER_KEY`` live here too, for every file of the lab.
"""
from __future__ import annotations

import random

import numpy as np

from autograder import notebook_checks as checks

ANSWER_KEY = {  # this lab's answer key: any call into it while the tests run fails them
    "miniengine.kv.prefix_cache": ["block_key", "block_keys", "PrefixCachingBlockManager.__init__",
                                   "PrefixCachingBlockManager.num_free_blocks", "PrefixCachingBlockManager._take",
                                   "PrefixCachingBlockManager._release", "PrefixCachingBlockManager.match",
                                   "PrefixCachingBlockManager.can_allocate", "PrefixCachingBlockManager.allocate",
                                   "PrefixCachingBlockManager.register", "PrefixCachingBlockManager.hit_rate"],
    "miniengine.engine.scheduler": ["chunk_to_fit"]}


def expected(value, hidden):
    """observe's keywords: a visible case's expected value; none for a hidden one (the sheet holds the solution's)."""
    return {} if hidden else {"expect": value}


def said(text, hidden):
    """A message's statement of the expected value, left out of a hidden case's message."""
    return "" if hidden else text


def as_key(x, what):
    if not isinstance(x, bytes):
        raise AssertionError(f"{what}: expected bytes, got {type(x).__name__}")
    return bytes(x)  # a plain bytes object, whatever subclass came back


def as_bool(x, what):
    if not isinstance(x, (bool, np.bool_)):
        raise AssertionError(f"{what}: expected True or False, got {type(x).__name__} {x!r:.60}")
    return bool(x)


class Seq:
    """What the block manager sees of a sequence: an id and its tokens."""
    _next = 0  # ids count up across one test cell (this module is reloaded for each): the messages name them

    def __init__(self, tokens):
        Seq._next += 1
        self.seq_id, self.token_ids = Seq._next, [int(t) for t in tokens]

    @property
    def num_tokens(self):
        return len(self.token_ids)


def check_invariants(bm, where):
    """Reference counts match the tables; every block is in exactly one place; keyed blocks are where they belong."""
    holders = {}
    for sid, table in bm.block_tables.items():
        for b in table:
            holders[int(b)] = holders.get(int(b), 0) + 1
    free = [int(b) for b in bm.free_blocks]
    evictable = [int(b) for b in bm.evictable]
    key_of = {int(b): as_key(k, f"{where}: key_of[{b}]") for b, k in bm.key_of.items()}
    cached = {as_key(k, f"{where}: a key of cached"): int(b) for k, b in bm.cached.items()}
    assert len(set(free)) == len(free), f"{where}: a block is on the free list twice: {sorted(free)}"
    assert len(set(evictable)) == len(evictable), f"{where}: a block is in evictable twice"
    busy = sorted(set(free) & set(holders))
    assert not busy, f"{where}: block(s) {busy} are on the free list while a block table holds them"
    busy = sorted(set(evictable) & set(holders))
    assert not busy, f"{where}: block(s) {busy} are evictable while a block table holds them"
    both = sorted(set(free) & set(evictable))
    assert not both, f"{where}: block(s) {both} are both on the free list and evictable"
    lost = sorted(set(range(bm.num_blocks)) - set(free) - set(evictable) - set(holders))
    assert not lost, f"{where}: block(s) {lost} are neither free, nor evictable, nor in a table: they leaked"
    for b in range(bm.num_blocks):
        assert int(bm.ref_count[b]) == holders.get(b, 0), (
            f"{where}: block {b} is in {holders.get(b, 0)} block table(s), but ref_count[{b}] is {bm.ref_count[b]}")
    bad = sorted(b for b in evictable if b not in key_of)
    assert not bad, f"{where}: evictable block(s) {bad} have no key (an unkeyed free block belongs on the free list)"
    bad = sorted(b for b in free if b in key_of)
    assert not bad, f"{where}: block(s) {bad} on the free list still have a key"
    assert {b: k for k, b in cached.items()} == key_of, f"{where}: cached and key_of disagree"
    n = checks.as_count(bm.num_free_blocks, f"{where}: num_free_blocks")
    assert n == len(free) + len(evictable), (
        f"{where}: num_free_blocks is {n}, but {len(free)} blocks are free and {len(evictable)} evictable")


def _admit(bm, seq, block_size, where):
    """allocate + register of a sequence that can_allocate accepted; returns the positions it reused."""
    held = {int(b) for t in bm.block_tables.values() for b in t}
    reused = checks.as_count(bm.allocate(seq), where + ": allocate's return value")
    table = [int(b) for b in bm.block_tables[seq.seq_id]]
    assert reused % block_size == 0 and reused <= seq.num_tokens - 1, (
        f"{where}: allocate returned {reused} reused positions for a {seq.num_tokens}-token sequence: it "
        f"must be whole blocks, and never the block of the last token")
    fresh = table[reused // block_size:]
    stolen = sorted(set(fresh) & held)
    assert not stolen, f"{where}: allocate handed out block(s) {stolen}, which another table still holds"
    assert len(table) == -(-seq.num_tokens // block_size), f"{where}: the table has {len(table)} blocks"
    bm.register(seq, seq.num_tokens)
    return reused


def random_ops(PrefixCache, seed, num_blocks, block_size, steps, label, hidden=False):
    """Random admissions, growth and frees on a small pool, prompts sharing prefixes; invariants after each."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.choice([2, 3, 5]) * block_size)] for _ in range(4)]
    bm = PrefixCache(num_blocks, block_size)
    live, log = [], []
    hits = refusals = 0
    for step in range(steps):
        op = rng.random()
        where = f"{label}, operation {step}"
        if op < 0.45:
            seq = Seq(rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(0, 2 * block_size))])
            log.append(f"allocate a {seq.num_tokens}-token sequence {seq.seq_id}")
            if as_bool(bm.can_allocate(seq), where + ": can_allocate"):
                hits += _admit(bm, seq, block_size, where) > 0
                live.append(seq)
            else:
                refusals += 1
        elif op < 0.75 and live:
            seq = rng.choice(live)
            seq.token_ids.append(rng.randrange(1000))
            log.append(f"grow sequence {seq.seq_id} to {seq.num_tokens} tokens")
            if bm.can_append(seq):
                bm.append_slot(seq)
                bm.register(seq, seq.num_tokens)
            else:
                seq.token_ids.pop()
        elif live:
            seq = live.pop(rng.randrange(len(live)))
            log.append(f"free sequence {seq.seq_id}")
            bm.free(seq)
        try:
            check_invariants(bm, where)
        except AssertionError as e:
            raise AssertionError(f"{e}\n  last operations: " + "; ".join(log[-6:])) from None
    checks.observe(f"{label}: operations after which the invariants held", steps, **expected(steps, hidden))
    assert hits > steps // 20, f"{label}: only {hits} admissions reused a cached prefix; prompts shared prefixes"
    checks.observe(f"{label}: admissions that reused a cached prefix", hits, at_least=steps // 20 + 1)
    assert refusals > 0, f"{label}: the pool never ran out (the test's own check)"
    checks.observe(f"{label}: admissions can_allocate refused", refusals, at_least=1)
    return hits, refusals


def lru_scenario(PrefixCache, t, block_size, label, hidden=False):
    """Two prompts cached and freed, A before B; a third needs one evicted block: A's (least recently freed) goes."""
    bs = block_size
    a, b = t[:bs] + [t[4 * bs]], t[bs:2 * bs] + [t[4 * bs]]
    bm = PrefixCache(4, bs)
    sa, sb = Seq(a), Seq(b)
    for name, s in (("A", sa), ("B", sb)):
        got = checks.as_count(bm.allocate(s), f"{label}: allocate of a new prompt")
        assert got == 0, f"{label}: nothing is cached yet, but allocate returned {got} reused positions"
        checks.observe(f"{label}: allocate of {name} in an empty cache, positions reused", got, **expected(0, hidden))
        bm.register(s, s.num_tokens)
    bm.free(sa)
    bm.free(sb)
    check_invariants(bm, f"{label}, after freeing A then B")
    c = Seq(t[2 * bs:4 * bs] + [t[4 * bs]])  # three blocks: two plain free ones, then one eviction
    fits = as_bool(bm.can_allocate(c), label + ": can_allocate")
    assert fits, f"{label}: 2 free + 2 evictable blocks, {said('yet', hidden) or 'and'} can_allocate refused 3 blocks"
    checks.observe(f"{label}: can_allocate of 3 blocks with 2 free and 2 evictable", fits, **expected(True, hidden))
    bm.allocate(c)
    check_invariants(bm, f"{label}, after an allocation that had to evict")
    bm.free(c)
    got_b = checks.as_count(bm.allocate(Seq(b)), f"{label}: allocate")
    got_a = checks.as_count(bm.allocate(Seq(a)), f"{label}: allocate")
    assert (got_a, got_b) == (0, bs), (
        f"{label}: A was freed before B, so the eviction must drop A's block (least recently freed) and keep B's"
        + said(f": expected A to find 0 cached positions and B {bs}", hidden) + f", got A {got_a} and B {got_b}")
    checks.observe(f"{label}: positions A and B find cached after the eviction", [got_a, got_b],
                   **expected([0, bs], hidden))
    checks.observe(f"{label}: the invariants held at every step", True, expect=True)


def reuse_scenario(PrefixCache, t, block_size, label, hidden=False):
    """Reuse, the last token's block, shared blocks, and can_allocate counting found blocks that were free."""
    bs = block_size

    def reused(got, want, what, message):
        checks.observe(f"{label}: {what}, positions reused", got, **expected(want, hidden))
        assert got == want, f"{label}: {message}" + said(f": expected {want} reused positions", hidden) + f", got {got}"

    bm = PrefixCache(4, bs)
    s1 = Seq(t[:2 * bs])
    reused(checks.as_count(bm.allocate(s1), label + ": allocate"), 0, f"allocate of {2 * bs} tokens in an empty cache",
           "an empty cache found something")
    bm.register(s1, s1.num_tokens)
    bm.free(s1)
    check_invariants(bm, f"{label}, after a {2 * bs}-token sequence was registered and freed")
    s2 = Seq(t[:2 * bs])
    reused(checks.as_count(bm.allocate(s2), label + ": allocate"), bs, f"the same {2 * bs} tokens again",
           f"the same {2 * bs} tokens again: the block of the last token is computed again")
    bm.register(s2, s2.num_tokens)
    s3 = Seq(t[:2 * bs] + [t[3 * bs]])
    reused(checks.as_count(bm.allocate(s3), label + ": allocate"), 2 * bs, f"{2 * bs} cached tokens and one more",
           f"{2 * bs} cached tokens and one more: both full blocks are found")
    shared = [int(x) for x in bm.block_tables[s2.seq_id]][0]
    refs = checks.as_count(bm.ref_count[shared], label + ": ref_count")
    assert refs == 2, f"{label}: block {shared} is in two tables, its ref_count is {refs}"
    checks.observe(f"{label}: ref_count of a block two tables hold", refs, **expected(2, hidden))
    check_invariants(bm, f"{label}, after two sequences share a prefix")
    bm.free(s2)
    bm.free(s3)
    check_invariants(bm, f"{label}, after both sequences were freed")
    # now: the blocks of t[:bs] and t[bs:2bs] are keyed and evictable, the two others plain free blocks
    s4 = Seq(t[:2 * bs] + t[3 * bs:5 * bs] + [t[0]])  # 5 blocks: 2 found, 3 more needed, only 2 other blocks
    fits = as_bool(bm.can_allocate(s4), label + ": can_allocate")
    checks.observe(f"{label}: can_allocate of 5 blocks, 2 of them cached and evictable, in a pool of 4", fits,
                   **expected(False, hidden))
    assert not fits, (
        f"{label}: a 5-block sequence whose first 2 blocks are cached (and evictable), in a pool of 4: the 2 it finds "
        f"are counted among the free ones and cannot also be taken for its other 3 blocks"
        + said(", so can_allocate must say False", hidden) + ", yet it said True")
    s5 = Seq(t[:2 * bs] + t[3 * bs:4 * bs] + [t[0]])  # 4 blocks: 2 found, 2 more: fits exactly
    fits = as_bool(bm.can_allocate(s5), label + ": can_allocate")
    checks.observe(f"{label}: can_allocate of 4 blocks, 2 of them cached and evictable, in a pool of 4", fits,
                   **expected(True, hidden))
    assert fits, f"{label}: 2 cached blocks + 2 free blocks for a 4-block sequence: can_allocate said False"
    reused(checks.as_count(bm.allocate(s5), label + ": allocate"), 2 * bs, "the 4-block sequence",
           "the 4-block sequence finds its 2 cached blocks")
    check_invariants(bm, f"{label}, after reusing two evictable blocks")
    checks.observe(f"{label}: the invariants held at every step", True, expect=True)
