"""Lab 01's tests (naive decode): what each test cell checks, task by task.

Every test first turns your results into plain ints, bools and lists (so an object that claims to equal
anything cannot pass), fails if your code calls the course's own sampler or decoder, and compares with the
golden runs stored in data/golden/visible.json, never with answers computed while the test runs. The hidden
tests run the same checks on prompts you have not seen; where they need the reference's tokens, they only
report yours, and the grader compares them outside your notebook.

Task 1, greedy (greedy-visible, greedy-hidden): hand-made logits, a tie going to the first largest; then every
  step of every visible greedy run, on the float64 logits of the golden prefix. Hidden: your greedy alone
  decodes hidden prompts, each step on the tokens it chose.
Task 2, top_k_mask (top-k-visible, top-k-hidden): hand-made cases with ties and -inf must give exactly the
  expected mask; on real logits the mask keeps k tokens, and no dropped logit is larger than a kept one.
Task 3, top_p_mask (top-p-visible, top-p-hidden): hand-made distributions, also shifted by a constant (softmax
  ignores it); on real logits the mask keeps the smallest set of most likely tokens whose probability reaches p.
Task 4, sample (sample-visible, sample-hidden): every step of every visible golden run, greedy and sampled, at
  its absolute position. Your greedy, top_k_mask and top_p_mask are replaced by the course's while it runs, so
  a mistake in them costs only their own task.
Task 5, naive_decode (decode-visible, decode-processed-visible, decode-hidden): one visible run of each kind,
  token for token; the whole prefix fed at every step; tokens processed = sum of (Lp + t); stopping right after
  the end-of-text token, but not with ignore_eos=True; max_tokens. The sampling parts are the course's here.
Task 6, your engine (engine-visible, engine-hidden): LLM, with your sample() as its sampler, serves every golden
  case eight requests at a time, token for token. Every part is yours here.
Task 7, search_completion (design-args-visible, design-search-visible/-hidden), the design part: see lab01/search.py.
Numbers (numbers): each answer is a finite number here; its value is checked only when graded (the hidden part
  compares it with the right value, within a tolerance, outside the kernel).
"""
from __future__ import annotations

import importlib

import numpy as np
import torch

from autograder import notebook_checks as checks
from autograder.labs.lab01 import decode as lab01_decode
from miniengine.sampling import SamplingParams

# Tasks 5 and 6 live in lab01/decode.py (this file would be too long); pristine reloads only this module, so
# this module reloads that one, and a test cell finds all of the lab's checks here, as lab.check_...
lab01_decode = importlib.reload(lab01_decode)
# Task 7 (the search, the design part) lives in lab01/search.py, reloaded the same way.
from autograder.labs.lab01 import search as lab01_search  # noqa: E402
from autograder.labs.lab01.decode import (SAMPLING, check_decode, check_decode_steps, check_engine, report_decode,  # noqa: E402
                                          report_engine, visible_golden)

lab01_search = importlib.reload(lab01_search)
from autograder.labs.lab01.search import (BigramModel, BudgetSpent, check_search, check_search_arguments,  # noqa: E402
                                          check_search_bigram, report_search)

# ---------------------------------------------------------------- shared by Tasks 1-4

def golden_steps(model64, case, steps=None):
    """(step t, the float64 logits that predict golden token t) for the first `steps` steps of a golden run."""
    return enumerate(checks.golden_logits(model64, case)[:steps])


def report_free_run(report, pick) -> None:
    """Hidden: decode the cell's hidden cases with the float64 model, each token chosen by pick(row, case, t).

    The runs follow your own tokens, so they need no golden output; the grader compares what is reported.
    """
    model64, eos = checks.load_model(torch.float64), report.data()["eos_token_id"]
    cases = report.cases()
    for case, tokens in zip(cases, checks.free_run(model64, cases, pick, eos)):
        report.add("golden", case, "token_ids", tokens)


# ---------------------------------------------------------------- Task 1: greedy

def check_greedy(greedy, cases) -> None:
    """Hand-made cases (logits, the expected id), then every step of the visible greedy runs."""
    checks.require_own(greedy, "greedy")
    with checks.reference_forbidden("greedy"):
        for logits, want in cases:
            got = checks.as_token(greedy(np.array(logits)), f"greedy({logits})")
            assert got == want, f"greedy({logits}) should be {want} (the first largest logit), got {got}"
            checks.observe(f"greedy({logits})", got, expect=want)
        golden = visible_golden()
        model64, tok = checks.load_model(torch.float64), checks.load_tokenizer()
        for case in [c for c in golden["cases"] if c["params"]["temperature"] == 0]:
            run = []
            for t, row in golden_steps(model64, case):
                got = checks.as_token(greedy(row), f"{case['name']}, step {t}: greedy(...)")
                want = case["token_ids"][t]
                assert got == want, (f"{case['name']} (prompt {case['prompt']!r}), step {t}: "
                                     f"expected {checks.show(tok, want)}, got {checks.show(tok, got)}")
                run.append(got)
            checks.observe(f"{case['name']}: greedy at every golden step", run, expect=case["token_ids"])


def report_greedy(greedy, report) -> None:
    """Hidden: greedy decodes the hidden prompts on its own; the tokens go into the report."""
    checks.require_own(greedy, "greedy")
    with checks.reference_forbidden("greedy"):
        report_free_run(report, lambda row, case, t: checks.as_token(
            greedy(row), f"hidden case {case['name']}, step {t}: greedy(...)"))


# ---------------------------------------------------------------- Task 2: top_k_mask

def check_top_k_cases(top_k_mask, cases, hidden=False) -> None:
    """Hand-made cases (logits, k, the expected mask); a hidden case is (logits, k) alone: its expected mask stays
    with the grader, and its message does not show its logits."""
    checks.require_own(top_k_mask, "top_k_mask")
    with checks.reference_forbidden("top_k_mask"):
        for i, (logits, k, *want) in enumerate(cases):
            call = f"hidden hand-made case {i}: top_k_mask(k={k})" if hidden else f"top_k_mask({logits}, k={k})"
            got = checks.as_mask(top_k_mask(np.array(logits), k), len(logits), call)
            if want:
                assert got == want[0], f"{call} should keep {want[0]}, got {got}"
            checks.observe(call, got, **({"expect": want[0]} if want else {}))


def keeps_k_largest(top_k_mask, row, k, what, hidden=False) -> None:
    """On real logits: exactly k tokens kept, each kept logit larger than every dropped one (the hidden test
    asks both in one assertion, the visible one in two, each with its own message)."""
    got = np.array(checks.as_mask(top_k_mask(row, k), row.size, f"{what}: top_k_mask" + (f"(k={k})" if hidden else "")))
    checks.observe(f"{what}: the ids top_k_mask(k={k}) keeps", np.flatnonzero(got).tolist())
    if hidden:
        assert got.sum() == k and row[got].min() > row[~got].max(), (
            f"{what}: top_k_mask(logits, k={k}) kept {got.sum()} tokens, not the {k} largest")
        return
    assert got.sum() == k, f"{what}: top_k_mask(logits, k={k}) kept {got.sum()} tokens, expected {k}"
    assert row[got].min() > row[~got].max(), f"{what}: a dropped logit is larger than a kept one"


def check_top_k_golden(top_k_mask, n_cases, n_steps) -> None:
    """The first n_steps steps of the first n_cases visible runs that use top_k, each at its run's k."""
    checks.require_own(top_k_mask, "top_k_mask")
    with checks.reference_forbidden("top_k_mask"):
        golden = visible_golden()
        model64 = checks.load_model(torch.float64)
        for case in [c for c in golden["cases"] if c["params"]["top_k"] > 0][:n_cases]:
            for t, row in golden_steps(model64, case, n_steps):
                keeps_k_largest(top_k_mask, row, case["params"]["top_k"], f"{case['name']}, step {t}")


def check_top_k_prompts(top_k_mask, cases, ks) -> None:
    """Hidden: the logits after each case's prompt, at every k in ks(vocabulary size)."""
    checks.require_own(top_k_mask, "top_k_mask")
    with checks.reference_forbidden("top_k_mask"):
        model64 = checks.load_model(torch.float64)
        for case in cases:
            row = checks.prompt_logits(model64, case)
            for k in ks(row.size):
                keeps_k_largest(top_k_mask, row, k, f"hidden case {case['name']}", hidden=True)


# ---------------------------------------------------------------- Task 3: top_p_mask

def check_top_p_cases(top_p_mask, cases, shifts=(0.0,), hidden=False) -> None:
    """Hand-made cases (probabilities, p, the expected mask), fed as log-probabilities plus each shift."""
    checks.require_own(top_p_mask, "top_p_mask")
    with checks.reference_forbidden("top_p_mask"):
        for i, (pr, p, *want) in enumerate(cases):
            for shift in shifts:  # softmax ignores a constant added to every logit
                with np.errstate(divide="ignore"):  # log(0) = -inf: a token that is never drawn
                    logits = np.log(np.array(pr)) + shift
                call = (f"hidden hand-made case {i}: top_p_mask(p={p})" if hidden
                        else f"top_p_mask(log({pr}) + {shift}, p={p})")
                got = checks.as_mask(top_p_mask(logits, p), len(pr), call)
                if want:
                    assert got == want[0], f"{call} should keep {want[0]}, got {got}"
                checks.observe(call, got, **({"expect": want[0]} if want else {}))


def keeps_nucleus(top_p_mask, row, ps, what, hidden=False) -> None:
    """On real logits, at each p: the smallest set of most likely tokens whose probability reaches p."""
    pr = np.exp(row - row.max())
    pr /= pr.sum()
    for p in ps:
        got = np.array(checks.as_mask(top_p_mask(row, p), row.size, f"{what}: top_p_mask(p={p})"))
        checks.observe(f"{what}: the ids top_p_mask(p={p}) keeps", np.flatnonzero(got).tolist())
        kept = np.sort(pr[got])
        if hidden:  # one assertion, one message
            assert (got.any() and pr[got].min() >= pr[~got].max(initial=0) and kept.sum() >= p - 1e-12
                    and kept.sum() - kept[0] < p), f"{what}: top_p_mask(p={p}) kept {got.sum()} tokens with mass {kept.sum():.4f}"
            continue
        assert got.any() and pr[got].min() >= pr[~got].max(initial=0), (
            f"{what}: top_p_mask(p={p}) dropped a token more likely than one it kept")
        assert kept.sum() >= p - 1e-12 and kept.sum() - kept[0] < p, (
            f"{what}: top_p_mask(p={p}) kept {got.sum()} tokens with mass {kept.sum():.4f}; "
            f"expected the smallest set of most likely tokens whose mass reaches {p}")


def check_top_p_golden(top_p_mask, n_cases, ps) -> None:
    """The first step of the first n_cases visible runs, at each p in ps."""
    checks.require_own(top_p_mask, "top_p_mask")
    with checks.reference_forbidden("top_p_mask"):
        golden = visible_golden()
        model64 = checks.load_model(torch.float64)
        for case in golden["cases"][:n_cases]:
            keeps_nucleus(top_p_mask, checks.golden_logits(model64, case)[0], ps, case["name"])


def check_top_p_prompts(top_p_mask, cases, ps, temperature) -> None:
    """Hidden: the logits after each case's prompt, divided by temperature, at each p in ps."""
    checks.require_own(top_p_mask, "top_p_mask")
    with checks.reference_forbidden("top_p_mask"):
        model64 = checks.load_model(torch.float64)
        for case in cases:
            row = checks.prompt_logits(model64, case) / temperature
            keeps_nucleus(top_p_mask, row, ps, f"hidden case {case['name']}", hidden=True)


# ---------------------------------------------------------------- Task 4: sample

def check_sample(sample, ns) -> int:
    """Every step of every visible golden run; ns is the notebook's namespace, where the course's parts are lent.
    Returns the number of runs."""
    checks.require_own(sample, "sample")
    with checks.course_parts_under(ns, *SAMPLING), checks.reference_forbidden("sample"):
        golden = visible_golden()
        model64, tok = checks.load_model(torch.float64), checks.load_tokenizer()
        for case in golden["cases"]:
            params, lp = SamplingParams(**case["params"]), len(case["prompt_token_ids"])
            run = []
            for t, row in golden_steps(model64, case):
                got = checks.as_token(sample(row, params, lp + t), f"{case['name']}, step {t}: sample(...)")
                want = case["token_ids"][t]
                assert got == want, (f"{case['name']} (prompt {case['prompt']!r}, {case['params']}), step {t} "
                                     f"(position {lp + t}): expected {checks.show(tok, want)}, got {checks.show(tok, got)}")
                run.append(got)
            checks.observe(f"{case['name']}: sample at every golden step", run, expect=case["token_ids"])
    return len(golden["cases"])


def report_sample(sample, report, ns) -> None:
    """Hidden: sample decodes the hidden prompts on its own, at each token's absolute position."""
    checks.require_own(sample, "sample")
    with checks.course_parts_under(ns, *SAMPLING), checks.reference_forbidden("sample"):
        report_free_run(report, lambda row, case, t: checks.as_token(
            sample(row, SamplingParams(**case["params"]), len(case["prompt_token_ids"]) + t),
            f"hidden case {case['name']}, step {t}: sample(...)"))


# ---------------------------------------------------------------- graded numbers

def _number(ns, name):
    if name not in ns:
        raise NameError(f"{name} is not defined: set it in the cell above")
    x = ns[name]
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    ok = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
    assert ok and np.isfinite(x), f"{name} should be a number (an int or a float), got {type(x).__name__} {x!r:.40}"
    return float(x)


def check_numbers(ns, names, tolerance=0.5) -> None:
    """Visible: each answer is a finite number.  Its value is checked only when graded: the answer sheet holds the
    right one, and ``check`` says so beside it (when_graded), counting no points for it."""
    for name in names:
        checks.observe(f"{name} (within {tolerance:g})", _number(ns, name), tol=tolerance, when_graded=True)


def report_numbers(ns, tolerances) -> None:
    """Hidden: each answer's value, {name: tolerance}; the grader compares it with the right value, which never
    enters the notebook."""
    for name, tolerance in tolerances.items():
        checks.observe(f"hidden: {name} (within {tolerance:g})", _number(ns, name), tol=tolerance)
