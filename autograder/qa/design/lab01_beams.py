"""The golden beams of lab 01's design part: the float64 reference's beams on screened prompts, visible and hidden.

    python -m autograder.qa.design.lab01_beams          # rewrite data/golden/lab01_beams.json and autograder/hidden/lab01_beams.json
    python -m autograder.qa.design.lab01_beams --check  # exit 1 if a shipped file differs from a fresh regeneration

Screening, as for the other golden data (miniengine/course/golden/screening.py), so that any correct float32
implementation returns the same beams in the same order:
  * at every step, both cuts the search makes are at least GAP from a tie: the live beams (the beam_width-th best
    candidate that is not end-of-text against the next such one) and, where an end-of-text candidate sits at
    the cut, which end-of-text candidates finish (rank beam_width - 1 against rank beam_width);
  * the first beam_width + 1 finished scores, in rank order, are at least GAP apart;
  * every returned beam has at least MIN_TOKENS tokens (a hidden token list shorter than that could turn up in
    shipped text by chance, and tests/autograder/test_publish.py looks for every one).
A case that fails is cut to a smaller max_tokens, and then tried with another end-of-text token; a prompt with
no screened case of MIN_MAX_TOKENS steps or more is dropped.

End-of-text: the model rarely writes its own in a dozen tokens, so a case names a token of the prompt's greedy
run (from its fourth step on) as its ``eos_token_id``, as lab 01's naive_decode tests do.  Among the screened
choices the generator prefers one on which the two mistakes the lab warns about change the beams: ranking
without the length penalty (the same as length_penalty=0) and extending end-of-text beams (eos_token_id=-1).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from autograder.qa.design.lab01 import beam_search
from miniengine.course.golden import GAP, HIDDEN_DIR, HIDDEN_PROMPTS_FILE, VISIBLE_PROMPTS, dumps, model_sha256, same
from miniengine.model import load_model
from miniengine.paths import GOLDEN, REPO_ROOT, TARGET
from miniengine.reference import naive_generate
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer

VISIBLE_FILE = GOLDEN / "lab01_beams.json"
HIDDEN_FILE = HIDDEN_DIR / "lab01_beams.json"
MAX_TOKENS = 12
MIN_MAX_TOKENS = 6
MIN_TOKENS = 4
EOS_FROM_STEP = 3  # a greedy token at this step or later becomes a case's end-of-text
# (beam_width, length_penalty), one per prompt in turn: widths 2 to 5, and penalties that favour long (2.0), short
# (-0.5) or no (0.0) length normalization.
CONFIGS = [(4, 1.0), (3, 2.0), (2, 0.0), (5, 0.5), (3, 1.0), (4, -0.5), (2, 1.5), (5, 1.0)]
WIDE = [(8, 1.0), (6, 2.0)]  # the hidden forward-pass cases: a loop per beam makes 6-8x the passes


def step_gap(ranked: list[tuple[float, bool]], width: int) -> float:
    """How far one step's two cuts are from a tie: the live cut (the width-th best candidate that is not
    end-of-text against the next one) and, when an end-of-text candidate sits at it, the finish cut (rank width - 1
    against rank width).  Nothing else the step decides depends on the order of the candidates."""
    live = [s for s, eos in ranked if not eos]
    gap = live[width - 1] - live[width]
    if ranked[width - 1][1] or ranked[width][1]:
        gap = min(gap, ranked[width - 1][0] - ranked[width][0])
    return gap


def margins(trace: list, width: int) -> tuple[float, float, int | None]:
    """(smallest step gap, smallest gap between neighbouring finished scores among the first width + 1, the first
    step whose gap is under GAP or None): what screening measures."""
    gaps = [step_gap(ranked, width) for ranked in trace[:-1]]
    final = trace[-1]
    final_gap = min((a - b for a, b in zip(final, final[1:])), default=float("inf"))
    return min(gaps), final_gap, next((t for t, g in enumerate(gaps) if g < GAP), None)


def screened_run(model64, prompt_ids, width, lp, eos, max_tokens):
    """The reference's beams if this case clears screening at max_tokens or a cut of it, else None.

    Returns (max_tokens, beams, step gap, final gap)."""
    n = max_tokens
    while n >= MIN_MAX_TOKENS:
        trace: list = []
        beams = beam_search(model64, prompt_ids, width, n, lp, eos, trace=trace)
        step, final, near = margins(trace, width)
        if step >= GAP and final >= GAP and min(len(ids) for ids, _ in beams) >= MIN_TOKENS:
            return n, beams, step, final
        # the steps before a near-tie do not depend on max_tokens: cut just before the first one
        n = n - 1 if near is None else min(n - 1, near)
    return None


def token_lists(beams) -> list[list[int]]:
    return [ids for ids, _ in beams]


def choose_case(model64, prompt_ids, greedy, width, lp, max_tokens):
    """The best screened case over the end-of-text choices: (eos, max_tokens, beams, step gap, final gap), or None.

    Preferred: both planted mistakes change the beams; then one of them; then any screened choice."""
    best, best_power = None, -1
    for eos in dict.fromkeys(greedy[EOS_FROM_STEP:]):  # each distinct token once, in the order the run meets them
        if eos in greedy[:EOS_FROM_STEP]:
            continue
        run = screened_run(model64, prompt_ids, width, lp, eos, max_tokens)
        if run is None:
            continue
        n, beams = run[0], run[1]
        unpenalized = lp != 0 and token_lists(beam_search(model64, prompt_ids, width, n, 0.0, eos)) != token_lists(beams)
        extended = token_lists(beam_search(model64, prompt_ids, width, n, lp, -1)) != token_lists(beams)
        power = 2 * extended + unpenalized
        if power > best_power:
            best, best_power = (eos, *run), power
        if best_power == 2 + (lp != 0):
            break
    return best


def build_cases(model64, tok, prompts: list[str], configs, prefix: str, want: int | None = None) -> list[dict]:
    """One case per prompt (until ``want`` are made), with the prompt's config in turn; where none clears
    screening, the next config, and where no config does, the prompt is dropped."""
    cases = []
    for i, prompt in enumerate(prompts):
        if want is not None and len(cases) == want:
            break
        ids = tok.encode(prompt).ids
        greedy = naive_generate(model64, [ids], SamplingParams(temperature=0, max_tokens=MAX_TOKENS), eos_token_id=-1)
        for k in range(len(configs)):
            width, lp = configs[(i + k) % len(configs)]
            chosen = choose_case(model64, ids, greedy[0].token_ids, width, lp, MAX_TOKENS)
            if chosen is not None:
                break
        else:
            print(f"  {prefix} cases: prompt {i} skipped, no screened case of {MIN_MAX_TOKENS}+ steps")
            continue
        eos, n, beams, step_gap, final_gap = chosen
        cases.append({
            "name": f"{prefix}{len(cases)}-w{width}",
            "prompt": prompt,
            "prompt_token_ids": ids,
            "params": {"beam_width": width, "max_tokens": n, "length_penalty": lp, "eos_token_id": int(eos)},
            "beams": [{"token_ids": b, "score": round(s, 9), "text": tok.decode(b)} for b, s in beams],
            "eos_text": tok.decode([int(eos)]),
            "min_margins": {"step_gap": round(step_gap, 6), "final_gap": round(final_gap, 6)},
        })
    return cases


def build(model_dir=TARGET) -> dict:
    """{path: data} for the visible file and, where the hidden prompts are at hand, the hidden one."""
    model64 = load_model(model_dir, dtype=torch.float64)
    tok = load_tokenizer(model_dir)
    header = {
        "about": "Lab 01's beam search: the float64 reference's beams on screened prompts, best first. A case's "
                 "eos_token_id is a token of the prompt's greedy run, standing in for end-of-text.",
        "model": "data/models/target",
        "model_sha256": model_sha256(model_dir),
        "screening": {"gap": GAP, "min_tokens": MIN_TOKENS,
                      "rule": "at every step the live cut and the end-of-text cut, and neighbouring "
                              "finished scores (first beam_width+1), at least gap apart"},
    }
    files = {VISIBLE_FILE: {**header, "cases": build_cases(model64, tok, VISIBLE_PROMPTS, CONFIGS, "v")}}
    if HIDDEN_PROMPTS_FILE.exists():
        hidden = json.loads(HIDDEN_PROMPTS_FILE.read_text())["prompts"]
        # the wide cases first: design-passes-hidden counts the passes of the first two (hidden_outputs's "first_two")
        cases = build_cases(model64, tok, hidden[::-1], WIDE, "wide", want=len(WIDE))  # from the last prompt back
        cases += build_cases(model64, tok, hidden, CONFIGS[3:] + CONFIGS[:3], "h")
        files[HIDDEN_FILE] = {**header, "cases": cases}
    return files


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing them")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # the same sums whatever the machine's load (BLAS reductions can split differently)
    files = build()
    if args.check:
        stale = [path for path, data in files.items() if not path.exists() or not same(data, json.loads(path.read_text()))]
        for path in stale:
            print(f"{path.relative_to(REPO_ROOT)} differs from a fresh regeneration")
        return 1 if stale else 0
    for path, data in files.items():
        path.write_text(dumps(data))
        print(f"wrote {len(data['cases'])} cases to {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
