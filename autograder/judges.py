"""The grader's own comparisons, for measures whose truth never enters the kernel (autograder/verdicts.py).

A harness observes a value with ``judge="name"`` (autograder/checks/ledger.py); the worker calls ``JUDGES[name](value,
row)`` outside the sandbox, where the hidden data is, and gets None (it holds) or what is wrong, in words a student
may read: never a hidden value.
"""
from __future__ import annotations

JUDGES: dict[str, object] = {}
