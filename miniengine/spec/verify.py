"""Speculative sampling's two verifiers: which drafted tokens the target keeps, and the token it adds.

A step drafts γ tokens x_1..x_γ with the small model, then runs the target once over
[last token, x_1, ..., x_γ].  Row j of the target's logits predicts position ``positions[j]``
(the position x_{j+1} was drafted for); row γ predicts the position after x_γ.  A verifier
returns the tokens the step emits: the accepted prefix x_1..x_k, then one token of the
target's own, so every step emits between 1 and γ + 1 tokens.

* **Coupled** (the engine's default).  The draft samples with the *same* keyed Gumbel noise the
  target's sampler uses at that position (:func:`draft_token`); the target accepts while its own
  keyed sample equals the drafted token, and at the first mismatch emits its own sample.  The
  output is token for token what plain decoding produces.
* **Rejection sampling** (Leviathan et al., 2023, https://arxiv.org/abs/2211.17192; Chen et al.,
  2023, https://arxiv.org/abs/2302.01318).  The draft samples x ~ q from a stream of its own; x is
  accepted with probability min(1, p(x) / q(x)); at the first rejection the token is drawn from
  normalize(max(0, p − q)); if all γ pass, a bonus token is drawn from p.  The output has exactly
  the target's distribution, but not the same tokens as plain decoding.

p and q are the *processed* distributions (temperature, top-k, top-p applied), in float64.
Greedy (temperature 0) makes both one-hot: both verifiers then accept exactly while the draft's
argmax equals the target's, and emit the target's argmax.
"""
from __future__ import annotations

import numpy as np

from miniengine.sampling import (STREAM_ACCEPT, STREAM_DRAFT, STREAM_RESIDUAL, SamplingParams, gumbel_noise, keyed_uniform,
                        processed_logits, sample_token)


def probs(logits, params: SamplingParams) -> np.ndarray:
    """The distribution a sampler with ``params`` draws from: one-hot at the argmax when greedy."""
    logits = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        out = np.zeros(logits.shape)
        out[int(np.argmax(logits))] = 1.0
        return out
    z = processed_logits(logits, params)
    e = np.exp(z - z.max())
    return e / e.sum()


def draft_token(logits, params: SamplingParams, position: int, verifier: str) -> tuple[int, np.ndarray | None]:
    """The draft's token for ``position`` and, for rejection sampling, the distribution q it came from."""
    if verifier == "coupled":
        return sample_token(logits, params, position), None  # the target's own key: same noise, other logits
    q = probs(logits, params)
    if params.greedy:
        return int(np.argmax(q)), q
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(q) + gumbel_noise(params.seed, position, q.size, STREAM_DRAFT))), q


def coupled_verify(target_logits, drafts, params: SamplingParams, positions) -> list[int]:
    """Accept while the target's keyed sample equals the drafted token; then emit the target's sample."""
    out = []
    for j, x in enumerate(drafts):
        y = sample_token(target_logits[j], params, positions[j])
        out.append(y)
        if y != x:
            return out
    return out + [sample_token(target_logits[len(drafts)], params, positions[len(drafts)])]


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """normalize(max(0, p − q)): where the target wants more than the draft offered."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return p if total <= 0 else r / total  # total 0 means p == q: a rejection then never happens


def sample_from(dist: np.ndarray, seed: int, position: int, stream: int) -> int:
    """A keyed draw from ``dist`` (Gumbel-max over its logarithm)."""
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(dist) + gumbel_noise(seed, position, dist.size, stream)))


def rejection_verify(target_logits, drafts, draft_probs, params: SamplingParams, positions) -> list[int]:
    """Leviathan et al.'s rule: keep x with probability min(1, p(x)/q(x)), else resample from the residual."""
    out = []
    for j, x in enumerate(drafts):
        p, q = probs(target_logits[j], params), draft_probs[j]
        u = keyed_uniform(params.seed, positions[j], 1, STREAM_ACCEPT)[0]
        if u * q[x] < p[x]:  # u < p(x)/q(x), without dividing by a q(x) that may be tiny
            out.append(int(x))
            continue
        if params.greedy:
            return out + [int(np.argmax(p))]
        return out + [sample_from(residual(p, q), params.seed, positions[j], STREAM_RESIDUAL)]
    return out + [sample_token(target_logits[len(drafts)], params, positions[len(drafts)])]
