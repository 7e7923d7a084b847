"""Lab 04, Tasks 1, 2 and 5 on hand-built queues: the checks of fits, ContinuousBatching.admit and
StaticBatching.admit.

Every answer is observed for the grader (checks.observe), which judges it outside the kernel: a visible case with the
expected value it carries, a hidden case (inputs only, no expected value) against the course's solution's answer,
which stays with the grader. Reloaded by ``autograder.labs.lab04`` (see that module); the test cells call these
through ``lab04``.
"""
from __future__ import annotations

import autograder.notebook_checks as checks
from autograder.labs.lab04.common import ANSWER_KEY, admitted, as_bool, hint, own_policy, queue, running
from miniengine.engine.policy import Budget


def check_fits(fits, cases, label):
    """cases: (what, prompt tokens, seats left, tokens left, KV memory free?[, expected]); a hidden case has no
    expected answer (the grader holds it). fits must answer a plain bool and ask can_allocate about the sequence
    itself."""
    checks.require_own(fits, "fits")
    with checks.reference_forbidden("fits", forbidden=ANSWER_KEY):
        for what, prompt, seats, tokens, kv, *want in cases:
            seq, asked = queue(prompt)[0], []

            def can_allocate(s, kv=kv):
                asked.append(s)
                return kv

            got = as_bool(fits(seq, seats, tokens, can_allocate), f"{label}fits ({what})")
            checks.observe(f"{label}fits ({what})", got, **({"expect": want[0]} if want else {}))
            if want:
                assert got == want[0], (f"{label}fits for a {prompt}-token prompt with {seats} "
                                        f"seat{'s' * (seats != 1)} and {tokens} tokens left, KV memory "
                                        f"{'free' if kv else 'full'} ({what}): expected {want[0]}, got {got}")
            itself = all(s is seq for s in asked)
            assert itself, f"{label}fits ({what}): call can_allocate(seq) with the sequence itself"
            checks.observe(f"{label}fits ({what}): can_allocate asked about the sequence itself", itself, expect=True)


def check_admit(policy, what, prompts, want, seats=8, tokens=1000, no_kv=(), running_seqs=0, arrivals=None, now=0.0):
    """One call of policy.admit on a hand-built queue: the positions it returns, observed; they must be `want` (a
    visible case), or, for a hidden case (want None), whatever the grader holds, and in any case nobody overtakes."""
    waiting = queue(*prompts, arrivals=arrivals)
    busy = running(running_seqs)
    budget = Budget(max_seqs=seats, max_tokens=tokens, can_allocate=lambda s: s.seq_id not in no_kv, now=now)
    got = admitted(policy.admit(waiting, busy, budget), waiting, what)
    checks.observe(f"{what}: the positions admitted", got, **({} if want is None else {"expect": want}))
    if want is None:  # hidden: the right positions stay with the grader; the message says only what went wrong
        overtook = hint(got, waiting)
        assert not overtook, f"{what}: admit returned the waiting requests at positions {got}.{overtook}"
        return got
    assert got == want, (f"{what}: admit should return the waiting requests at positions {want}, got {got} "
                         f"(prompts {list(prompts)}, {running_seqs} running, {seats} seat{'s' * (seats != 1)} and "
                         f"{tokens} tokens left in the step"
                         + (f", no KV memory for positions {list(no_kv)}" if no_kv else "") + ")." + hint(got, waiting))
    return got


def check_continuous(ContinuousBatching, cases, label, ns):
    """cases: (what, prompts oldest first, seats left, tokens left, no KV memory for, running[, expected
    positions]); a hidden case has no expected positions (the grader holds them).

    ns: the notebook's globals, where the course's fits is lent while they run (your admit calls fits by name), so
    that a mistake in fits costs only its own task.
    """
    own_policy(ContinuousBatching, "ContinuousBatching")
    with checks.course_parts_under(ns, "fits"), \
            checks.reference_forbidden("ContinuousBatching.admit", forbidden=ANSWER_KEY):
        for what, prompts, seats, tokens, no_kv, busy, *want in cases:
            check_admit(ContinuousBatching(), label + what, prompts, want[0] if want else None, seats=seats,
                        tokens=tokens, no_kv=no_kv, running_seqs=busy)


def check_static(StaticBatching, cases, label, ns):
    """cases: (what, batch_size, timeout_s, prompts, arrivals, now, seats, tokens, running[, expected positions]); a
    hidden case has no expected positions (the grader holds them). The admitted batch must also be kept in
    self.batch. ns: the notebook's globals, where the course's fits is lent."""
    own_policy(StaticBatching, "StaticBatching")
    with checks.course_parts_under(ns, "fits"), \
            checks.reference_forbidden("StaticBatching.admit", forbidden=ANSWER_KEY):
        for what, size, timeout, prompts, arrivals, now, seats, tokens, busy, *want in cases:
            name = f"{label}{what}"  # the observations' labels; the messages say the whole case
            policy = StaticBatching(size, timeout)
            waiting = queue(*prompts, arrivals=arrivals)
            budget = Budget(max_seqs=seats, max_tokens=tokens, can_allocate=lambda s: True, now=now)
            what = (f"{label}{what} (batch_size={size}, timeout_s={timeout}, prompts {prompts} arrived at {arrivals}, "
                    f"now={now}, {busy} running, {seats} seat{'s' * (seats != 1)} and {tokens} tokens left)")
            got = admitted(policy.admit(waiting, running(busy), budget), waiting, what)
            checks.observe(f"{name}: the positions admitted", got, **({"expect": want[0]} if want else {}))
            if want:
                assert got == want[0], (f"{what}: admit should return the waiting requests at positions {want[0]}, "
                                        f"got {got}.{hint(got, waiting)}")
            else:  # hidden: the right positions stay with the grader; only an overtaking is named here
                overtook = hint(got, waiting)
                assert not overtook, f"{what}: admit returned the waiting requests at positions {got}.{overtook}"
            kept = admitted(getattr(policy, "batch", None) or [], waiting, f"{what}: self.batch") if got else got
            assert kept == got, (f"{what}: keep the admitted batch in self.batch (it holds {kept}, admit "
                                 f"returned {got})")
            checks.observe(f"{name}: self.batch holds the admitted batch", kept == got, expect=True)
