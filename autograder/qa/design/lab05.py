"""Lab 05's design part, the Lab 01 search on paged memory: honest designs, and the baseline.

Instructor-only (autograder/qa/design/__init__.py says why).  The contract, as the lab states it (its Task 4):
``paged_search(session, prompt_ids, max_tokens, budget, eos_token_id)`` returns one completion, as Lab 01's
``search_completion`` does, driving a ``SearchSession`` (autograder/labs/lab05/search.py): ``start``, ``fork``,
``copy``, ``extend``, ``free``.  The harness counts the passes and the blocks; ``python -m
autograder.qa.design.lab05`` measures every design below on the visible and hidden prompts of Lab 01's search.

Every design is a beam search on summed log-probabilities ranked as Lab 01's reference ranks them, so all of them
return the completions Lab 01's beam of the same width returns; they differ in how they hold the candidates' memory.
"""
from __future__ import annotations

import numpy as np

BASELINE_NAME = "a width-4 beam search on the unshared layout (copy, not fork)"

# Lab 01's beam search on the session with every child given its own copy of its parent's blocks, as a contiguous
# cache holds them: the right completions and quality, and the memory the design part is about. It must fail the
# memory target (its mean peak is the target's baseline, 23 blocks on both prompt sets).
BASELINE = {"design-paged-search": '''\
def paged_search(session, prompt_ids, max_tokens, budget, eos_token_id):
    """The baseline: Lab 01's width-4 beam, each candidate with private copies of its blocks (the unshared layout)."""
    width = budget if max_tokens == 1 else (budget - 1) // (max_tokens - 1)
    root, logp = session.start(prompt_ids)
    live, finished, rows = [(root, [], 0.0)], [], logp[None, :]
    for step in range(max_tokens):
        sums = (np.array([s for _, _, s in live])[:, None] + rows).ravel()
        chosen = []
        for flat in np.argsort(-sums, kind="stable"):
            parent, token = divmod(int(flat), rows.shape[1])
            if token == eos_token_id:
                finished.append((live[parent][1] + [token], float(sums[flat]) / (len(live[parent][1]) + 1)))
            elif len(chosen) < width:
                chosen.append((parent, token, float(sums[flat])))
            else:
                break
        if step == max_tokens - 1:
            finished += [(live[p][1] + [t], s / (len(live[p][1]) + 1)) for p, t, s in chosen]
            break
        kept = {p for p, _, _ in chosen}
        for i, (cand, _, _) in enumerate(live):
            if i not in kept:
                session.free(cand)
        used, nxt = set(), []
        for p, t, s in chosen:
            cand = live[p][0] if p not in used else session.copy(live[p][0])
            used.add(p)
            nxt.append((cand, live[p][1] + [t], s))
        rows = session.extend([c for c, _, _ in nxt], [tokens[-1] for _, tokens, _ in nxt])
        live = nxt
    for cand, _, _ in live:
        session.free(cand)
    return max(finished, key=lambda h: h[1])[0]
'''}
MUST_FAIL = ["design-paged-visible", "design-paged-hidden"]


def _beam(session, prompt_ids, max_tokens, budget, eos_token_id, width=None, share="fork", lazy=False, within=None):
    """A beam search on ``session``: ``share`` is how a second child of a candidate gets its memory ("fork" shares
    every block, "copy" copies them); ``lazy`` frees dropped candidates only after the next step ran, not before it;
    ``within``: drop candidates more than that many nats behind the best (a pruned beam)."""
    if width is None:
        width = budget if max_tokens == 1 else (budget - 1) // (max_tokens - 1)
    root, logp = session.start(prompt_ids)
    live, finished = [(root, [], 0.0)], []  # (candidate, tokens, summed log-probability)
    rows = logp[None, :]
    for step in range(max_tokens):
        sums = (np.array([s for _, _, s in live])[:, None] + rows).ravel()
        chosen = []  # (parent index, token, sum), best first
        for flat in np.argsort(-sums, kind="stable"):
            parent, token = divmod(int(flat), rows.shape[1])
            total = float(sums[flat])
            if token == eos_token_id:
                finished.append((live[parent][1] + [token], total / (len(live[parent][1]) + 1)))
            elif len(chosen) < width and (within is None or not chosen or total >= chosen[0][2] - within):
                chosen.append((parent, token, total))
            elif len(chosen) >= width or within is not None:
                break
        if step == max_tokens - 1 or not chosen:
            finished += [(live[p][1] + [t], s / (len(live[p][1]) + 1)) for p, t, s in chosen]
            break
        children = {p: 0 for p, _, _ in chosen}
        dropped = [c for i, (c, _, _) in enumerate(live) if i not in children]
        if not lazy:
            for c in dropped:
                session.free(c)
        nxt = []
        for p, t, s in chosen:
            cand = live[p][0]
            if children[p]:  # the parent's own candidate goes to its first child; the others get new ones
                cand = session.fork(cand) if share == "fork" else session.copy(cand)
            children[p] += 1
            nxt.append((cand, live[p][1] + [t], s))
        rows = session.extend([c for c, _, _ in nxt], [tk[-1] for _, tk, _ in nxt])
        if lazy:
            for c in dropped:
                session.free(c)
        live = nxt
    for c in {c for c, _, _ in live}:
        session.free(c)
    return max(finished, key=lambda h: h[1])[0]


def reference(session, prompt_ids, max_tokens, budget, eos_token_id):
    return _beam(session, prompt_ids, max_tokens, budget, eos_token_id)


DESIGNS = {
    "reference: beam 4, forks, dropped candidates freed before the step": reference,
    "beam 4, forks, dropped candidates freed after the step": lambda *a: _beam(*a, lazy=True),
    "beam 3, forks": lambda *a: _beam(*a, width=3),
    "pruned beam 4 (within 2 nats), forks": lambda *a: _beam(*a, within=2.0),
    "beam 4, copies (the unshared layout)": lambda *a: _beam(*a, share="copy"),
    "beam 4, copies, freed after the step": lambda *a: _beam(*a, share="copy", lazy=True),
    "greedy (beam 1)": lambda *a: _beam(*a, width=1),
}


def measure() -> None:
    """Every design on the visible and hidden prompts of Lab 01's search: mean peak blocks, mean normalised
    log-likelihood, most passes (the table in the lab's closing note; the targets are set from it)."""
    import json

    import torch

    import autograder.notebook_checks as checks
    from autograder.labs.lab01 import search as lab01
    from autograder.labs.lab05 import search
    from autograder.hidden_outputs import HIDDEN_DIR

    torch.set_num_threads(1)
    model = checks.load_model(torch.float64)
    sets = {"visible": lab01.visible_search(), "hidden": json.loads((HIDDEN_DIR / "lab01_search.json").read_text())}
    for name, design in DESIGNS.items():
        cells = []
        for data in sets.values():
            peaks, scores, passes = [], [], []
            for case in data["cases"]:
                p = case["params"]
                tokens, n, peak, left = search.run_paged(design, model, case["prompt_token_ids"], p["max_tokens"],
                                                         p["budget"], data["eos_token_id"], case["name"])
                assert left == 0, f"{name} leaked {left} blocks"
                peaks.append(peak)
                passes.append(n)
                scores.append(lab01.mean_log_likelihood(model, case["prompt_token_ids"], tokens))
            cells.append(f"{np.mean(peaks):6.2f} blocks, {np.mean(scores):.4f}, {max(passes)} passes")
        print(f"{name:<66} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    measure()
