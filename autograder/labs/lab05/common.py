"""Lab 05's shared checks: the answer key, your manager's state as plain ints, and the pool's invariants.

Every other part of this lab's harness reads your ``BlockManager`` through ``state`` and holds it to
``check_pool``. Reloaded by ``autograder.labs.lab05`` before its other parts (see that module).
"""
from __future__ import annotations

from collections import Counter

import numpy as np

import autograder.notebook_checks as checks
from autograder.labs.shared import as_ints, check_pool, state  # noqa: F401  the pool, as labs 05 and 06 check it

# This lab's answer key: any call into it while the tests run fails them (checks.reference_forbidden).
ANSWER_KEY = {
    "miniengine.kv.block_manager": ["blocks_needed", "BlockManager.__init__", "BlockManager.num_free_blocks",
                                    "BlockManager._take", "BlockManager._release", "BlockManager.can_allocate",
                                    "BlockManager.allocate", "BlockManager._needs_block", "BlockManager.can_append",
                                    "BlockManager.append_slot", "BlockManager.fork", "BlockManager.free"],
    "miniengine.kv.paged": ["gather_history"]}

# The methods your class must define itself: one inherited from the course's BlockManager would be the answer key.
METHODS = ("__init__", "can_allocate", "allocate", "can_append", "append_slot", "fork", "free")


def as_bool(x, what):
    """A plain bool: an object that only pretends to be True or False cannot answer can_allocate or can_append."""
    if not isinstance(x, (bool, np.bool_)):
        raise AssertionError(f"{what}: expected True or False, got {type(x).__name__} {x!r:.60}")
    return bool(x)


def own_block_manager(cls):
    """Your BlockManager is a class of this notebook, and each graded method is its own, written with def."""
    assert isinstance(cls, type) and cls.__module__ == "__main__", (
        "BlockManager must be a class written with `class BlockManager:` in this notebook, not imported")
    for name in METHODS:
        assert name in vars(cls), f"BlockManager must define its own {name}"
        checks.require_own(vars(cls)[name], f"BlockManager.{name}")
