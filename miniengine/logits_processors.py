"""What changes a row of logits before the sampler draws from it, and the logprobs a request asks for.

vLLM's order, which users carry over from it: the penalties on the raw logits, then temperature, then ``min_p``,
then top-k and top-p (the sampler, :func:`miniengine.sampling.sample_token`).  :func:`process_row` does the first
three, so that any sampler (a student's too) draws from the processed row unchanged:

* ``repetition_penalty`` r (the CTRL paper's, as Hugging Face and vLLM apply it): every token seen in the prompt or
  the output so far has its logit divided by r where it is positive and multiplied by r where it is not, so r > 1
  always makes it less likely;
* ``frequency_penalty`` f and ``presence_penalty`` p (OpenAI's definition): logit -= f * count + p * (count > 0),
  where count is how often the token occurs in the output so far (not the prompt);
* ``min_p`` m: on the temperature-scaled distribution, a token is kept when its probability is at least m times the
  most likely token's; the rest get -inf.  Masking before the sampler divides by the temperature leaves -inf as it
  is, and top-k and top-p never keep a token of probability 0, so this equals applying ``min_p`` between
  temperature and top-k.  A greedy row skips it: the most likely token is always kept.

Each row is computed in float64 from its own sequence's tokens alone, so a request gets the same logits whatever
batch it runs in (batch invariance).  Hugging Face's ``MinPLogitsWarper`` runs after top-k and top-p in its
``generate``; vLLM's order, used here, applies it first, so the two can keep different tokens when both are set.
"""
from __future__ import annotations

import numpy as np

from miniengine.sampling import SamplingParams


def apply_penalties(logits: np.ndarray, prompt_ids, output_ids, params: SamplingParams) -> np.ndarray:
    """The logits after the repetition, frequency and presence penalties (a new float64 array)."""
    out = np.array(logits, dtype=np.float64)
    r = params.repetition_penalty
    if r != 1:
        seen = np.unique(np.asarray(list(prompt_ids) + list(output_ids), dtype=np.int64))
        out[seen] = np.where(out[seen] > 0, out[seen] / r, out[seen] * r)
    if params.frequency_penalty != 0 or params.presence_penalty != 0:
        counts = np.bincount(np.asarray(output_ids, dtype=np.int64), minlength=out.size)[: out.size]
        out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return out


def min_p_mask(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """True for the tokens ``min_p`` keeps: probability (at the request's temperature) >= min_p * the largest."""
    if params.min_p <= 0 or params.greedy:
        return np.ones(np.shape(logits), dtype=bool)
    scaled = np.asarray(logits, dtype=np.float64) / params.temperature
    # p_i >= m * p_max  <=>  z_i - z_max >= log(m), with no softmax to underflow
    return scaled - scaled.max() >= np.log(params.min_p)


def process_row(logits, prompt_ids, output_ids, params: SamplingParams) -> np.ndarray:
    """Penalties, then ``min_p`` (masked tokens get -inf): the row the sampler draws from, float64."""
    out = apply_penalties(logits, prompt_ids, output_ids, params)
    return np.where(min_p_mask(out, params), out, -np.inf)


def top_logprobs(logits, token_id: int, k: int) -> dict[int, float]:
    """The chosen token's log-probability and the k most likely tokens', under the model's raw distribution (the
    logits before any penalty, temperature or mask: vLLM's default).  k or k + 1 entries: the chosen token is one
    of the k or comes on top of them.  Ties are broken by the lower token id."""
    z = np.asarray(logits, dtype=np.float64)
    lp = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
    top = np.argsort(-lp, kind="stable")[:k]
    entries = {int(t): float(lp[t]) for t in top}
    entries.setdefault(int(token_id), float(lp[token_id]))
    return entries
