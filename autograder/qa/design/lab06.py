"""Lab 06's design part, a prompt-lookup proposer: honest designs, the baseline that must fail, and the measurement
that set the thresholds in autograder/labs/lab06/design.py.  Instructor-only (autograder/qa/design/__init__.py).

    python -m autograder.qa.design.lab06      # every design on the visible and the hidden prompts

Each design drafts from the latest earlier occurrence of a sequence's last n tokens (prompt lookup, as vLLM's
``ngram`` speculative method: https://docs.vllm.ai/en/latest/features/spec_decode.html), and differs in the n it
tries, the order it tries them in, and its γ rule.  All run through ``design.run_lookup``, the harness's own run:
the course's engine, the coupled verifier, greedy, 128 tokens per prompt, the engine's counts.

Measured 2026-12-03 on the 8 distinct visible golden prompts and the 8 hidden ones (tokens per target call /
rejected drafts per emitted token):

    design                                    visible          hidden
    propose nothing (plain decoding)          1.000 / 0.000    1.000 / 0.000   the baseline
    last 1-3 tokens, fixed γ=4                2.185 / 0.537    2.028 / 0.565
    last 1-3, adaptive γ ±1 in 1..8           2.143 / 0.285    1.899 / 0.377   the lab's solution
    last 1-3, adaptive γ ×2 / ÷2 in 1..8      2.153 / 0.289    1.906 / 0.366
    last 1-3, γ = accepted + 1 in 1..8        2.073 / 0.264    1.857 / 0.302
    last 1-2, fixed γ=3                       2.065 / 0.397    1.939 / 0.455
    last 1-4, fixed γ=2                       1.857 / 0.266    1.824 / 0.274
    last 2-4, adaptive γ ±1                   1.939 / 0.217    1.801 / 0.236
    last token only (shortest first), γ=4     1.996 / 0.716    1.943 / 0.649
    last 1-3, fixed γ=5                       2.283 / 0.670    2.057 / 0.715
    last 1-3, fixed γ=6                       2.346 / 0.801    2.073 / 0.877   too long: fails the waste bound
    last 1-3, fixed γ=8 (blind long)          2.413 / 1.043    2.126 / 1.096   fails the waste bound
    the last token repeated 8 times           1.004 / 7.681    1.007 / 7.655   fails both

Thresholds: at least 1.7 tokens per target call (the weakest honest design above, 1.80 on the hidden prompts, clears
it by 6%, the lab's solution by 12% hidden and 26% visible; plain decoding's 1.0 earns nothing, partial credit
between), and at most 0.8 rejected drafts per emitted token (fixed γ up to 5 passes, 0.715 at worst; a blind γ of 8
wastes 1.04 to 1.10 and fails).
"""
from __future__ import annotations

from autograder.labs.lab06 import design

BASELINE_NAME = "plain decoding (a proposer that proposes nothing)"

# The course's baseline: the proposer plug filled, nothing drafted, so every target pass emits its one token.  It
# validates its arguments as the task asks, so that only the lookup tests tell it apart.
BASELINE = {"design-proposer": '''\
class PromptLookupProposer:
    """The course's baseline: plain decoding through the proposer plug point (no drafts, ever)."""

    def __init__(self, min_n=1, max_n=3, min_gamma=1, max_gamma=8):
        for name, value, low in (("min_n", min_n, 1), ("max_n", max_n, min_n), ("min_gamma", min_gamma, 1),
                                 ("max_gamma", max_gamma, min_gamma)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int of at least {low}, got {value!r}")

    def release(self, live_seq_ids):
        pass

    def propose(self, seqs, gammas):
        return [[] for _ in seqs], [[] for _ in seqs]
'''}
MUST_FAIL = ["design-lookup-visible", "design-lookup-hidden"]


def latest_match(tokens, min_n, max_n, gamma, longest_first=True):
    """Up to gamma tokens that followed the latest earlier occurrence of the last n tokens, n tried in order."""
    order = range(max_n, min_n - 1, -1) if longest_first else range(min_n, max_n + 1)
    for n in order:
        if len(tokens) <= n:
            continue
        tail = tokens[len(tokens) - n:]
        for i in range(len(tokens) - n - 1, -1, -1):
            if tokens[i:i + n] == tail and tokens[i + n:i + n + gamma]:
                return list(tokens[i + n:i + n + gamma])
    return []


class Lookup:
    """An honest design: ``rule`` is None (fixed γ), "pm1" (+1 after a full accept, -1 after a rejection), "x2"
    (double, halve) or "k+1" (the accepted count plus one); γ stays in [min_gamma, max_gamma]."""

    def __init__(self, min_n=1, max_n=3, gamma=4, rule=None, min_gamma=1, max_gamma=8, longest_first=True):
        self.min_n, self.max_n, self.gamma, self.rule = min_n, max_n, gamma, rule
        self.min_gamma, self.max_gamma, self.longest_first = min_gamma, max_gamma, longest_first
        self.last = {}  # seq_id -> (num_tokens when drafted, the drafts, γ)

    def release(self, live_seq_ids):
        self.last = {s: v for s, v in self.last.items() if s in live_seq_ids}

    def next_gamma(self, seq):
        if seq.seq_id not in self.last:
            return self.gamma
        n0, drafts, g = self.last[seq.seq_id]
        if self.rule is None or not drafts:
            return g
        new, k = list(seq.token_ids[n0:]), 0
        while k < len(drafts) and k < len(new) and new[k] == drafts[k]:
            k += 1
        full = k == len(drafts)
        g = {"pm1": g + 1 if full else g - 1, "x2": 2 * g if full else g // 2,
             "k+1": g + 1 if full else k + 1}[self.rule]
        return max(self.min_gamma, min(self.max_gamma, g))

    def propose(self, seqs, gammas):
        drafts = []
        for seq, cap in zip(seqs, gammas):
            g = self.next_gamma(seq)
            tokens = list(seq.token_ids)
            d = latest_match(tokens, self.min_n, self.max_n, min(g, cap), self.longest_first) if cap else []
            self.last[seq.seq_id] = (seq.num_tokens, d, g)
            drafts.append(d)
        return drafts, [[None] * len(d) for d in drafts]


class Nothing:
    def release(self, live_seq_ids):
        pass

    def propose(self, seqs, gammas):
        return [[] for _ in seqs], [[] for _ in seqs]


class Repeat:
    """Blind: the last token, as many times as allowed."""

    def release(self, live_seq_ids):
        pass

    def propose(self, seqs, gammas):
        drafts = [[seq.token_ids[-1]] * g for seq, g in zip(seqs, gammas)]
        return drafts, [[None] * len(d) for d in drafts]


DESIGNS = {
    "propose nothing (plain decoding)": Nothing,
    "last 1-3 tokens, fixed γ=4": lambda: Lookup(1, 3, 4),
    "last 1-3, adaptive γ ±1 in 1..8": lambda: Lookup(1, 3, 4, "pm1"),
    "last 1-3, adaptive γ ×2 / ÷2 in 1..8": lambda: Lookup(1, 3, 4, "x2"),
    "last 1-3, γ = accepted + 1 in 1..8": lambda: Lookup(1, 3, 4, "k+1"),
    "last 1-2, fixed γ=3": lambda: Lookup(1, 2, 3),
    "last 1-4, fixed γ=2": lambda: Lookup(1, 4, 2),
    "last 2-4, adaptive γ ±1": lambda: Lookup(2, 4, 4, "pm1"),
    "last token only (shortest first), γ=4": lambda: Lookup(1, 3, 4, longest_first=False),
    "last 1-3, fixed γ=5": lambda: Lookup(1, 3, 5),
    "last 1-3, fixed γ=6": lambda: Lookup(1, 3, 6),
    "last 1-3, fixed γ=8 (blind long)": lambda: Lookup(1, 3, 8),
    "the last token repeated 8 times": Repeat,
}


def measure(designs=DESIGNS) -> dict:
    """{design: (visible run, hidden run)}, each run design.run_lookup's counts; prints the table."""
    import json

    from autograder import hidden_outputs
    from autograder.notebook_checks import VISIBLE_GOLDEN, load_model

    with open(VISIBLE_GOLDEN) as f:
        visible = design.prompts_of(json.load(f))
    hidden = design.prompts_of(hidden_outputs.load("golden"))
    model, out = load_model(), {}
    for name, make in designs.items():
        v, h = (design.run_lookup(model, make(), prompts, name) for prompts in (visible, hidden))
        out[name] = (v, h)
        print(f"{name:<42} {v['tokens_per_call']:.3f} / {v['rejected_per_token']:.3f}    "
              f"{h['tokens_per_call']:.3f} / {h['rejected_per_token']:.3f}", flush=True)
    return out


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    measure()
