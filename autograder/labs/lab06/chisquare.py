"""Lab 06, Task 1 against the real target: a chi-square test of the first emitted token at one position.

Reloaded by ``autograder.labs.lab06`` (see that module); the test cells call it through ``lab06``.

Besides its assertions, the test ``observe``s what it measured of your verifier (autograder/notebook_checks/ledger.py), with
the assertions' own bounds, for the grader to judge outside the notebook: the tokens emitted where p is 0, the
chi-square p-value, and how far the acceptance rate is from 1 - TV(p, q).
"""
from __future__ import annotations

import numpy as np
import torch

import autograder.notebook_checks as checks
from autograder.labs.lab06.common import ANSWER_KEY, verify_once
from miniengine import SamplingParams
from miniengine.attention import NoCacheBackend
from miniengine.model import load_model
from miniengine.sampling import STREAM_DRAFT, gumbel_noise
from miniengine.spec.verify import probs


def chi_square(counts, expected):
    """Pearson's statistic over the tokens expected at least 5 times (the rest pooled into one cell), its degrees
    of freedom and its p-value (the upper tail of the chi-square distribution, through torch.special.gammaincc)."""
    big = expected >= 5
    obs, exp = np.append(counts[big], counts[~big].sum()), np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:  # the pooled tail is too small to be a cell of its own: fold it into the last one
        obs, exp = obs[:-1].copy(), exp[:-1].copy()
        obs[-1] += counts[~big].sum()
        exp[-1] += expected[~big].sum()
    stat, dof = float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, dof, p_value


def last_rows(data, name, extra):
    """The float64 target's and draft's logits at the position after prompt `name` and `extra` tokens of the
    target's own greedy continuation (a position inside a generation), and that position's token ids."""
    case = next(c for c in data["cases"] if c["name"] == name)
    models = {who: load_model(path, dtype=torch.float64)
              for who, path in (("target", checks.TARGET), ("draft", checks.TARGET.parent / "draft"))}
    ids = list(case["prompt_token_ids"])
    with torch.no_grad():
        for _ in range(extra):
            row = models["target"](torch.tensor(ids), torch.arange(len(ids)), NoCacheBackend([len(ids)]))[-1]
            ids.append(int(row.argmax()))
        rows = {who: model(torch.tensor(ids), torch.arange(len(ids)), NoCacheBackend([len(ids)]),
                           logits_indices=torch.tensor([len(ids) - 1]))[0].numpy() for who, model in models.items()}
    return ids, rows


def lookalike(counts, p, q, agree, n, significance):
    """What a failing histogram matches among the common mistakes (accepted drafts min(p, q), then the rejections'
    mass), or None."""
    lookalikes = [
        ("min(p, q) + (1 - α) p, what resampling from p after a rejection gives: draw from the residual instead",
         np.minimum(p, q) + (1 - agree) * p),
        ("min(p, q) + (1 - α) q, what resampling from q after a rejection gives: draw from the residual instead",
         np.minimum(p, q) + (1 - agree) * q),
        ("q, the draft's own distribution: the verifier must reject drafts", q)]
    like = [name for name, d in lookalikes if chi_square(counts, n * d)[2] > significance]
    return like[0] if like else None


def check_chi_square(rejection_verify, data, name, extra, params, n, significance, label):
    """n keyed verifications (seeds 0 .. n-1) of one drafted token at one position of prompt `name` of `data` (a
    golden file's cases), after the target's own `extra` greedy tokens: the draft samples x ~ q (Gumbel-max with the
    draft's own stream, as the engine's proposer does), your verifier rules on it, and the first emitted token's
    histogram is tested against the target's distribution p there; the acceptance rate against 1 - TV(p, q)."""
    checks.require_own(rejection_verify, "rejection_verify")
    ids, rows = last_rows(data, name, extra)
    position, sp0 = len(ids), SamplingParams(**params)
    p, q = probs(rows["target"], sp0), probs(rows["draft"], sp0)
    target = np.stack([rows["target"], rows["target"]])  # γ = 1: the bonus row is never compared
    what = f"{label}{name}, position {position}, {params}"
    counts, accepted = np.zeros(p.size), 0
    with checks.reference_forbidden("rejection_verify", forbidden=ANSWER_KEY):
        for seed in range(n):
            with np.errstate(divide="ignore"):
                x = int(np.argmax(np.log(q) + gumbel_noise(seed, position, q.size, STREAM_DRAFT)))
            out = verify_once(rejection_verify, target, [x], [q], SamplingParams(**params, seed=seed),
                              [position, position + 1], f"{what}, seed {seed}, draft {x}")
            counts[out[0]] += 1
            accepted += len(out) == 2
    never = [int(y) for y in np.flatnonzero((counts > 0) & (p == 0))]
    checks.observe(f"{what}: first tokens emitted where p is 0", int(counts[p == 0].sum()), at_most=0)
    assert not never, (f"{what}: your verifier emitted token(s) {never[:5]} ({int(counts[never].sum())} times), which "
                       f"the target never emits here (p = 0 after temperature, top-k and top-p)")
    stat, dof, p_value = chi_square(counts, n * p)
    top = np.argsort(-p)[:6]
    table = ", ".join(f"{int(y)}: {int(counts[y])} vs {n * p[y]:.0f}" for y in top)
    agree = float(np.minimum(p, q).sum())
    # the assertion asks p_value > significance; at_least compares with >=, which only a p-value of exactly the
    # significance (measure zero) tells apart
    checks.observe(f"{what}: the chi-square p-value of the first tokens against p", p_value, at_least=significance)
    se = np.sqrt(agree * (1 - agree) / n)
    checks.observe(f"{what}: |acceptance rate - (1 - TV(p, q))|", float(abs(accepted / n - agree)),
                   at_most=float(4 * se))
    if p_value <= significance:
        like = lookalike(counts, p, q, agree, n, significance)
        assert False, (
            f"{what}: your first emitted tokens do not follow the target's distribution p"
            + (f"; they match {like}" if like else "")
            + f" (chi-square {stat:.1f} on {dof} degrees of freedom over {n} seeds, p-value {p_value:.2g} < "
              f"{significance}). Counts of the likeliest tokens, yours vs n·p(y): {table}. Accepted "
              f"{accepted / n:.3f} of the drafts; rejection sampling accepts 1 - TV(p, q) = {agree:.3f}")
    lead = ("the bonus token is missing (none of your answers had two tokens: after the last accepted draft comes the "
            "target's own token); " if accepted == 0 else "")
    assert abs(accepted / n - agree) <= 4 * se, (
        f"{what}: {lead}your verifier accepted {accepted / n:.3f} of the drafts, but the rule accepts with probability "
        f"sum over x of q(x) min(1, p(x)/q(x)) = 1 - TV(p, q) = {agree:.3f} (4 standard errors: {4 * se:.3f}); the "
        f"emitted tokens themselves pass the chi-square test (p-value {p_value:.2g})")
    return stat, dof, p_value, accepted / n, agree
