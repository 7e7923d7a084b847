"""Lab 04, Tasks 1, 2 and 5 on hand-built queues: the checks of fits, ContinuousBatching.admit and
StaticBatching.admit.

Reloaded by ``autograder.labs.lab04`` (see that module); the test cells call these through ``lab04``.
"""
from __future__ import annotations

import autograder.notebook_checks as checks
from autograder.labs.lab04_common import ANSWER_KEY, admitted, as_bool, hint, own_policy, queue, running
from miniengine.engine.policy import Budget


def check_fits(fits, cases, label):
    """cases: (what, prompt tokens, seats left, tokens left, KV memory free?, expected). fits must answer a plain
    bool and ask can_allocate about the sequence itself."""
    checks.require_own(fits, "fits")
    with checks.reference_forbidden("fits", forbidden=ANSWER_KEY):
        for what, prompt, seats, tokens, kv, want in cases:
            seq, asked = queue(prompt)[0], []

            def can_allocate(s, kv=kv):
                asked.append(s)
                return kv

            got = as_bool(fits(seq, seats, tokens, can_allocate), f"{label}fits ({what})")
            assert got == want, (f"{label}fits for a {prompt}-token prompt with {seats} seat{'s' * (seats != 1)} "
                                 f"and {tokens} tokens left, KV memory {'free' if kv else 'full'} ({what}): expected "
                                 f"{want}, got {got}")
            assert all(s is seq for s in asked), (f"{label}fits ({what}): call can_allocate(seq) with the sequence "
                                                  f"itself")


def check_admit(policy, what, prompts, want, seats=8, tokens=1000, no_kv=(), running_seqs=0, arrivals=None, now=0.0):
    """One call of policy.admit on a hand-built queue: the positions it returns must be `want`."""
    waiting = queue(*prompts, arrivals=arrivals)
    busy = running(running_seqs)
    budget = Budget(max_seqs=seats, max_tokens=tokens, can_allocate=lambda s: s.seq_id not in no_kv, now=now)
    got = admitted(policy.admit(waiting, busy, budget), waiting, what)
    assert got == want, (f"{what}: admit should return the waiting requests at positions {want}, got {got} "
                         f"(prompts {list(prompts)}, {running_seqs} running, {seats} seat{'s' * (seats != 1)} and "
                         f"{tokens} tokens left in the step"
                         + (f", no KV memory for positions {list(no_kv)}" if no_kv else "") + ")." + hint(got, waiting))
    return got


def check_continuous(ContinuousBatching, cases, label, ns):
    """cases: (what, prompts oldest first, seats left, tokens left, no KV memory for, running, expected positions).

    ns: the notebook's globals, where the course's fits is lent while they run (your admit calls fits by name), so
    that a mistake in fits costs only its own task.
    """
    own_policy(ContinuousBatching, "ContinuousBatching")
    with checks.course_parts_under(ns, "fits"), \
            checks.reference_forbidden("ContinuousBatching.admit", forbidden=ANSWER_KEY):
        for what, prompts, seats, tokens, no_kv, busy, want in cases:
            check_admit(ContinuousBatching(), label + what, prompts, want, seats=seats, tokens=tokens, no_kv=no_kv,
                        running_seqs=busy)


def check_static(StaticBatching, cases, label, ns):
    """cases: (what, batch_size, timeout_s, prompts, arrivals, now, seats, tokens, running, expected positions); the
    admitted batch must also be kept in self.batch. ns: the notebook's globals, where the course's fits is lent."""
    own_policy(StaticBatching, "StaticBatching")
    with checks.course_parts_under(ns, "fits"), \
            checks.reference_forbidden("StaticBatching.admit", forbidden=ANSWER_KEY):
        for what, size, timeout, prompts, arrivals, now, seats, tokens, busy, want in cases:
            policy = StaticBatching(size, timeout)
            waiting = queue(*prompts, arrivals=arrivals)
            budget = Budget(max_seqs=seats, max_tokens=tokens, can_allocate=lambda s: True, now=now)
            what = (f"{label}{what} (batch_size={size}, timeout_s={timeout}, prompts {prompts} arrived at {arrivals}, "
                    f"now={now}, {busy} running, {seats} seat{'s' * (seats != 1)} and {tokens} tokens left)")
            got = admitted(policy.admit(waiting, running(busy), budget), waiting, what)
            assert got == want, (f"{what}: admit should return the waiting requests at positions {want}, got {got}."
                                 f"{hint(got, waiting)}")
            if got:
                kept = admitted(getattr(policy, "batch", None) or [], waiting, f"{what}: self.batch")
                assert kept == got, (f"{what}: keep the admitted batch in self.batch (it holds {kept}, admit "
                                     f"returned {got})")
