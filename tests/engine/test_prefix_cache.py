"""Automatic prefix caching (miniengine/kv/prefix_cache.py): keys, sharing, eviction, and the invariant."""
from __future__ import annotations

import random

import pytest

from miniengine import LLM, SamplingParams
from miniengine.kv.prefix_cache import PrefixCachingBlockManager, block_keys

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def test_a_key_changes_whenever_any_earlier_token_changes():
    tokens = list(range(100, 140))
    keys = block_keys(tokens, 8)
    assert len(keys) == 5 and len(set(keys)) == 5
    assert block_keys(tokens + [1, 2, 3], 8) == keys  # a partly filled block has no key
    for i in range(len(tokens)):
        changed = tokens[:i] + [tokens[i] + 1] + tokens[i + 1:]
        other = block_keys(changed, 8)
        first = i // 8
        assert other[:first] == keys[:first]  # blocks before the change are the same blocks
        assert all(a != b for a, b in zip(other[first:], keys[first:]))  # every block from it on differs
    # the same tokens at other positions are other K/V: block 1 of one sequence is not block 0 of another
    assert block_keys(tokens[8:16], 8)[0] != keys[1]


class Seq:
    _next = 0

    def __init__(self, tokens):
        Seq._next += 1
        self.seq_id, self.token_ids = Seq._next, list(tokens)

    @property
    def num_tokens(self):
        return len(self.token_ids)


def check_invariants(bm: PrefixCachingBlockManager):
    holders = {}
    for table in bm.block_tables.values():
        for b in table:
            holders[b] = holders.get(b, 0) + 1
    free, evictable = set(bm.free_blocks), set(bm.evictable)
    assert len(free) == len(bm.free_blocks), "a block is on the free list twice"
    assert not free & evictable and not (free | evictable) & set(holders), "a block in a table is also free"
    assert free | evictable | set(holders) == set(range(bm.num_blocks)), "a block was lost"
    for b in range(bm.num_blocks):
        assert bm.ref_count[b] == holders.get(b, 0), f"block {b}: count {bm.ref_count[b]}, {holders.get(b, 0)} tables"
    assert evictable <= set(bm.key_of) and not free & set(bm.key_of), "keyed blocks and the free list are mixed up"
    assert {bm.cached[k]: k for k in bm.cached} == bm.key_of, "the two key maps disagree"


def test_evicted_blocks_are_never_handed_out_while_referenced():
    """Random admissions, growth and frees on a small pool, with prompts that share prefixes: the invariants
    hold after every operation, and a block handed to a sequence is never one that another table holds."""
    rng = random.Random(0)
    prefixes = [[rng.randrange(1000) for _ in range(rng.choice([8, 12, 20]))] for _ in range(4)]
    bm = PrefixCachingBlockManager(num_blocks=24, block_size=4)
    live: list[Seq] = []
    hits = evictions_possible = 0
    for step in range(600):
        op = rng.random()
        if op < 0.45:
            seq = Seq(rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(0, 7))])
            if bm.can_allocate(seq):
                held = {b for t in bm.block_tables.values() for b in t}
                reused = bm.allocate(seq)
                table = bm.block_tables[seq.seq_id]
                fresh = table[reused // 4:]
                assert not set(fresh) & held, f"step {step}: a new block was already in a table"
                assert reused <= seq.num_tokens - 1 and reused % 4 == 0
                hits += reused > 0
                bm.register(seq, seq.num_tokens)
                live.append(seq)
            else:
                evictions_possible += 1
        elif op < 0.75 and live:
            seq = rng.choice(live)
            seq.token_ids.append(rng.randrange(1000))
            if bm.can_append(seq):
                bm.append_slot(seq)
                bm.register(seq, seq.num_tokens)
            else:
                seq.token_ids.pop()
        elif live:
            seq = live.pop(rng.randrange(len(live)))
            bm.free(seq)
        check_invariants(bm)
    assert hits > 50 and evictions_possible > 10  # the run really shared prefixes and ran out of memory


def test_a_fully_cached_sequence_still_feeds_its_last_token():
    bm = PrefixCachingBlockManager(num_blocks=8, block_size=4)
    a = Seq(range(8))
    bm.allocate(a)
    bm.register(a, 8)
    bm.free(a)
    b = Seq(range(8))
    assert bm.allocate(b) == 4  # block 1 holds the last token: it is computed again
    c = Seq(range(9))
    bm.register(b, 8)
    assert bm.allocate(c) == 8


@pytest.mark.parametrize("block_size, kv_cache_tokens", [(4, 4096), (16, 4096), (4, 320)])
def test_golden_cases_stay_exact_with_the_prefix_cache(golden, block_size, kv_cache_tokens):
    """Every visible golden case, served twice by one engine: the second time most prompts come from the
    cache; with 320 positions, sequences are preempted and cached blocks evicted along the way."""
    cases = golden["cases"]
    llm = LLM(enable_prefix_caching=True, block_size=block_size, kv_cache_tokens=kv_cache_tokens)
    for round_ in range(2):
        outs = llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
        for c, o in zip(cases, outs):
            assert o.token_ids == c["token_ids"], (round_, c["name"])
    bm = llm.engine.kv.block_manager
    assert bm.hit_tokens > 0
    check_invariants(bm)
    assert not bm.block_tables  # everything finished: every block is free or evictable


def test_a_shared_system_prompt_is_prefilled_once(target):
    system = list(range(300, 348))  # 48 tokens: three blocks of 16
    prompts = [system + [500 + i, 600 + i] for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=4)
    plain = LLM(model=target).generate(prompts, params)
    llm = LLM(model=target, enable_prefix_caching=True)
    first = llm.generate(prompts[:1], params)
    rest = llm.generate(prompts[1:], params)
    assert [o.token_ids for o in first + rest] == [o.token_ids for o in plain]
    # the first request fed its 50 prompt tokens and 3 generated ones; the others found the 48 system tokens
    assert first[0].tokens_processed == 50 + 3
    assert [o.tokens_processed for o in rest] == [2 + 3, 2 + 3]


@pytest.mark.parametrize("kwargs, words", [
    (dict(enable_prefix_caching=True, kv_layout="contiguous"), "needs the course's paged KV layout"),
    (dict(enable_prefix_caching="yes"), "enable_prefix_caching must be True or False"),
])
def test_bad_prefix_caching_settings_are_named(kwargs, words, target):
    with pytest.raises(ValueError, match=words):
        LLM(model=target, **kwargs)


def test_bench_serve_shared_prefix_prints_its_table_and_summary_line():
    """The benchmark itself (its numbers are measurements, not assertions): a short run, every field there."""
    import re
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "miniengine", "bench", "serve", "--shared-prefix", "48", "--requests", "6",
                        "--mean-new-tokens", "4", "--output-sigma", "0.1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert "same tokens with and without the cache: True" in lines
    assert re.fullmatch(r"prefix cache: prefill tokens saved \d+\.\d%, TTFT P50 \d+\.\dx lower", lines[-1]), lines[-1]
    off, on = (int(next(l for l in lines if l.startswith(k)).split()[1]) for k in ("off ", "on "))
    assert on < off  # five of the six requests find the 48-token system prompt (three blocks) in the cache
