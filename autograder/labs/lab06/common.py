"""Lab 06's shared checks: the answer keys, and how every Task 1 test calls your verifier.

Reloaded by ``autograder.labs.lab06`` before its other parts (see that module).
"""
from __future__ import annotations

import numpy as np

import autograder.notebook_checks as checks

# This lab's answer key: any call into it while the tests run fails them (checks.reference_forbidden).
ANSWER_KEY = {
    "miniengine.spec.verify": ["rejection_verify", "residual", "sample_from"],
    "miniengine.kv.block_manager": ["BlockManager.truncate"]}
# While your truncate runs in the scripted tests, the rest of the course's manager is off limits too.
TRUNCATE_KEY = {"miniengine.kv.block_manager": [
    "BlockManager.truncate", "BlockManager._take", "BlockManager._release", "BlockManager.free",
    "BlockManager.allocate", "BlockManager.append_slot", "BlockManager.fork", "BlockManager.can_allocate",
    "BlockManager.can_append", "BlockManager._needs_block"]}


def fmt(v):
    """A distribution, short enough for a message: [0.5, 0.3, 0.2]."""
    return "[" + ", ".join(f"{float(x):.3g}" for x in v) + "]"


def as_logits(rows):
    """Probability rows -> logits whose softmax is those rows (log 0 = -inf: a token the row excludes)."""
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(rows, dtype=np.float64))


def residual(p, q):
    """The test's own residual, normalize(max(0, p - q)), by the task's formula (p where p and q agree)."""
    r = np.maximum(p - q, 0)
    return r / r.sum() if r.sum() > 0 else p


def verify_once(rejection_verify, target_logits, drafts, qs, params, positions, what):
    """Your verifier on one step, its answer as plain ints, held to the rules every answer follows."""
    logits_before, qs_before = target_logits.copy(), [q.copy() for q in qs]
    try:
        out = rejection_verify(target_logits, list(drafts), qs, params, list(positions))
    except Exception as e:
        raise AssertionError(f"{what}: rejection_verify raised {type(e).__name__}: {e}") from e
    out = checks.as_tokens(out, f"{what}: rejection_verify's answer")  # plain ints before any comparison
    g, V = len(drafts), target_logits.shape[1]
    assert np.array_equal(target_logits, logits_before) and all(np.array_equal(a, b) for a, b in zip(qs, qs_before)), (
        f"{what}: rejection_verify changed target_logits or draft_probs in place; it must only read them")
    assert 1 <= len(out) <= g + 1, (
        f"{what}: rejection_verify returned {out} for {g} draft(s): a step emits between 1 and γ + 1 = {g + 1} tokens "
        f"(the accepted drafts, then one token of the target's)")
    assert all(0 <= t < V for t in out), (
        f"{what}: rejection_verify returned {out}: ids outside the vocabulary 0..{V - 1}")
    k = len(out) - 1
    assert out[:k] == [int(x) for x in drafts[:k]], (
        f"{what}: rejection_verify returned {out} for the drafts {list(drafts)}: every token but the last must be an "
        f"accepted draft, in order (x_1 .. x_k), and the last one the target's")
    return out
