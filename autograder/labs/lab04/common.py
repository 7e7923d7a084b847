"""Lab 04's shared parts: the answer key, hand-built queues, and how a policy's answer is read.

Reloaded by ``autograder.labs.lab04`` before its other parts (see that module).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import autograder.notebook_checks as checks

# This lab's answer key: any call into it while the tests run fails them (checks.reference_forbidden).
ANSWER_KEY = {
    "miniengine.engine.policy": ["fits", "FCFSPolicy.admit", "StaticBatching.__init__", "StaticBatching.admit",
                                 "StaticBatching.wake_time", "StaticBatching.padding"]}


def queue(*prompts, arrivals=None):
    """Waiting sequences, oldest first, with only the fields a policy may read."""
    arrivals = [0.1 * i for i in range(len(prompts))] if arrivals is None else arrivals
    return tuple(SimpleNamespace(seq_id=i, request_id=i, num_new_tokens=p, num_prompt_tokens=p, arrival_time=a,
                                 is_finished=False) for i, (p, a) in enumerate(zip(prompts, arrivals)))


def running(n):
    """n decoding sequences (one new token each), as the scheduler passes them to admit."""
    return tuple(SimpleNamespace(seq_id=100 + i, num_new_tokens=1, is_finished=False) for i in range(n))


def admitted(result, waiting, what):
    """Where in `waiting` each returned sequence stands, as plain ints (by identity, not by equality)."""
    if isinstance(result, (str, bytes)) or not hasattr(result, "__iter__"):
        raise AssertionError(f"{what}: admit must return a list of waiting sequences, got {type(result).__name__}")
    where, got = {id(s): i for i, s in enumerate(waiting)}, []
    for s in list(result):
        assert id(s) in where, f"{what}: admit returned {s!r:.80}, which is not one of the waiting sequences"
        got.append(where[id(s)])
    assert len(set(got)) == len(got), f"{what}: admit returned the same sequence twice (positions {got})"
    return got


def hint(got, waiting):
    """Name the overtaking, if that is what went wrong."""
    for i in range(len(waiting)):
        later = [j for j in got if j > i]
        if i not in got and later:
            return (f" Request {later[0]} ({waiting[later[0]].num_new_tokens} tokens) overtook request {i} "
                    f"({waiting[i].num_new_tokens} tokens), which did not fit: under first-come first-served no request "
                    f"starts before an older one that is still waiting, or a long prompt could wait forever behind a "
                    f"stream of short ones (starvation).")
    return ""


def own_policy(cls, name):
    """A policy must be a class written in the notebook, with its own admit written with def."""
    assert isinstance(cls, type) and cls.__module__ == "__main__", (
        f"{name} must be a class written with `class {name}:` in this notebook, not imported")
    assert "admit" in vars(cls), f"{name} must define its own admit(self, waiting, running, budget)"
    checks.require_own(vars(cls)["admit"], f"{name}.admit")


def as_bool(x, what):
    """A plain bool: an object that only pretends to be True or False cannot answer fits."""
    if not isinstance(x, (bool, np.bool_)):
        raise AssertionError(f"{what}: expected True or False, got {type(x).__name__} {x!r:.60}")
    return bool(x)
