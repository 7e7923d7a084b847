"""Lab 02's answer key, and what the checks of every task share. Part of the lab02 harness: see lab02/__init__.py."""
from __future__ import annotations

import json

from autograder import notebook_checks as checks
from autograder.labs.shared import difference  # noqa: F401  the parts read it from here

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
