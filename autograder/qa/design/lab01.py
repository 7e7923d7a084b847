"""Lab 01's design part, beam search on the naive loop: the float64 reference, and the baseline that must fail it.

Instructor-only (autograder/qa/design/__init__.py says why): ``publish`` never copies this package, and no shipped
module imports it.  The golden beams the lab is graded on are made from ``beam_search`` below by
autograder/qa/design/lab01_beams.py (``python -m autograder.qa.design.lab01_beams [--check]``).

The contract, as the lab states it (its Task 7):
  * a hypothesis is the generated tokens after the prompt; its *sum* is the sum of the float64 log-probabilities
    (log_softmax of the logits) of those tokens, end-of-text included; its *score* is sum / len**length_penalty,
    len = the number of generated tokens (transformers' BeamHypotheses.add divides by generated_len **
    length_penalty the same way; https://github.com/huggingface/transformers, src/transformers/generation/);
  * step t extends every live beam by every token; candidates rank by sum, highest first, ties to the better-
    ranked parent and then the lower token id; an end-of-text candidate ranked among the first beam_width
    finishes; the best beam_width candidates that are not end-of-text are the live beams of step t + 1;
  * after max_tokens steps the live beams finish too, and the beam_width best finished hypotheses by score come
    back, best first; equal scores keep the order in which they finished.
The length penalty never steers the search (all candidates of a step have the same length), only the final
ranking, as in transformers' beam search with early_stopping="never".
"""
from __future__ import annotations

import math

import numpy as np
import torch

from miniengine.attention import NoCacheBackend

BASELINE_NAME = "plain greedy decode"

# Greedy decode dressed as beam_search: one hypothesis, the argmax at every step, stopped by end-of-text.  It is
# what the course's engine can do without the design part; the beams tests must fail it.
BASELINE = {"design-beam-search": '''\
@torch.no_grad()
def beam_search(model, prompt_ids, beam_width, max_tokens, length_penalty=1.0, eos_token_id=0):
    """The course's baseline: plain greedy decode, returned as a single hypothesis."""
    device, tokens, total = model.device, [], 0.0
    for _ in range(max_tokens):
        seq = list(prompt_ids) + tokens
        n = len(seq)
        row = model(torch.tensor(seq, device=device), torch.arange(n, device=device), NoCacheBackend([n]))[-1]
        logp = torch.log_softmax(row.double(), dim=-1)
        token = int(torch.argmax(logp))
        tokens.append(token)
        total += float(logp[token])
        if token == eos_token_id:
            break
    return [(tokens, total / len(tokens) ** length_penalty)]
'''}
MUST_FAIL = ["design-beams-visible", "design-beams-hidden", "design-passes-visible", "design-passes-hidden"]


def check_arguments(beam_width, max_tokens, length_penalty) -> None:
    """The errors the lab asks for: each names the field and what it allows."""
    if isinstance(beam_width, bool) or not isinstance(beam_width, int) or beam_width < 1:
        raise ValueError(f"beam_width must be an int of at least 1, got {beam_width!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int of at least 1, got {max_tokens!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number (any sign), got {length_penalty!r}")


@torch.no_grad()
def beam_search(model, prompt_ids, beam_width, max_tokens, length_penalty=1.0, eos_token_id=0, trace=None):
    """The beam_width best hypotheses as (generated token ids, score), best first, in the model's own dtype.

    One forward pass per step, all live beams laid end to end in a ragged batch (no cache: the naive loop).
    ``trace``, a list, receives per step the first 2 * beam_width + 2 candidates in rank order as (sum, is
    end-of-text) and, last, the finished scores in rank order: what screening measures.
    """
    check_arguments(beam_width, max_tokens, length_penalty)
    prompt, device = [int(t) for t in prompt_ids], model.device
    live: list[tuple[list[int], float]] = [([], 0.0)]  # (generated tokens, sum of log-probs), best first
    finished: list[tuple[list[int], float]] = []  # (tokens, score) in the order they finished
    for _ in range(max_tokens):
        seqs = [prompt + tokens for tokens, _ in live]
        lens = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s], device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lens])
        last = torch.tensor(lens, device=device).cumsum(0) - 1
        logits = model(ids, positions, NoCacheBackend(lens), logits_indices=last)
        logp = torch.log_softmax(logits.double(), dim=-1).cpu().numpy()
        sums = (np.array([s for _, s in live])[:, None] + logp).ravel()  # row-major: parent rank, then token id
        order = np.argsort(-sums, kind="stable")  # stable: ties keep the parent's rank, then the lower id
        vocab = logp.shape[1]
        nxt = []
        for rank, flat in enumerate(order):
            parent, token = divmod(int(flat), vocab)
            hyp = (live[parent][0] + [token], float(sums[flat]))
            if token != eos_token_id:
                nxt.append(hyp)
            elif rank < beam_width:
                finished.append((hyp[0], hyp[1] / len(hyp[0]) ** length_penalty))
            if len(nxt) == beam_width:
                break
        if trace is not None:  # enough of the ranking to hold W + 1 non-end-of-text candidates
            trace.append([(float(sums[i]), int(i) % vocab == eos_token_id) for i in order[:2 * beam_width + 2]])
        live = nxt
    finished += [(tokens, s / len(tokens) ** length_penalty) for tokens, s in live]
    ranked = sorted(finished, key=lambda h: -h[1])  # stable: equal scores keep the order they finished in
    if trace is not None:
        trace.append([score for _, score in ranked[:beam_width + 1]])
    return ranked[:beam_width]
