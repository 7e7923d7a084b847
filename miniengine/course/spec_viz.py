"""Exact calculations and pictures for lecture 06 (speculative decoding).

The engine's verifiers (:mod:`miniengine.spec.verify`) act on one keyed draw at a time.  This module
computes what they do *on average*, exactly, so that a notebook can set measurements beside theory:

* :func:`total_variation`, :func:`accept_probs`: rejection sampling keeps a drafted token x with
  probability min(1, p(x)/q(x)), so it accepts with probability sum_x min(p(x), q(x)) = 1 - TV(p, q).
* :func:`gumbel_agreement`: the probability that shared Gumbel noise makes the draft and the target pick
  the same token (the coupled verifier's acceptance), exactly, and :func:`coupling_bounds`, the interval
  [(1 - TV)/(1 + TV), 1 - TV] it always lies in.
* :func:`one_step_distribution`, :func:`speculative_distribution`: the law of the tokens that rejection
  sampling emits, by enumerating every draft and every accept/reject outcome; it equals the target's own
  law (:func:`autoregressive_distribution`), which is the theorem the lecture proves.

The pictures (:func:`draw_verification`, :func:`verify_explorer`) show, for one position, the target's
distribution p, the draft's q, the acceptance probability of each token and the residual
normalize(max(0, p - q)) that a rejection draws from.  ipywidgets is imported only when the explorer is
built, and the explorer uses ``interactive_output`` (no ``Output``/``clear_output``).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from miniengine.attention import NoCacheBackend
from miniengine.sampling import SamplingParams
from miniengine.spec.verify import probs, residual


# ---------------------------------------------------------------- logits of every position


@torch.inference_mode()
def all_logits(model, ids) -> np.ndarray:
    """Float64 logits for every position of ``ids`` in one pass without a cache: row i predicts token i + 1."""
    n = len(ids)
    if n == 0:
        raise ValueError("ids must hold at least one token")
    device = model.device
    out = model(torch.as_tensor(list(ids), device=device), torch.arange(n, device=device), NoCacheBackend([n]))
    return out.double().cpu().numpy()


def distributions(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """``probs`` (the engine's: temperature, top-k, top-p, one-hot when greedy) applied to every row."""
    logits = np.atleast_2d(logits)
    return np.stack([probs(row, params) for row in logits])


# ---------------------------------------------------------------- how often a draft is kept


def _pair(p, q) -> tuple[np.ndarray, np.ndarray]:
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"p and q must be 1-D distributions of the same size, got shapes {p.shape} and {q.shape}")
    return p, q


def total_variation(p, q) -> float:
    """TV(p, q) = 1/2 sum |p - q| = 1 - sum min(p, q)."""
    p, q = _pair(p, q)
    return 0.5 * float(np.abs(p - q).sum())


def accept_probs(p, q) -> np.ndarray:
    """min(1, p(x)/q(x)) for every token x: the chance rejection sampling keeps x once the draft proposes it.
    A token the draft never proposes (q(x) = 0) gets NaN: the rule is never applied to it."""
    p, q = _pair(p, q)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), np.nan)


def gumbel_agreement(p, q) -> float:
    """P(argmax(log p + G) == argmax(log q + G)) for one shared draw of Gumbel noise G, exactly.

    Gumbel-max is an exponential race: token j wins for p when E_j / p_j is the smallest, with E_j = exp(-G_j)
    independent Exp(1).  Both pick i when E_j >= E_i * max(p_j/p_i, q_j/q_i) for every j; integrating over
    E_i gives P(both pick i) = 1 / sum_j max(p_j/p_i, q_j/q_i), for every i with p_i > 0 and q_i > 0.

    The sum is computed in O(V log V): with rho = p/q, max(p_j, q_j rho_i) is p_j when rho_j >= rho_i and
    q_j rho_i otherwise (equal on ties), so after sorting by rho, p_i times the sum is a suffix sum of p plus
    rho_i times a prefix sum of q.
    """
    p, q = _pair(p, q)
    with np.errstate(divide="ignore"):
        rho = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
    order = np.argsort(rho, kind="stable")
    ps, qs, rs = p[order], q[order], rho[order]
    suffix_p = np.cumsum(ps[::-1])[::-1]          # sum of p_j over rho_j >= rho_i (ties either way: equal terms)
    prefix_q = np.cumsum(qs) - qs                 # sum of q_j over rho_j < rho_i
    both = (ps > 0) & (qs > 0)
    return float(np.sum(ps[both] / (suffix_p[both] + rs[both] * prefix_q[both])))


def coupling_bounds(p, q) -> tuple[float, float]:
    """The interval the Gumbel coupling's agreement lies in: [(1 - TV)/(1 + TV), 1 - TV].  The upper end is
    what any coupling can reach at best (rejection sampling reaches it); the lower end is what a coupling
    without communication is guaranteed (Daliri, Musco and Suresh, 2024)."""
    tv = total_variation(p, q)
    return (1 - tv) / (1 + tv), 1 - tv


# ---------------------------------------------------------------- the law of what rejection sampling emits


def one_step_distribution(p, q) -> np.ndarray:
    """P(the verifier emits y) for one drafted token, summed over every draft x exactly: x ~ q, kept with
    probability min(1, p(x)/q(x)), else y is drawn from the residual normalize(max(0, p - q))."""
    p, q = _pair(p, q)
    keep = np.nan_to_num(accept_probs(p, q))
    rejected = float(np.sum(q * (1 - keep)))
    return q * keep + rejected * residual(p, q)


def speculative_distribution(p_next, q_next, gamma: int, length: int) -> dict[tuple[int, ...], float]:
    """The exact law of the first ``length`` tokens that speculative sampling with rejection emits.

    ``p_next(prefix)`` and ``q_next(prefix)`` give the target's and the draft's next-token distributions after
    a tuple of tokens.  Every step drafts up to ``gamma`` tokens from q; each is kept with probability
    min(1, p/q); the first rejected one is replaced by a draw from the residual, and if all are kept a bonus
    token is drawn from p.  Every branch (every draft, every accept or reject) is enumerated, with its
    probability, until ``length`` tokens are out.
    """
    if gamma < 1 or length < 1:
        raise ValueError(f"gamma and length must be >= 1, got {gamma} and {length}")
    law: dict[tuple[int, ...], float] = defaultdict(float)

    def step(prefix: tuple[int, ...], weight: float) -> None:
        if len(prefix) >= length:
            law[prefix[:length]] += weight
            return
        draft(prefix, 0, weight)

    def draft(ctx: tuple[int, ...], kept: int, weight: float) -> None:
        if len(ctx) >= length:  # what comes later cannot change the first `length` tokens
            law[ctx[:length]] += weight
            return
        p = np.asarray(p_next(ctx), dtype=np.float64)
        if kept == gamma:  # every draft kept: the target's bonus token, then the next step
            for y in np.flatnonzero(p):
                step(ctx + (int(y),), weight * p[y])
            return
        q = np.asarray(q_next(ctx), dtype=np.float64)
        keep = np.nan_to_num(accept_probs(p, q))
        for x in np.flatnonzero(q * keep):
            draft(ctx + (int(x),), kept + 1, weight * q[x] * keep[x])
        rejected = float(np.sum(q * (1 - keep)))
        if rejected > 0:
            r = residual(p, q)
            for y in np.flatnonzero(r):
                step(ctx + (int(y),), weight * rejected * r[y])

    step((), 1.0)
    return dict(law)


def autoregressive_distribution(p_next, length: int) -> dict[tuple[int, ...], float]:
    """The target's own law of its first ``length`` tokens: the product of p_next along each sequence."""
    law = {(): 1.0}
    for _ in range(length):
        grown = {}
        for prefix, w in law.items():
            p = np.asarray(p_next(prefix), dtype=np.float64)
            for y in np.flatnonzero(p):
                grown[prefix + (int(y),)] = w * p[y]
        law = grown
    return law


# ---------------------------------------------------------------- pictures


def token_label(tok, token_id: int) -> str:
    """A token's text, readable on an axis: newlines as ↵, spaces as ·, tabs as →."""
    text = tok.decode([int(token_id)])
    return text.replace("\n", "↵").replace(" ", "·").replace("\t", "→") or f"<{int(token_id)}>"


def top_tokens(p, q, top: int = 12) -> np.ndarray:
    """The tokens worth drawing: the most likely under p or under q, ordered by p, then by q."""
    p, q = _pair(p, q)
    k = min(top, p.size)
    pick = np.union1d(np.argsort(-p, kind="stable")[:k], np.argsort(-q, kind="stable")[:k])
    order = np.lexsort((-q[pick], -p[pick]))
    return pick[order][:top]


def draw_verification(p, q, labels, top: int = 12, axes=None, title: str | None = None):
    """Three panels for one position: p against q, the acceptance probability min(1, p/q) of each drafted
    token, and the residual a rejection draws from.  ``labels[i]`` names token i (a list or a function)."""
    import matplotlib.pyplot as plt

    p, q = _pair(p, q)
    name = labels if callable(labels) else (lambda i: labels[i])
    ids = top_tokens(p, q, top)
    keep = accept_probs(p, q)[ids]
    res = residual(p, q)
    tv = total_variation(p, q)
    if axes is None:
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    else:
        fig = axes[0].figure
    x = np.arange(len(ids))
    ticks = [name(int(i)) for i in ids]
    a1, a2, a3 = axes
    a1.bar(x - 0.2, p[ids], 0.4, color="tab:blue", label="p (target)")
    a1.bar(x + 0.2, q[ids], 0.4, color="tab:orange", label="q (draft)")
    a1.set_ylabel("probability")
    a1.set_title(f"p and q: 1 - TV = {1 - tv:.3f} (mass both give)", fontsize=9)
    a1.legend(fontsize=8)
    shown = np.nan_to_num(keep, nan=0.0)
    colors = ["tab:green" if k >= 1 else "tab:olive" for k in shown]
    a2.bar(x, shown, 0.6, color=colors)
    for xi, k in zip(x, keep):
        if np.isnan(k):
            a2.text(xi, 0.02, "q=0", ha="center", fontsize=7, rotation=90)
    a2.set_ylim(0, 1.05)
    a2.set_ylabel("min(1, p/q)")
    a2.set_title("chance a drafted token is kept (green: always)", fontsize=9)
    a3.bar(x, res[ids], 0.6, color="tab:red")
    a3.set_ylabel("probability")
    shown_mass = res[ids].sum()
    a3.set_title(f"residual normalize(max(0, p - q)) ({shown_mass:.0%} of it shown)", fontsize=9)
    for ax in axes:
        ax.set_xticks(x, ticks, rotation=60, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def verify_explorer(target_logits: np.ndarray, draft_logits: np.ndarray, labels, context=None, top: int = 12):
    """Sliders for the position (a row of the precomputed logits), the temperature and top-k, drawn through
    ``interactive_output``.  ``context(position)`` may return a string shown above the chart (the text
    the two models have read)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    n = min(len(target_logits), len(draft_logits))
    controls = {
        "position": widgets.IntSlider(value=n // 2, min=0, max=n - 1, description="row", continuous_update=False),
        "temperature": widgets.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.1, description="temperature",
                                           continuous_update=False),
        "top_k": widgets.IntSlider(value=0, min=0, max=100, step=5, description="top-k (0: off)",
                                   continuous_update=False),
    }

    def show(position, temperature, top_k):
        params = SamplingParams(temperature=float(temperature), top_k=int(top_k))
        p, q = probs(target_logits[position], params), probs(draft_logits[position], params)
        if context is not None:
            print(context(position))
        lo, hi = coupling_bounds(p, q)
        print(f"rejection sampling keeps a draft here with probability {hi:.3f}; the coupled verifier with "
              f"{gumbel_agreement(p, q):.3f} (at least {lo:.3f})")
        draw_verification(p, q, labels, top)
        plt.show()

    out = widgets.interactive_output(show, controls)
    return widgets.VBox([widgets.HBox(list(controls.values())), out])
