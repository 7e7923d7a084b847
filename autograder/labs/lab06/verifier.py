"""Lab 06, Task 1 on hand-made distributions: every draft enumerated, and keyed steps with pasted tokens.

Reloaded by ``autograder.labs.lab06`` (see that module); the test cells call it through ``lab06``.

A verdict never rests on the kernel's word (autograder/notebook_checks/ledger.py): besides its assertion, each check
``observe``s what it measured of your verifier. By enumeration: each frequency's distance from what rejection
sampling gives, with the same bound as the assertion (a statistical test has no exact value to compare). Keyed: your
tokens, compared with the pasted ones (visible) or, for a hidden step, which holds its inputs only, with the course's
solution's tokens by the grader, outside the notebook.
"""
from __future__ import annotations

import numpy as np

import autograder.notebook_checks as checks
from autograder.labs.lab06.common import ANSWER_KEY, as_logits, fmt, residual, verify_once
from miniengine import SamplingParams
from miniengine.sampling import STREAM_ACCEPT, keyed_uniform
from miniengine.spec.verify import probs

# ---------------------------------------------------------------- exact by enumeration

def tolerance(prob, n):
    """How far a frequency over n keyed trials may stray from prob: 5 standard errors, and one trial."""
    return 5 * np.sqrt(prob * (1 - prob) / n) + 1 / n


def looks_like(freq, candidates):
    """The name of the candidate distribution closest to freq (total variation), with that distance."""
    name, dist = min(((n, 0.5 * np.abs(freq - d).sum()) for n, d in candidates), key=lambda t: t[1])
    return name, dist


def keyed_trials(rejection_verify, logits, x, q, position, num_keys, here):
    """Draft x verified alone (γ = 1) with seeds 0 .. num_keys - 1: how often it was accepted, how often the answer
    was [x] alone, the replacements after a rejection and the bonus tokens after an acceptance, per token."""
    V = logits.shape[1]
    accepted, same, replaced, bonuses = 0, 0, np.zeros(V), np.zeros(V)
    for seed in range(num_keys):
        out = verify_once(rejection_verify, logits, [x], [q], SamplingParams(temperature=1.0, seed=seed),
                          [position, position + 1], f"{here}, seed {seed}")
        if len(out) == 2:
            accepted += 1
            bonuses[out[1]] += 1
        elif out[0] == x:
            same += 1  # [x]: an accepted draft without its bonus token, or x drawn again after a rejection
        else:
            replaced[out[0]] += 1
    return accepted, same, replaced, bonuses


def acceptance_hint(rate, a, p, q, x, num_keys):
    """The likeliest mistake behind an acceptance rate that is not min(1, p(x)/q(x))."""
    flipped = min(1.0, q[x] / p[x]) if p[x] > 0 else 0.0
    hints = []
    if abs(rate - flipped) <= tolerance(flipped, num_keys):
        hints.append("min(1, q(x)/p(x)): the ratio upside down")
    if 0 < p[x] < 1 and abs(rate - p[x]) <= tolerance(p[x], num_keys):
        hints.append("p(x): the coin compared with p(x) instead of p(x)/q(x)")
    if hints:
        return " That is " + ", or ".join(hints) + "."
    if a == 1.0:
        return " Here p(x) >= q(x): the coin u < 1 <= p(x)/q(x) always accepts x."
    if a == 0.0:
        return " Here p(x) = 0: the target never emits x, so it is always rejected."
    if rate in (0.0, 1.0):
        return " Draw the coin u and accept when u < p(x)/q(x): a random decision, not a comparison of p and q."
    return ""


def check_bonus_present(same, accepted, num_keys, p, q, x, here, ctx):
    """Answers [x] alone and never two tokens, for a draft that can be accepted: the bonus token is missing."""
    if same and not accepted and min(1.0, p[x] / q[x]) > 0:
        raise AssertionError(
            f"{here}: the bonus token is missing: your verifier returned [{x}] for the drafts [{x}] "
            f"({same} of {num_keys} keyed trials) and never two tokens. After the last accepted draft comes "
            f"the target's own token, sampled from target_logits[γ] at positions[γ]. (Had it rejected x, it "
            f"could not draw x again: the residual gives 0 to every token where q >= p.){ctx}")


def check_acceptance(accepted, num_keys, p, q, x, here, ctx):
    """x is accepted with probability min(1, p(x)/q(x)): always, never, or within the tolerance."""
    a, rate = min(1.0, p[x] / q[x]), accepted / num_keys
    bound = 0.0 if a in (0.0, 1.0) else tolerance(a, num_keys)  # always or never: exactly
    checks.observe(f"{here}: |acceptance rate - min(1, p(x)/q(x))|", float(abs(rate - a)), at_most=bound)
    ok = (accepted == num_keys if a == 1.0 else accepted == 0 if a == 0.0
          else abs(rate - a) <= tolerance(a, num_keys))
    if not ok:
        raise AssertionError(
            f"{here}: accepted in {accepted} of {num_keys} keyed trials ({rate:.3f}), but a draft is "
            f"accepted with probability min(1, p(x)/q(x)) = min(1, {p[x]:.3g}/{q[x]:.3g}) = {a:.3f}."
            f"{acceptance_hint(rate, a, p, q, x, num_keys)}{ctx}")


def observe_spread(what, counts, dist, n, name):
    """Hands the grader two measures of n draws (counts per token) against the distribution they must follow: how
    many fell where it gives probability 0 (none may), and the largest deviation of a frequency, in units of its
    tolerance (at most 1), the assertions' own bounds."""
    freq = counts / n
    checks.observe(f"{what} where {name} gives probability 0", int(counts[dist == 0].sum()), at_most=0)
    checks.observe(f"{what}: largest deviation from {name}, in tolerances",
                   float(max(abs(freq[y] - dist[y]) / tolerance(dist[y], n) for y in range(dist.size))), at_most=1)


def check_bonus(bonuses, accepted, bonus, here, ctx):
    """After an accepted draft, the bonus tokens follow the last row, target_logits[γ]."""
    freq = bonuses / accepted
    bad = [int(y) for y in np.flatnonzero((bonuses > 0) & (bonus == 0))]
    off = [int(y) for y in range(bonus.size) if abs(freq[y] - bonus[y]) > tolerance(bonus[y], accepted)]
    observe_spread(f"{here}: bonus tokens", bonuses, bonus, accepted, "the last row")
    assert not bad and not off, (
        f"{here}: the bonus token after an accepted draft must be the target's own sample from its last "
        f"row, target_logits[γ] = {fmt(bonus)} here, at positions[γ]; yours have frequencies "
        f"{fmt(freq)} over {accepted} accepted trials"
        + (f" (that row never gives token(s) {bad})" if bad else "") + ctx)


def check_replacements(replaced, rejected, p, q, here, ctx):
    """After a rejection, the replacements follow the residual: never a token it excludes, each at its frequency."""
    r, freq = residual(p, q), replaced / rejected
    name, dist = looks_like(freq, [("p, the target's distribution", p), ("q, the draft's distribution", q)])
    lead = f"your replacements look like {name}, not the residual: " if dist < 0.5 * np.abs(freq - r).sum() else ""
    bad = [int(y) for y in np.flatnonzero((replaced > 0) & (r == 0))]
    observe_spread(f"{here}: replacements after a rejection", replaced, r, rejected, "the residual")
    assert not bad, (
        f"{here}: {lead}after rejecting x, draw from the residual normalize(max(0, p - q)) = {fmt(r)}; "
        f"your verifier emitted token(s) {bad} ({int(replaced[bad].sum())} of {rejected} rejections), "
        f"which it gives probability 0: where the draft already offered at least what the target "
        f"wants (q >= p), a rejection must not add more.{ctx}")
    off = [int(y) for y in range(p.size) if abs(freq[y] - r[y]) > tolerance(r[y], rejected)]
    assert not off, (
        f"{here}: {lead}after rejecting x, the replacement must follow the residual normalize(max(0, "
        f"p - q)) = {fmt(r)}; yours have frequencies {fmt(freq)} over {rejected} rejections (token(s) "
        f"{off} are off).{ctx}")
    return freq


def check_enumeration(rejection_verify, pairs, num_keys, label):
    """For each hand-made (what, p, q, bonus row, position): every draft x that q can propose, verified alone (γ = 1)
    with seeds 0 .. num_keys - 1. Per draft, the acceptance frequency must match min(1, p(x)/q(x)), a rejected draft's
    replacements the residual normalize(max(0, p - q)), and an accepted draft's bonus tokens the last row.
    Then the step's distribution, summed exactly over every draft x with its weight q(x), must be p."""
    checks.require_own(rejection_verify, "rejection_verify")
    with checks.reference_forbidden("rejection_verify", forbidden=ANSWER_KEY):
        for what, p, q, bonus, position in pairs:
            p, q, bonus = (np.asarray(v, dtype=np.float64) for v in (p, q, bonus))
            logits = as_logits([p, bonus])
            step = np.zeros(p.size)  # P(first emitted token = y): sum over x of q(x) P(y | draft x)
            for x in (int(i) for i in np.flatnonzero(q > 0)):
                here = f"{label}{what}, draft x = {x}"
                ctx = f" (p = {fmt(p)}, q = {fmt(q)}, the bonus row {fmt(bonus)})"
                accepted, same, replaced, bonuses = keyed_trials(rejection_verify, logits, x, q, position, num_keys,
                                                                 here)
                check_bonus_present(same, accepted, num_keys, p, q, x, here, ctx)
                replaced[x] += same  # with the bonus token in place, [x] is x drawn again after a rejection
                check_acceptance(accepted, num_keys, p, q, x, here, ctx)
                if accepted:
                    check_bonus(bonuses, accepted, bonus, here, ctx)
                rate, rejected = accepted / num_keys, num_keys - accepted
                if rejected:
                    step += q[x] * (1 - rate) * check_replacements(replaced, rejected, p, q, here, ctx)
                step[x] += q[x] * rate
            checks.observe(f"{label}{what}: the step's first token, largest deviation from p",
                           float(np.abs(step - p).max()), at_most=0.04)
            off = [int(y) for y in range(p.size) if abs(step[y] - p[y]) > 0.04]
            assert not off, (
                f"{label}{what}: summed over every draft x with its probability q(x), your step emits its first token "
                f"with probability {fmt(step)}, but rejection sampling emits exactly p = {fmt(p)} (token(s) {off} "
                f"are off; q = {fmt(q)})")
    return len(pairs)


# ---------------------------------------------------------------- keyed, so reproducible

def explain(got, want, logits, qs, drafts, sp, positions):
    """Why got differs from want: the first decision that went the other way, with the numbers behind it."""
    g = len(drafts)
    kg, kw = len(got) - 1, len(want) - 1  # drafts accepted
    if kg == g - 1 and kw == g and got[-1] == drafts[kg]:
        return (f"the bonus token is missing: after the last accepted draft, add sample_token(target_logits[{g}], "
                f"params, positions[{g}]) (a rejected draft never comes back from the residual, so {got} reads as: "
                f"all accepted, no bonus)")
    j = min(kg, kw)
    if j == g:
        return (f"all {g} drafts are accepted, and the bonus token should be {want[-1]}, the target's own keyed sample "
                f"sample_token(target_logits[{g}], params, positions[{g}]); yours is {got[-1]}")
    x, p, q = int(drafts[j]), probs(logits[j], sp), qs[j]
    u = float(keyed_uniform(sp.seed, positions[j], 1, STREAM_ACCEPT)[0])
    coin = (f"the coin u = keyed_uniform(params.seed, positions[{j}], 1, STREAM_ACCEPT)[0] = {u:.4f} is "
            f"{'below' if u * q[x] < p[x] else 'not below'} p(x)/q(x) = {p[x]:.4f}/{q[x]:.4f}")
    if kg > kw:
        return f"drafts[{j}] = {x} must be rejected, yours accepted it: {coin}"
    if kg < kw:
        return f"drafts[{j}] = {x} must be accepted, yours rejected it: {coin}"
    r = residual(p, q)
    return (f"after rejecting drafts[{j}] = {x}, the token should be {want[-1]}, yours is {got[-1]}"
            + (", which the residual gives probability 0" if r[got[-1]] == 0 else "")
            + f": draw it from the residual r = normalize(max(0, p - q)) = {fmt(r)} (p = {fmt(p)}) as "
              f"argmax(log r + gumbel_noise(params.seed, positions[{j}], V, STREAM_RESIDUAL)); {coin}")


def check_keyed(rejection_verify, cases, label):
    """Hand-made steps (what, p rows and q rows in twentieths, drafts, params, positions[0], the expected tokens):
    the expected tokens are pasted in a visible cell, computed once with the keys the task prescribes; a hidden step
    leaves them out, and the grader compares your tokens with the course's solution's, outside the notebook. Each
    step runs three times: a keyed verifier answers the same every time. All steps run before any answer is
    compared."""
    checks.require_own(rejection_verify, "rejection_verify")
    with checks.reference_forbidden("rejection_verify", forbidden=ANSWER_KEY):
        steps = []
        for what, p20, q20, drafts, params, first, *want in cases:
            logits = as_logits(np.asarray(p20, dtype=np.float64) / 20)
            qs = [np.asarray(q, dtype=np.float64) / 20 for q in q20]
            sp = SamplingParams(**params)
            positions = list(range(first, first + len(drafts) + 1))
            case = f"(drafts {drafts}, {params}, positions {positions})"
            answers = [verify_once(rejection_verify, logits, drafts, qs, sp, positions, f"{label}{what} {case}")
                       for _ in range(3)]
            steps.append((what, logits, qs, drafts, sp, positions, case, answers, want))
        # First: the same step, the same answer. Then: the expected tokens.
        for what, logits, qs, drafts, sp, positions, case, answers, want in steps:
            assert all(a == answers[0] for a in answers), (
                f"{label}{what}: the same step gave {' then '.join(str(a) for a in answers)}: draw the coin and the "
                f"replacement from the keyed streams (keyed_uniform and gumbel_noise with params.seed and the "
                f"position), never from a fresh random generator, so that a request gets the same tokens in any batch "
                f"and after a preemption {case}")
            checks.observe(f"{label}{what}: the same answer in three runs", True, expect=True)
        for what, logits, qs, drafts, sp, positions, case, answers, want in steps:
            got = answers[0]
            checks.observe(f"{label}{what}: the tokens", got, **({"expect": want[0]} if want else {}))
            if want:
                assert got == want[0], (f"{label}{what}: " + explain(got, want[0], logits, qs, drafts, sp, positions)
                                        + f". Expected {want[0]}, got {got} {case}")
    return len(cases)
