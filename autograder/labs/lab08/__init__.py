"""Lab 08's tests: prefix caching and chunked prefill. What each test cell checks, task by task.

Every test runs with this lab's answer key forbidden (``ANSWER_KEY``: the course's own prefix cache and chunking
rule): a call into it, under any name, fails the test. Your functions and your class are passed in by the cells.
Every check also observes what your code gave (keys as hex, reused positions, answers, tokens, counts): the grader
compares them with the answer sheet outside your kernel, a hidden case's with the solution's (autograder/grade/sheets.py).

Task 1, ``block_key`` and ``block_keys`` (keys-visible, keys-hidden; the checks are in lab08/keys.py), on random
  tokens and a random parent key: ``block_key(parent, tokens)`` is SHA-256 of the parent key followed by the tokens
  as int64 bytes (the test computes the task's formula with hashlib); ``block_keys`` keys the full blocks only, each
  chained with the one before it: a partial block has no key, and changing any token changes the key of its block
  and of every later block, never of an earlier one; a block's tokens after another prefix get another key.

Task 2, ``PrefixCache`` on its own (cache-visible, cache-hidden; the checks are in lab08/cache.py): reuse of a
  cached prefix (never the block of the last token), shared blocks, ``can_allocate`` counting what it finds,
  the eviction order (least recently freed first), and random admissions, growth and frees on a small pool,
  with the invariants checked after every operation: each block free, evictable or in tables, exactly once;
  reference counts that match the tables; every evictable block keyed, no free-list block keyed.

  ``PrefixCache`` on the engine (engine-visible, engine-hidden): the course's engine on your cache first serves
  decoys (each prompt one block later, after filler: the same tokens at other positions, with other K/V), then
  the golden requests twice, in a roomy pool and in tight ones; then the invariants hold and no table is left.
  Visible: the golden tokens in every round, and fewer tokens fed in the roomy pool's second round. Hidden: every
  round of every pool repeats the roomy pool's first round (all observed, for the grader), and the grader compares
  the roomy pool's second round with hidden golden tokens.

Task 3, ``chunk`` (chunk-visible, chunk-hidden): ``chunk(seq, tokens_left, max_chunk)`` is
  ``min(tokens to feed, tokens_left, max_chunk)``, an int, on hand-made sequences; then the course's engine, fed
  in chunks by your rule, serves the golden requests (visible) or hidden ones (the grader compares them), with
  some prompts actually cut.
"""
from __future__ import annotations

import importlib
import json
import random
from types import SimpleNamespace

import numpy as np

from autograder import notebook_checks as checks
from autograder.labs.lab08 import cache as lab08_cache, keys as lab08_keys
from miniengine import LLM, SamplingParams
from miniengine.kv import PagedKV
from miniengine.kv.block_manager import BlockManager as CourseBlockManager

# `pristine` reloads this file only: its parts afresh too, lab08_cache first (lab08_keys imports from it)
lab08_cache = importlib.reload(lab08_cache)
lab08_keys = importlib.reload(lab08_keys)
from autograder.labs.lab08.cache import (ANSWER_KEY, as_key, check_invariants, expected, lru_scenario, random_ops,  # noqa: E402
                                         reuse_scenario, said)
from autograder.labs.lab08.keys import as_keys, check_block_keys, check_keys, sha_key  # noqa: E402, F401

# ---------------------------------------------------------------- Task 2: PrefixCache, alone and on the engine

def own_prefix_cache(PrefixCache):
    """The class is the student's: defined in the notebook, on top of the course's BlockManager and nothing else."""
    assert isinstance(PrefixCache, type) and PrefixCache.__module__ == "__main__", (
        "PrefixCache must be a class defined with class in this notebook")
    assert issubclass(PrefixCache, CourseBlockManager), "PrefixCache must subclass miniengine's BlockManager"
    assert all(c.__module__ == "__main__" or c.__module__ == "miniengine.kv.block_manager" or c is object
               for c in PrefixCache.__mro__), "PrefixCache may inherit only from miniengine.kv.block_manager.BlockManager"


def check_prefix_cache(PrefixCache, seed, reuse, lru, random_runs, hidden=False):
    """The cache alone. reuse and lru: (block size, label), each on 80 tokens drawn from random.Random(seed), reuse's
    first; random_runs: (seed, blocks, block size, operations, label). Returns each random run's (hits, refusals).
    hidden: the cache's answers are observed without the expected ones, and the messages do not state them."""
    own_prefix_cache(PrefixCache)
    with checks.reference_forbidden("your PrefixCache", forbidden=ANSWER_KEY):
        rng = random.Random(seed)
        reuse_scenario(PrefixCache, [rng.randrange(4096) for _ in range(80)], *reuse, hidden=hidden)
        lru_scenario(PrefixCache, [rng.randrange(4096) for _ in range(80)], *lru, hidden=hidden)
        return [random_ops(PrefixCache, *run, hidden=hidden) for run in random_runs]


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
    checks.observe(f"{where}: tokens", got, expect=want)


def serve_twice(PrefixCache, model, cases, num_blocks, block_size, label):
    """One engine on your PrefixCache serves decoys, then the cases, then the same cases again (mostly from the cache).
    Observes that the invariants held and how many tables are left; returns each round's tokens and tokens fed."""
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
    checks.observe(f"{label}: the invariants held after both rounds", True, expect=True)
    left = sorted(int(s) for s in bm.block_tables)
    assert not left, f"{label}: every request finished, yet sequences {left} hold tables"
    checks.observe(f"{label}: sequences holding a table after both rounds", len(left), expect=0)
    return rounds, fed


def check_savings(fed, label):
    """Round 2 repeats round 1's prompts: the engine (the course's, counting what it feeds) must feed fewer tokens."""
    assert fed[1] < fed[0], (f"{label}: round 2 repeated round 1's prompts, yet fed {fed[1]} tokens through the model "
                             f"against {fed[0]}: allocate should find the cached prefixes")
    checks.observe(f"{label}: tokens fed in round 1 less those fed in round 2", fed[0] - fed[1], at_least=1)


def check_engine_golden(PrefixCache, cases, pools):
    """Visible: in each pool (blocks, block size), both rounds give the golden tokens; a roomy pool saves work."""
    own_prefix_cache(PrefixCache)
    model = checks.load_model()
    with checks.reference_forbidden("your PrefixCache on the engine", forbidden=ANSWER_KEY):
        for num_blocks, block_size in pools:
            label = f"visible golden cases, {num_blocks} blocks of {block_size}"
            rounds, fed = serve_twice(PrefixCache, model, cases, num_blocks, block_size, label)
            for r, tokens in enumerate(rounds):
                for c, got in zip(cases, tokens):
                    check_golden(got, c, f"{label}, round {r + 1}, {c['name']}")
            if num_blocks * block_size >= 4096:  # room for everything: round 2 must find round 1's blocks
                check_savings(fed, label)
            print(f"{label}: exact twice; round 2 fed {fed[1]} tokens against {fed[0]}")


def report_engine(PrefixCache, report, pools):
    """Hidden: every round of every pool repeats the first (roomy) pool's round 1, which must save work in round 2;
    every round's tokens are observed (the grader compares them with the solution's, outside the kernel), and the
    roomy pool's round 2 goes into the report, for the grader to compare with the hidden golden tokens."""
    own_prefix_cache(PrefixCache)
    model = checks.load_model()
    with checks.reference_forbidden("your PrefixCache on the engine", forbidden=ANSWER_KEY):
        cases = report.cases("golden")
        runs, fed = {}, {}
        for num_blocks, block_size in pools:
            label = f"hidden cases, {num_blocks} blocks of {block_size}"
            runs[label], fed[label] = serve_twice(PrefixCache, model, cases, num_blocks, block_size, label)
        (first_label, first), *others = runs.items()
        for label, rounds in [(first_label, first[1:])] + others:
            for r, tokens in enumerate(rounds):
                for c, a, b in zip(cases, first[0], tokens):
                    assert a == b, (f"{label}, round {r + 1}, {c['name']}: other tokens than {first_label}, round 1: a block "
                                    f"reused from the cache held K/V of other tokens (or was handed out while still in use)")
        for label, rounds in runs.items():
            for r, tokens in enumerate(rounds):
                for c, got in zip(cases, tokens):
                    checks.observe(f"{label}, round {r + 1}, {c['name']}: tokens", got)
        check_savings(fed[first_label], first_label)
        for c, tokens in zip(cases, first[1]):
            report.add("golden", c, "token_ids", tokens)


# ---------------------------------------------------------------- Task 3: the chunking rule

def check_rule(rule, label, max_chunk, hidden=False):
    """chunk(seq, tokens_left, max_chunk) on hand-made sequences, against the formula the task states; observes
    every answer, in order (a hidden case's without the formula's: the grader holds the solution's)."""
    got_all, want_all = [], []
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
                                      f"max_chunk={max_chunk}) returned {int(got)}"
                                      + (", not min(tokens to feed, tokens_left, max_chunk)" if hidden else
                                         f", expected {want}"))
            got_all.append(int(got))
            want_all.append(want)
    checks.observe(f"{label}: chunk on the hand-made sequences, in order", got_all, **expected(want_all, hidden))


def chunked_engine(chunk, model, max_chunk, budget):
    """The course's paged engine, fed by your chunk rule; counts the chunks that left part of a prompt for later."""
    cut = []

    def rule(seq, tokens_left):
        n = chunk(seq, tokens_left, max_chunk)
        cut.append(isinstance(n, (int, np.integer)) and 0 < n < seq.num_new_tokens)
        return n

    return LLM(model=model, enable_chunked_prefill=rule, max_num_batched_tokens=budget), cut


def check_cut(cut, label):
    assert any(cut), f"{label}: no prompt was cut into chunks (the test's own check)"
    checks.observe(f"{label}: chunks that left part of a prompt for a later step", sum(cut), at_least=1)


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
            check_cut(cut, label)
            print(f"{label}: exact; {sum(cut)} chunks left part of a prompt for a later step")


def report_chunks(chunk, report, max_chunks, run):
    """Hidden: the rule for each max_chunk, then one engine run (max_chunk, budget), its tokens into the report."""
    checks.require_own(chunk, "chunk")
    model = checks.load_model()
    with checks.reference_forbidden("your chunk rule", forbidden=ANSWER_KEY):
        for m in max_chunks:
            check_rule(chunk, f"hidden case: max_chunk={m}", m, hidden=True)
        cases = report.cases("golden")
        max_chunk, budget = run
        label = f"hidden cases, chunks of at most {max_chunk}, budget {budget}"
        llm, cut = chunked_engine(chunk, model, max_chunk, budget)
        outs = generate(llm, cases)
        check_cut(cut, label)
        for c, got in zip(cases, golden_tokens(outs, label)):
            report.add("golden", c, "token_ids", got)
