"""Lab 01's design part: the prompt files it is graded on, and the measurements its thresholds come from.

    python -m autograder.qa.design.lab01_search          # measure every design; rewrite data/golden/lab01_search.json
                                                         # and autograder/hidden/lab01_search.json
    python -m autograder.qa.design.lab01_search --check  # exit 1 if a shipped file differs from a fresh measurement

Every design of autograder/qa/design/lab01.py runs on the float32 model under the harness's own PassMeter (so each
is shown to keep its budget the way a student's search is held to it) and is scored by the harness's own float64
scorer: the numbers here are the ones the lab's test cells would print for that design.  The thresholds in the
lab's test cells were set from these (``thresholds``): greedy decoding (the baseline) plus GAIN, which the
measured designs of the beam family clear with margin on both sets, and greedy does not (its value plus BASELINE_SLACK,
rounded up to BASELINE_DECIMALS, is the test's baseline: 0 points there).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import torch

from autograder.labs.lab01.search import PassMeter, as_completion, mean_log_likelihood
from autograder.qa.design.lab01 import DESIGNS
from miniengine.course.golden import HIDDEN_DIR, HIDDEN_PROMPTS_FILE, VISIBLE_PROMPTS, dumps, model_sha256, same
from miniengine.model import load_model
from miniengine.paths import GOLDEN, REPO_ROOT, TARGET
from miniengine.tokenizer import load_tokenizer

VISIBLE_FILE = GOLDEN / "lab01_search.json"
HIDDEN_FILE = HIDDEN_DIR / "lab01_search.json"
MAX_TOKENS = 12
BUDGET = 4 * MAX_TOKENS  # four times what greedy decoding spends
GAIN = 0.10  # nats per token over greedy decoding: the target
# Eight prompts a set left the sets' means 0.06 apart for the same design; sixteen halve the noise of the mean.
# The visible ones extend the golden prompts; the hidden ones extend autograder/hidden/prompts.json (instructor-only,
# like this module: ``publish`` copies neither, and tests/autograder/test_publish.py looks for them in the edition).
VISIBLE_EXTRA = ["def binary_search(arr, target):", "class Node:\n    def __init__(self, value):",
                 "import numpy as np\n\ndef normalize(x):", "def count_words(text):",
                 "for key, value in data.items():", "def reverse_string(s):", "while True:\n    line = input()",
                 "def main():\n    args = parse_args()"]
HIDDEN_EXTRA = ["def flatten(nested):", "def gcd(a, b):", "import re\n\ndef tokenize(text):",
                "def save_json(obj, path):", "for line in open(path):\n    line = line.strip()",
                "def quick_sort(items):", "class Matrix:\n    def __init__(self, rows):",
                "class PriorityQueue:\n    def __init__(self):"]
BASELINE_DECIMALS = 2
BASELINE_SLACK = 0.005


def measure(model32, model64, cases, eos) -> dict:
    """{design: {"mean": mean normalised log-likelihood, "passes": the most any prompt used, "scores": per prompt}}."""
    out = {}
    for name, (fn, _) in DESIGNS.items():
        scores, passes = [], []
        for case in cases:
            p = case["params"]
            with PassMeter(p["budget"]) as meter:
                got = fn(model32, case["prompt_token_ids"], p["max_tokens"], p["budget"], eos)
            tokens = as_completion(got, p["max_tokens"], eos, model32.config.vocab_size, f"{name} on {case['name']}")
            scores.append(mean_log_likelihood(model64, case["prompt_token_ids"], tokens))
            passes.append(meter.passes)
        out[name] = {"mean": round(float(np.mean(scores)), 6), "passes": max(passes),
                     "scores": [round(s, 4) for s in scores]}
    return out


def thresholds(measured: dict) -> dict:
    """The target (greedy + GAIN) and the baseline (greedy, rounded up so greedy earns nothing), four decimals."""
    greedy = measured["greedy"]["mean"]
    up = 10 ** BASELINE_DECIMALS
    # BASELINE_SLACK over greedy's value, so that greedy earns nothing even where float32 ties flip one of its tokens
    return {"target": round(greedy + GAIN, 4), "baseline": math.ceil((greedy + BASELINE_SLACK) * up) / up}


def build(model_dir=TARGET) -> dict:
    torch.set_num_threads(1)  # the same sums whatever the machine's load
    model32, model64 = load_model(model_dir), load_model(model_dir, dtype=torch.float64)
    tok, eos = load_tokenizer(model_dir), model32.config.eos_token_id
    header = {
        "about": "Lab 01's search for a likely completion: the prompts, each with max_tokens and a budget of passes "
                 "(one per sequence through the model). 'measurements' are the instructors' designs "
                 "(autograder/qa/design/lab01.py): mean normalised float64 log-likelihood.",
        "model": "data/models/target",
        "model_sha256": model_sha256(model_dir),
        "eos_token_id": eos,
    }
    sets = {VISIBLE_FILE: ("v", list(VISIBLE_PROMPTS) + VISIBLE_EXTRA)}
    if HIDDEN_PROMPTS_FILE.exists():
        sets[HIDDEN_FILE] = ("h", json.loads(HIDDEN_PROMPTS_FILE.read_text())["prompts"] + HIDDEN_EXTRA)
    files = {}
    for path, (prefix, prompts) in sets.items():
        cases = [{"name": f"{prefix}{i}", "prompt": p, "prompt_token_ids": tok.encode(p).ids,
                  "params": {"max_tokens": MAX_TOKENS, "budget": BUDGET}} for i, p in enumerate(prompts)]
        measured = measure(model32, model64, cases, eos)
        files[path] = {**header, "cases": cases, "thresholds": thresholds(measured),
                       "designs": {name: what for name, (_, what) in DESIGNS.items()}, "measurements": measured}
    return files


def table(files: dict) -> str:
    lines = []
    for path, data in files.items():
        t = data["thresholds"]
        lines.append(f"{path.name} ({path.parent.name}): target {t['target']:.4f}, baseline {t['baseline']:.4f}")
        for name, m in data["measurements"].items():
            margin = m["mean"] - t["target"]
            lines.append(f"  {name:10s} mean {m['mean']:8.4f}  margin {margin:+.4f}  passes <= {m['passes']:3d}  "
                         f"{'passes' if margin >= 0 else 'partial' if m['mean'] > t['baseline'] else 'fails'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing them")
    args = p.parse_args(argv)
    files = build()
    print(table(files))
    if args.check:
        stale = [path for path, data in files.items() if not path.exists() or not same(data, json.loads(path.read_text()))]
        for path in stale:
            print(f"{path.relative_to(REPO_ROOT)} differs from a fresh measurement")
        return 1 if stale else 0
    for path, data in files.items():
        path.write_text(dumps(data))
        print(f"wrote {len(data['cases'])} cases to {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
