"""Screening (miniengine/README.md, The invariant): how far a sampling step is from a tie float32 could tip.

  * greedy: at every step the top-1 and top-2 logits differ by at least GAP;
  * sampled: the top-1 and top-2 Gumbel-perturbed scores differ by at least GAP,
    and no token within CUTOFF of the top-k or top-p boundary (whose fate a
    float32 implementation could decide differently) wins or comes within GAP.
A sampled case that fails is retried with the next seed, up to SEED_TRIES seeds; a case that still fails is
cut just before its first near-tie, and dropped if that leaves fewer than MIN_TOKENS tokens
(:mod:`miniengine.course.golden.cases` does the retries and cuts).
"""
from __future__ import annotations

import numpy as np

from miniengine.logits_processors import apply_penalties, min_p_mask
from miniengine.sampling import SamplingParams, gumbel_noise, softmax, top_k_mask

GAP = 1e-3
CUTOFF = 1e-4
MIN_TOKENS = 8  # a greedy case cut shorter than this is dropped
SEED_TRIES = 6


def step_margins(logits: np.ndarray, params: SamplingParams, position: int) -> dict:
    """How far one sampling step is from a tie that float32 rounding could tip.

    greedy: the gap between the top two logits.  Sampled: tokens within CUTOFF
    of the top-k or top-p boundary are *ambiguous* (another correct
    implementation may keep or drop them); the step is safe when the winner
    over the kept and ambiguous tokens is not itself ambiguous, and "gap" is its
    lead over the runner-up among them (0 when the winner is ambiguous).
    """
    logits = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        top2 = np.sort(logits)[-2:]
        return {"gap": float(top2[1] - top2[0]), "ambiguous": 0}
    scaled = logits / params.temperature
    ambiguous = np.zeros(logits.shape, dtype=bool)
    if params.min_p > 0:  # vLLM's order: min_p on the scaled logits first, then top-k and top-p on what it keeps
        ambiguous |= np.abs(scaled - scaled.max() - np.log(params.min_p)) < CUTOFF
        scaled = np.where(min_p_mask(logits, params), scaled, -np.inf)
    keep = top_k_mask(scaled, params.top_k)
    if 0 < params.top_k < logits.size:
        s = np.sort(scaled)[::-1]
        if np.isfinite(s[params.top_k]) and s[params.top_k - 1] - s[params.top_k] < CUTOFF:  # k-th, (k+1)-th tie
            for v in (s[params.top_k - 1], s[params.top_k]):
                ambiguous |= np.abs(scaled - v) < CUTOFF
    if params.top_p < 1:
        probs = softmax(np.where(keep, scaled, -np.inf))
        order = np.argsort(-probs, kind="stable")
        mass_before = np.empty_like(probs)
        mass_before[order] = np.cumsum(probs[order]) - probs[order]
        keep &= mass_before < params.top_p
        ambiguous |= np.abs(mass_before - params.top_p) < CUTOFF
    scores = np.where(keep | ambiguous, scaled + gumbel_noise(params.seed, position, logits.size), -np.inf)
    winner = int(np.argmax(scores))
    top2 = np.sort(scores)[-2:]
    gap = 0.0 if ambiguous[winner] else float(top2[1] - top2[0])
    return {"gap": gap, "ambiguous": int(ambiguous.sum())}


def first_unsafe_step(completion, params: SamplingParams) -> tuple[int | None, dict]:
    """Index of the first step that fails screening (None if all pass), the smallest gap and the most ambiguous tokens."""
    worst = {"gap": np.inf, "ambiguous": 0}
    for step, logits in enumerate(completion.logits):
        logits = logits.numpy()
        if params.processes_logits:  # the penalties move the logits the sampler sees, from the tokens so far
            logits = apply_penalties(logits, completion.prompt_token_ids, completion.token_ids[:step], params)
        m = step_margins(logits, params, len(completion.prompt_token_ids) + step)
        worst = {"gap": min(worst["gap"], m["gap"]), "ambiguous": max(worst["ambiguous"], m["ambiguous"])}
        if m["gap"] < GAP:
            return step, worst
    return None, worst
