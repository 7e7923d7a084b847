"""Lab 01's design part, a search for a likely completion under a pass budget: honest designs, and the baseline.

Instructor-only (autograder/qa/design/__init__.py says why): ``publish`` never copies this package, and no shipped
module imports it.  autograder/qa/design/lab01_search.py measures every design here on the visible and hidden
prompts and writes the prompt files the lab is graded on (``python -m autograder.qa.design.lab01_search``).

The contract, as the lab states it (its Task 7): ``search_completion(model, prompt_ids, max_tokens, budget,
eos_token_id)`` returns one completion, max_tokens tokens unless it ends at end-of-text; the harness scores it with
the float64 model, as the mean log-probability per generated token (end-of-text included), and counts one pass per
sequence through the model (autograder/labs/lab01/search.py).  Every design below spends at most ``budget`` passes.
Each is a function of that signature; ``DESIGNS`` names them for the measurement.
"""
from __future__ import annotations

import numpy as np
import torch

from miniengine.attention import NoCacheBackend
from miniengine.sampling import gumbel_noise

BASELINE_NAME = "plain greedy decoding"

# Greedy decoding in the design's clothes: one pass per token, the argmax each time, max_tokens passes of any budget.
# It is what the course's engine does without the design part; the design cells must give it nothing.
BASELINE = {"design-search": '''\
@torch.no_grad()
def search_completion(model, prompt_ids, max_tokens, budget, eos_token_id):
    """The course's baseline: greedy decoding, whatever the budget."""
    device, tokens = model.device, []
    for _ in range(max_tokens):
        seq = list(prompt_ids) + tokens
        n = len(seq)
        row = model(torch.tensor(seq, device=device), torch.arange(n, device=device), NoCacheBackend([n]))[-1]
        tokens.append(int(torch.argmax(row)))
        if tokens[-1] == eos_token_id:
            break
    return tokens
'''}
MUST_FAIL = ["design-search-visible", "design-search-hidden"]


@torch.no_grad()
def last_logprobs(model, seqs: list[list[int]]) -> np.ndarray:
    """One call on a ragged batch: the float64 log-probabilities of the next token of each sequence, [len(seqs), V]."""
    device, lens = model.device, [len(s) for s in seqs]
    ids = torch.tensor([t for s in seqs for t in s], device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    last = torch.tensor(lens, device=device).cumsum(0) - 1
    rows = model(ids, positions, NoCacheBackend(lens), logits_indices=last)
    return torch.log_softmax(rows.double(), dim=-1).cpu().numpy()


def greedy(model, prompt_ids, max_tokens, budget, eos_token_id):
    tokens = []
    for _ in range(max_tokens):
        tokens.append(int(np.argmax(last_logprobs(model, [list(prompt_ids) + tokens])[0])))
        if tokens[-1] == eos_token_id:
            break
    return tokens


def beam(model, prompt_ids, max_tokens, budget, eos_token_id, width=None, prune=None, max_width=8):
    """Beam search on sums, the finished hypotheses ranked by their mean.  ``width`` None: as wide as the budget
    allows (1 + width * (max_tokens - 1) passes).  ``prune``: an adaptive width instead, every candidate within
    ``prune`` nats of the best one, at most ``max_width`` and what the budget left over the steps to come allows."""
    prompt = [int(t) for t in prompt_ids]
    if width is None:
        width = budget if max_tokens == 1 else max(1, (budget - 1) // (max_tokens - 1))
    live, finished, spent = [([], 0.0)], [], 0
    for step in range(max_tokens):
        logp = last_logprobs(model, [prompt + tokens for tokens, _ in live])
        spent += len(live)
        sums = (np.array([s for _, s in live])[:, None] + logp).ravel()
        left = max_tokens - step - 1
        cap = width if prune is None else (max(1, min(max_width, (budget - spent) // left)) if left else 1)
        best, nxt = None, []
        for flat in np.argsort(-sums, kind="stable"):
            parent, token = divmod(int(flat), logp.shape[1])
            tokens = live[parent][0] + [token]
            if token == eos_token_id:
                finished.append((tokens, sums[flat] / len(tokens)))
                continue
            best = sums[flat] if best is None else best
            if len(nxt) == cap or (prune is not None and sums[flat] < best - prune):
                break
            nxt.append((tokens, float(sums[flat])))
        live = nxt
    finished += [(tokens, s / len(tokens)) for tokens, s in live]
    return max(finished, key=lambda h: h[1])[0]


def best_of_n(model, prompt_ids, max_tokens, budget, eos_token_id, temperature=0.5):
    """Greedy, then keyed samples (gumbel_noise(seed, position)) while the budget lasts; the best by its own mean."""
    prompt, runs, seed = [int(t) for t in prompt_ids], [], 0
    while budget - sum(len(r) for r, _ in runs) >= max_tokens:
        tokens, total = [], 0.0
        for _ in range(max_tokens):
            logp = last_logprobs(model, [prompt + tokens])[0]
            noise = gumbel_noise(seed, len(prompt) + len(tokens), logp.size) if runs else 0.0
            tokens.append(int(np.argmax(logp / temperature + noise)))
            total += logp[tokens[-1]]
            if tokens[-1] == eos_token_id:
                break
        runs.append((tokens, total / len(tokens)))
        seed += 1
    return max(runs, key=lambda r: r[1])[0]


def branch_greedy(model, prompt_ids, max_tokens, budget, eos_token_id):
    """Greedy, then again from the least certain step of any run so far (its runner-up token there), greedily,
    while a whole rerun fits the budget; the best run by its mean."""
    prompt, spent, runs, tried = [int(t) for t in prompt_ids], 0, [], set()

    def extend(tokens, logps, margins):
        nonlocal spent
        while len(tokens) < max_tokens and (not tokens or tokens[-1] != eos_token_id):
            logp = last_logprobs(model, [prompt + tokens])[0]
            spent += 1
            top = np.argsort(-logp, kind="stable")[:2]
            tokens, logps = tokens + [int(top[0])], logps + [logp[top[0]]]
            margins = margins + [(logp[top[0]] - logp[top[1]], int(top[1]), logp[top[1]])]
        runs.append((tokens, logps, margins))

    extend([], [], [])
    while budget - spent >= max_tokens:
        open_ = [(m[0], r, i) for r, (_, _, ms) in enumerate(runs) for i, m in enumerate(ms) if (r, i) not in tried]
        if not open_:
            break
        _, r, i = min(open_)
        tried.add((r, i))
        tokens, logps, margins = runs[r]
        extend(tokens[:i] + [margins[i][1]], logps[:i] + [margins[i][2]], margins[:i] + [(np.inf, 0, 0.0)])
    return max(runs, key=lambda run: sum(run[1]) / len(run[0]))[0]


# name -> (function, what it is); the reference is the lab's solution (the same beam, as wide as the budget allows)
DESIGNS = {
    "greedy": (greedy, "the baseline: greedy decoding"),
    "reference": (beam, "the lab's solution: beam search as wide as the budget allows (4 at max_tokens 12, budget 48)"),
    "beam-2": (lambda *a: beam(*a, width=2), "beam search of width 2 (23 passes)"),
    "beam-3": (lambda *a: beam(*a, width=3), "beam search of width 3 (34 passes)"),
    "pruned-2": (lambda *a: beam(*a, prune=2.0), "adaptive beam: candidates within 2 nats of the best, up to 8"),
    "pruned-1": (lambda *a: beam(*a, prune=1.0), "adaptive beam: within 1 nat, up to 8 (stops early, fewer passes)"),
    "best-of-4": (best_of_n, "greedy and 3 keyed samples at temperature 0.5, the best by its own mean"),
    "branch": (branch_greedy, "greedy, then reruns from the least certain steps"),
}
