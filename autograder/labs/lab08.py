"""Lab 08's tests: prefix caching and chunked prefill. What each test cell checks, task by task.

Every test runs with this lab's answer key forbidden (``ANSWER_KEY``: the course's own prefix cache and chunking
rule): a call into it, under any name, fails the test. Your functions and your class are passed in by the cells.

Task 1, ``block_key`` and ``block_keys`` (keys-visible, keys-hidden), on random tokens and a random parent key:
  ``block_key(parent, tokens)`` is SHA-256 of the parent key followed by the tokens as int64 bytes (the test
  computes the task's formula with hashlib); ``block_keys`` keys the full blocks only, each chained with the one
  before it: a partial block has no key, and changing any token changes the key of its block and of every later
  block, never of an earlier one; a block's tokens after another prefix get another key.

Task 2, ``PrefixCache`` on its own (cache-visible, cache-hidden; the checks are in lab08_cache.py): reuse of a
  cached prefix (never the block of the last token), shared blocks, ``can_allocate`` counting what it finds,
  the eviction order (least recently freed first), and random admissions, growth and frees on a small pool,
  with the invariants checked after every operation: each block free, evictable or in tables, exactly once;
  reference counts that match the tables; every evictable block keyed, no free-list block keyed.

  ``PrefixCache`` on the engine (engine-visible, engine-hidden): the course's engine on your cache first serves
  decoys (each prompt one block later, after filler: the same tokens at other positions, with other K/V), then
  the golden requests twice, in a roomy pool and in tight ones; then the invariants hold and no table is left.
  Visible: the golden tokens in every round, and fewer tokens fed in the roomy pool's second round. Hidden: every
  round of every pool repeats the roomy pool's first round, and the grader compares the roomy pool's second round
  with hidden golden tokens.

Task 3, ``chunk`` (chunk-visible, chunk-hidden): ``chunk(seq, tokens_left, max_chunk)`` is
  ``min(tokens to feed, tokens_left, max_chunk)``, an int, on hand-made sequences; then the course's engine, fed
  in chunks by your rule, serves the golden requests (visible) or hidden ones (the grader compares them), with
  some prompts actually cut.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import random
from types import SimpleNamespace

import numpy as np

from autograder import notebook_checks as checks
from autograder.labs import lab08_cache
from miniengine import LLM, SamplingParams
from miniengine.kv import PagedKV
from miniengine.kv.block_manager import BlockManager as CourseBlockManager

lab08_cache = importlib.reload(lab08_cache)  # `pristine` reloads this file only: its part afresh too
from autograder.labs.lab08_cache import as_key, check_invariants, lru_scenario, random_ops, reuse_scenario  # noqa: E402

ANSWER_KEY = {  # this lab's answer key: any call into it while the tests run fails them
    "miniengine.kv.prefix_cache": ["block_key", "block_keys", "PrefixCachingBlockManager.__init__",
                                   "PrefixCachingBlockManager.num_free_blocks", "PrefixCachingBlockManager._take",
                                   "PrefixCachingBlockManager._release", "PrefixCachingBlockManager.match",
                                   "PrefixCachingBlockManager.can_allocate", "PrefixCachingBlockManager.allocate",
                                   "PrefixCachingBlockManager.register", "PrefixCachingBlockManager.hit_rate"],
    "miniengine.engine.scheduler": ["chunk_to_fit"]}


# ---------------------------------------------------------------- Task 1: the chained block key

def sha_key(parent, tokens):
    """The task's formula, computed here with hashlib: SHA-256 of the parent key, then the tokens as int64."""
    return hashlib.sha256(bytes(parent) + np.asarray(list(tokens), dtype=np.int64).tobytes()).digest()


def as_keys(xs, what):
    if not isinstance(xs, list):
        raise AssertionError(f"{what}: expected a list of keys, got {type(xs).__name__}")
    return [as_key(x, f"{what}[{i}]") for i, x in enumerate(xs)]


def check_keys(block_key, block_keys, seed, block_size, length, label):
    """One case: `length` random tokens and a random parent key, drawn from random.Random(seed)."""
    rng = random.Random(seed)
    tokens = [rng.randrange(4096) for _ in range(length)]
    parent = bytes(rng.randrange(256) for _ in range(32))
    got = as_key(block_key(parent, tokens[:block_size]), f"{label}: block_key")
    assert got == sha_key(parent, tokens[:block_size]), f"{label}: block_key(parent, tokens) is not SHA-256(parent + int64 tokens)"
    got = as_key(block_key(b"", tokens[:block_size]), f"{label}: block_key")
    assert got == sha_key(b"", tokens[:block_size]), f"{label}: block_key(b'', tokens) is not SHA-256(int64 tokens)"
    keys = as_keys(block_keys(tokens, block_size), f"{label}: block_keys")
    n = length // block_size
    assert len(keys) == n, f"{label}: {length} tokens in blocks of {block_size} make {n} full blocks, got {len(keys)} keys"
    want, p = [], b""
    for i in range(n):
        p = sha_key(p, tokens[i * block_size:(i + 1) * block_size])
        want.append(p)
    for i in range(n):
        assert keys[i] == want[i], (f"{label}: key {i} is not SHA-256(key {i - 1} + the int64 tokens of block {i})"
                                    if i else f"{label}: key 0 is not SHA-256(b'' + the int64 tokens of block 0)")
    assert as_keys(block_keys(tokens[:n * block_size], block_size), label) == keys, f"{label}: keys depend on a partial block"
    assert as_keys(block_keys(tokens[:block_size - 1], block_size), label) == [], f"{label}: a partial block has no key"
    for i in rng.sample(range(n * block_size), min(12, n * block_size)):
        changed = tokens[:i] + [(tokens[i] + 1) % 4096] + tokens[i + 1:]
        other = as_keys(block_keys(changed, block_size), label)
        first = i // block_size
        assert other[:first] == keys[:first], f"{label}: changing token {i} changed the key of an earlier block"
        same = [j for j in range(first, n) if other[j] == keys[j]]
        assert not same, (f"{label}: changing token {i} (block {first}) left the key of block(s) {same} unchanged: "
                          f"every key from block {first} on depends on it through the chain")
    if n >= 2:  # the same tokens after another prefix are other K/V
        assert as_keys(block_keys(tokens[block_size:2 * block_size], block_size), label)[0] != keys[1], (
            f"{label}: block 1's tokens alone got block 1's key: the key must include the blocks before it")
    return n


def check_block_keys(block_key, block_keys, cases, prefix=""):
    """Task 1's test: cases are (seed, block size, length); prefix starts each message (a hidden cell's)."""
    checks.require_own(block_key, "block_key")
    checks.require_own(block_keys, "block_keys")
    with checks.reference_forbidden("block_key and block_keys", forbidden=ANSWER_KEY):
        for seed, bs, length in cases:
            check_keys(block_key, block_keys, seed, bs, length, f"{prefix}{length} tokens, blocks of {bs}")


# ---------------------------------------------------------------- Task 2: PrefixCache, alone and on the engine

def own_prefix_cache(PrefixCache):
    """The class is the student's: defined in the notebook, on top of the course's BlockManager and nothing else."""
    assert isinstance(PrefixCache, type) and PrefixCache.__module__ == "__main__", (
        "PrefixCache must be a class defined with class in this notebook")
    assert issubclass(PrefixCache, CourseBlockManager), "PrefixCache must subclass miniengine's BlockManager"
    assert all(c.__module__ == "__main__" or c.__module__ == "miniengine.kv.block_manager" or c is object
               for c in PrefixCache.__mro__), "PrefixCache may inherit only from miniengine.kv.block_manager.BlockManager"


def check_prefix_cache(PrefixCache, seed, reuse, lru, random_runs):
    """The cache alone. reuse and lru: (block size, label), each on 80 tokens drawn from random.Random(seed), reuse's
    first; random_runs: (seed, blocks, block size, operations, label). Returns each random run's (hits, refusals)."""
    own_prefix_cache(PrefixCache)
    with checks.reference_forbidden("your PrefixCache", forbidden=ANSWER_KEY):
        rng = random.Random(seed)
        reuse_scenario(PrefixCache, [rng.randrange(4096) for _ in range(80)], *reuse)
        lru_scenario(PrefixCache, [rng.randrange(4096) for _ in range(80)], *lru)
        return [random_ops(PrefixCache, *run) for run in random_runs]


def visible_golden():
    """The visible golden requests (prompts, parameters and the golden tokens), read from the file."""
    return json.loads(checks.VISIBLE_GOLDEN.read_text())["cases"]


def generate(llm, cases):
    return llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])


def golden_tokens(outs, what):
    return [checks.as_tokens(o.token_ids, f"{what}, request {i}: token_ids") for i, o in enumerate(outs)]


def check_golden(got, case, where):
    """got (plain ints) must be the case's golden tokens; the message shows the first step that differs."""
    want = case["token_ids"]
    t = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert got == want, (f"{where}: tokens differ from the golden ones at step {t}: "
                         f"got {got[t:t + 3]}, expected {want[t:t + 3]}")


def serve_twice(PrefixCache, model, cases, num_blocks, block_size, label):
    """One engine on your PrefixCache serves decoys, then the cases, then the same cases again (mostly from the cache)."""
    kv = PagedKV(model.config, num_blocks, block_size, block_manager=PrefixCache(num_blocks, block_size))
    llm = LLM(model=model, kv=kv)
    # First, decoys: each prompt again, one block later, after a block of filler. Their blocks hold the same tokens at
    # other positions, with other K/V: a key that forgot the blocks before it would hand them to the real prompts.
    decoys = [[3] * block_size + list(c["prompt_token_ids"]) for c in cases]
    llm.generate(decoys, SamplingParams(temperature=0, max_tokens=1))
    rounds, fed = [], []
    for r in range(2):
        outs = generate(llm, cases)
        rounds.append(golden_tokens(outs, f"{label}, round {r + 1}"))
        fed.append(sum(checks.as_count(o.tokens_processed, "tokens_processed") for o in outs))
    bm = kv.block_manager
    check_invariants(bm, f"{label}, after both rounds")
    assert not bm.block_tables, f"{label}: every request finished, yet sequences {sorted(bm.block_tables)} hold tables"
    return rounds, fed, kv


def check_savings(fed, label):
    assert fed[1] < fed[0], (f"{label}: round 2 repeated round 1's prompts, yet fed {fed[1]} tokens through the model "
                             f"against {fed[0]}: allocate should find the cached prefixes")


def check_engine_golden(PrefixCache, cases, pools):
    """Visible: in each pool (blocks, block size), both rounds give the golden tokens; a roomy pool saves work."""
    own_prefix_cache(PrefixCache)
    model = checks.load_model()
    with checks.reference_forbidden("your PrefixCache on the engine", forbidden=ANSWER_KEY):
        for num_blocks, block_size in pools:
            label = f"visible golden cases, {num_blocks} blocks of {block_size}"
            rounds, fed, kv = serve_twice(PrefixCache, model, cases, num_blocks, block_size, label)
            for r, tokens in enumerate(rounds):
                for c, got in zip(cases, tokens):
                    check_golden(got, c, f"{label}, round {r + 1}, {c['name']}")
            if num_blocks * block_size >= 4096:  # room for everything: round 2 must find round 1's blocks
                check_savings(fed, label)
            print(f"{label}: exact twice; round 2 fed {fed[1]} tokens against {fed[0]}")


def engine_hidden(PrefixCache, report, pools):
    """Hidden: every round of every pool repeats the first (roomy) pool's round 1, which must save work in round 2;
    its round 2 goes into the report, for the grader to compare with the hidden golden tokens."""
    own_prefix_cache(PrefixCache)
    model = checks.load_model()
    with checks.reference_forbidden("your PrefixCache on the engine", forbidden=ANSWER_KEY):
        cases = report.cases("golden")
        runs, fed = {}, {}
        for num_blocks, block_size in pools:
            label = f"hidden cases, {num_blocks} blocks of {block_size}"
            runs[label], fed[label], _ = serve_twice(PrefixCache, model, cases, num_blocks, block_size, label)
        (first_label, first), *others = runs.items()
        for label, rounds in [(first_label, first[1:])] + others:
            for r, tokens in enumerate(rounds):
                for c, a, b in zip(cases, first[0], tokens):
                    assert a == b, (f"{label}, round {r + 1}, {c['name']}: other tokens than {first_label}, round 1: a block "
                                    f"reused from the cache held K/V of other tokens (or was handed out while still in use)")
        check_savings(fed[first_label], first_label)
        for c, tokens in zip(cases, first[1]):
            report.add("golden", c, "token_ids", tokens)


# ---------------------------------------------------------------- Task 3: the chunking rule

def check_rule(rule, label, max_chunk):
    """chunk(seq, tokens_left, max_chunk) on hand-made sequences, against the formula the task states."""
    for new in (1, 2, max_chunk - 1, max_chunk, max_chunk + 1, 3 * max_chunk + 2):
        for left in (0, 1, max_chunk - 1, max_chunk, 2 * max_chunk, 1000):
            if new < 1 or left < 0:
                continue
            seq = SimpleNamespace(num_new_tokens=new, num_tokens=new + 5, num_cached_tokens=5)
            got = rule(seq, left, max_chunk)
            if isinstance(got, bool) or not isinstance(got, (int, np.integer)):
                raise AssertionError(f"{label}: chunk returned {type(got).__name__} {got!r:.40}, expected an int")
            want = min(new, left, max_chunk)
            assert int(got) == want, (f"{label}: chunk(seq with {new} tokens to feed, tokens_left={left}, "
                                      f"max_chunk={max_chunk}) returned {int(got)}, expected {want}")


def chunked_engine(chunk, model, max_chunk, budget):
    """The course's paged engine, fed by your chunk rule; counts the chunks that left part of a prompt for later."""
    cut = []

    def rule(seq, tokens_left):
        n = chunk(seq, tokens_left, max_chunk)
        cut.append(isinstance(n, (int, np.integer)) and 0 < n < seq.num_new_tokens)
        return n

    return LLM(model=model, enable_chunked_prefill=rule, max_num_batched_tokens=budget), cut


def check_chunk_golden(chunk, max_chunks, cases, runs):
    """Visible: the rule for each max_chunk, then the engine for each run (max_chunk, budget) gives the golden tokens."""
    checks.require_own(chunk, "chunk")
    model = checks.load_model()
    with checks.reference_forbidden("your chunk rule", forbidden=ANSWER_KEY):
        for m in max_chunks:
            check_rule(chunk, f"max_chunk={m}", m)
        for max_chunk, budget in runs:
            label = f"visible golden cases, chunks of at most {max_chunk}, budget {budget}"
            llm, cut = chunked_engine(chunk, model, max_chunk, budget)
            for c, got in zip(cases, golden_tokens(generate(llm, cases), label)):
                check_golden(got, c, f"{label}, {c['name']}")
            assert any(cut), f"{label}: no prompt was cut into chunks (the test's own check)"
            print(f"{label}: exact; {sum(cut)} chunks left part of a prompt for a later step")


def chunk_hidden(chunk, report, max_chunks, run):
    """Hidden: the rule for each max_chunk, then one engine run (max_chunk, budget), its tokens into the report."""
    checks.require_own(chunk, "chunk")
    model = checks.load_model()
    with checks.reference_forbidden("your chunk rule", forbidden=ANSWER_KEY):
        for m in max_chunks:
            check_rule(chunk, f"hidden case: max_chunk={m}", m)
        cases = report.cases("golden")
        max_chunk, budget = run
        label = f"hidden cases, chunks of at most {max_chunk}, budget {budget}"
        llm, cut = chunked_engine(chunk, model, max_chunk, budget)
        outs = generate(llm, cases)
        assert any(cut), f"{label}: no prompt was cut into chunks (the test's own check)"
        for c, got in zip(cases, golden_tokens(outs, label)):
            report.add("golden", c, "token_ids", got)
