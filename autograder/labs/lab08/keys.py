"""Lab 08's Task 1 checks: the chained block key (autograder/labs/lab08/__init__.py gathers them as lab.check_block_keys).

Each case draws random tokens and a random parent key; ``block_key`` must be SHA-256 of the parent followed by the
tokens as int64 bytes (the task's formula, computed here with hashlib), and ``block_keys`` the chain of the full
blocks' keys.  Every key the student's functions return is observed as hex (the grader compares it outside the
kernel: a visible case with the formula's key, a hidden one with the solution's, from the answer sheet).
"""
from __future__ import annotations

import hashlib
import random

import numpy as np

from autograder import notebook_checks as checks
from autograder.labs.lab08.cache import ANSWER_KEY, as_key, expected


def sha_key(parent, tokens):
    """The task's formula, computed here with hashlib: SHA-256 of the parent key, then the tokens as int64."""
    return hashlib.sha256(bytes(parent) + np.asarray(list(tokens), dtype=np.int64).tobytes()).digest()


def as_keys(xs, what):
    if not isinstance(xs, list):
        raise AssertionError(f"{what}: expected a list of keys, got {type(xs).__name__}")
    return [as_key(x, f"{what}[{i}]") for i, x in enumerate(xs)]


def hexes(keys):
    return [k.hex() for k in keys]


def check_keys(block_key, block_keys, seed, block_size, length, label, hidden=False):
    """One case: `length` random tokens and a random parent key, drawn from random.Random(seed)."""
    rng = random.Random(seed)
    tokens = [rng.randrange(4096) for _ in range(length)]
    parent = bytes(rng.randrange(256) for _ in range(32))
    for p, name in ((parent, "parent"), (b"", "b''")):
        got = as_key(block_key(p, tokens[:block_size]), f"{label}: block_key")
        want = sha_key(p, tokens[:block_size])
        assert got == want, (f"{label}: block_key(parent, tokens) is not SHA-256(parent + int64 tokens)" if p else
                             f"{label}: block_key(b'', tokens) is not SHA-256(int64 tokens)")
        checks.observe(f"{label}: block_key({name}, block 0's tokens), hex", got.hex(), **expected(want.hex(), hidden))
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
    checks.observe(f"{label}: block_keys, hex", hexes(keys), **expected(hexes(want), hidden))
    full = as_keys(block_keys(tokens[:n * block_size], block_size), label)
    assert full == keys, f"{label}: keys depend on a partial block"
    checks.observe(f"{label}: block_keys of the full blocks alone, hex", hexes(full), **expected(hexes(want), hidden))
    partial = as_keys(block_keys(tokens[:block_size - 1], block_size), label)
    assert partial == [], f"{label}: a partial block has no key"
    checks.observe(f"{label}: block_keys of {block_size - 1} tokens", hexes(partial), **expected([], hidden))
    for i in rng.sample(range(n * block_size), min(12, n * block_size)):
        changed = tokens[:i] + [(tokens[i] + 1) % 4096] + tokens[i + 1:]
        other = as_keys(block_keys(changed, block_size), label)
        first = i // block_size
        assert other[:first] == keys[:first], f"{label}: changing token {i} changed the key of an earlier block"
        same = [j for j in range(first, n) if other[j] == keys[j]]
        assert not same, (f"{label}: changing token {i} (block {first}) left the key of block(s) {same} unchanged: "
                          f"every key from block {first} on depends on it through the chain")
        moved = [j for j in range(len(other)) if j >= n or other[j] != keys[j]]  # the blocks whose key changed
        checks.observe(f"{label}: token {i} changed, the blocks whose key changed", moved,
                       **expected(list(range(first, n)), hidden))
    if n >= 2:  # the same tokens after another prefix are other K/V
        alone = as_keys(block_keys(tokens[block_size:2 * block_size], block_size), label)
        assert alone[0] != keys[1], (
            f"{label}: block 1's tokens alone got block 1's key: the key must include the blocks before it")
        checks.observe(f"{label}: block 1's tokens alone get another key than block 1's", True, expect=True)
    return n


def check_block_keys(block_key, block_keys, cases, prefix=""):
    """Task 1's test: cases are (seed, block size, length); prefix starts each message (a hidden cell's, which
    observes the keys without the formula's: the grader holds the solution's)."""
    checks.require_own(block_key, "block_key")
    checks.require_own(block_keys, "block_keys")
    with checks.reference_forbidden("block_key and block_keys", forbidden=ANSWER_KEY):
        for seed, bs, length in cases:
            check_keys(block_key, block_keys, seed, bs, length, f"{prefix}{length} tokens, blocks of {bs}",
                       hidden=bool(prefix))
