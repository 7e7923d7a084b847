"""Lab 02's answer key, and what the checks of every task share. Part of the lab02 harness: see lab02.py."""
from __future__ import annotations

import json

from autograder import notebook_checks as checks

# This lab's answer key: while a test runs, any call to these fails it (checks.reference_forbidden). sample_token is
# yours to use (lab 01 was about it).
ANSWER_KEY = {
    "miniengine.kv.contiguous": ["KVArena.__init__", "KVCache._attach", "KVCache.write", "KVCache.bytes_used",
                                 "KVCache.bytes_reserved", "CachedBackend.__init__", "CachedBackend.positions",
                                 "CachedBackend.attend", "CachedBackend.advance", "ContiguousKV.allocate"],
    "miniengine.course.cached_decode": ["cached_generate"],
    "miniengine.engine.model_runner": ["ModelRunner.run"],
    "miniengine.reference": ["naive_generate"]}
# The answer key minus the engine itself, which runs your parts in the engine tests.
ENGINE_KEY = {module: names for module, names in ANSWER_KEY.items() if module != "miniengine.engine.model_runner"}


def require_own_class(cls, name: str) -> None:
    """A graded class must be written in the notebook (checks.require_own is the same rule for functions)."""
    assert isinstance(cls, type) and cls.__module__ == "__main__", (
        f"{name} must be a class written with `class {name}:` in this notebook, not imported")


def visible_golden() -> dict:
    """The visible golden runs, read from their file: expected values are stored, never computed here."""
    with open(checks.VISIBLE_GOLDEN) as f:
        return json.load(f)


def difference(tok, got: list[int], want: list[int]) -> str:
    """Where two runs first part, for a message: the step, and each run's token there."""
    t = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    shown = [checks.show(tok, run[t]) if t < len(run) else "no more tokens" for run in (want, got)]
    return f"first difference at step {t}: expected {shown[0]}, got {shown[1]}"
