"""Lab 01's tests of whole runs: Task 5 (naive_decode) and Task 6 (your engine), and the golden file they read.

Part of the lab01 harness: autograder/labs/lab01/__init__.py says what every test checks, reloads this module whenever it
is itself reloaded, and hands these functions to the test cells.
"""
from __future__ import annotations

import json

from autograder import notebook_checks as checks
from autograder.labs.shared import difference
from miniengine import LLM
from miniengine.layers.sampler import PerRowSampler
from miniengine.sampling import SamplingParams

SAMPLING = ("greedy", "top_k_mask", "top_p_mask")  # what sample() calls: the course's versions while it is tested
DECODING = SAMPLING + ("sample",)  # what naive_decode() calls, likewise


def visible_golden() -> dict:
    """The visible golden runs, read from their file: expected values are stored, never computed here."""
    with open(checks.VISIBLE_GOLDEN) as f:
        return json.load(f)



# ---------------------------------------------------------------- Task 5: naive_decode

def check_decode(naive_decode, ns) -> int:
    """One visible golden run of each kind, token for token; ns is the notebook's namespace, where the course's
    sampling parts are lent. Returns the number of runs."""
    checks.require_own(naive_decode, "naive_decode")
    with checks.course_parts_under(ns, *DECODING), checks.reference_forbidden("naive_decode"):
        golden = visible_golden()
        model32, tok = checks.load_model(), checks.load_tokenizer()
        chosen = checks.one_case_per_kind(golden["cases"])
        for case in chosen:
            out, _ = naive_decode(model32, case["prompt_token_ids"], SamplingParams(**case["params"]), golden["eos_token_id"])
            got, want = checks.as_tokens(out, f"{case['name']}: token_ids"), case["token_ids"]
            assert got == want, (f"{case['name']} (prompt {case['prompt']!r}, {case['params']}): "
                                 f"{difference(tok, got, want)} ({len(got)} tokens generated, {len(want)} expected)")
            checks.observe(f"{case['name']}: token_ids", got, expect=want)
    return len(chosen)


def recorded_run(naive_decode, model32, case, eos, what):
    """naive_decode on one case through a model that records its calls: (tokens, tokens processed, the calls)."""
    with checks.RecordingModel(model32) as recorder:
        out, processed = naive_decode(recorder, case["prompt_token_ids"], SamplingParams(**case["params"]), eos)
    return checks.as_tokens(out, f"{what}: token_ids"), processed, recorder.calls


def check_end_of_text(naive_decode, model32, case, run, at, past, what, hidden=False) -> None:
    """Pretend run[at] is the end-of-text token: decoding must stop right after its first occurrence, keeping it;
    with ignore_eos=True it is an ordinary token, and decoding runs `past` tokens beyond it, to max_tokens.

    `run` is the golden run (visible) or your own (hidden); a hidden message shows no hidden tokens.
    """
    prompt, fake_eos = case["prompt_token_ids"], run[at]
    stop = run.index(fake_eos)  # its first occurrence
    out, processed = naive_decode(model32, prompt, SamplingParams(**case["params"]), fake_eos)
    got = checks.as_tokens(out, f"{what} with eos_token_id={fake_eos}: token_ids")
    expect = {} if hidden else {"expect": run[:stop + 1]}  # a hidden run's tokens stay with the grader
    checks.observe(f"{what}, token {at} as end-of-text: token_ids", got, **expect)
    checks.observe(f"{what}, token {at} as end-of-text: tokens_processed", checks.as_count(processed, "tokens_processed"),
                   expect=checks.tokens_processed(len(prompt), stop + 1))
    if hidden:
        assert got == run[:stop + 1], (f"{what} with eos_token_id={fake_eos}: expected your run's first "
                                       f"{stop + 1} token(s), up to and including the end-of-text token; got {len(got)}")
    else:
        assert got == run[:stop + 1], (f"{what} with eos_token_id={fake_eos}: expected the {stop + 1} golden "
                                       f"token(s) up to and including the end-of-text token, got {len(got)}: {got}")
    assert checks.as_count(processed, "tokens_processed") == checks.tokens_processed(len(prompt), stop + 1), (
        f"{what} with eos_token_id={fake_eos}: tokens_processed should be "
        f"{checks.tokens_processed(len(prompt), stop + 1)}, got {processed}")
    n = stop + past
    params = SamplingParams(**dict(case["params"], max_tokens=n, ignore_eos=True))
    if hidden:
        got = checks.as_tokens(naive_decode(model32, prompt, params, fake_eos)[0], f"{what} with ignore_eos=True: token_ids")
        checks.observe(f"{what}, token {at} as end-of-text, ignore_eos=True: token_ids", got)
        assert len(got) == n and got == run[:n], (
            f"{what} with eos_token_id={fake_eos}, ignore_eos=True and max_tokens={n}: "
            f"expected your run's first {n} tokens, got {len(got)}")
        return
    out, processed = naive_decode(model32, prompt, params, fake_eos)
    got = checks.as_tokens(out, f"{what} with eos_token_id={fake_eos} and ignore_eos=True: token_ids")
    checks.observe(f"{what}, token {at} as end-of-text, ignore_eos=True: token_ids", got, expect=run[:n])
    checks.observe(f"{what}, token {at} as end-of-text, ignore_eos=True: tokens_processed",
                   checks.as_count(processed, "tokens_processed"), expect=checks.tokens_processed(len(prompt), n))
    assert len(got) == n and got == run[:n], (
        f"{what} with eos_token_id={fake_eos}, ignore_eos=True and max_tokens={n}: expected "
        f"the {n} golden tokens (the end-of-text token at step {stop} must not stop decoding), got {len(got)}: {got}")
    assert checks.as_count(processed, "tokens_processed") == checks.tokens_processed(len(prompt), n), (
        f"{what} with ignore_eos=True: tokens_processed should be {checks.tokens_processed(len(prompt), n)}, got {processed}")


def check_decode_steps(naive_decode, ns, at, past, max_tokens) -> None:
    """The first visible greedy run of more than 5 tokens: the whole prefix at every step, tokens processed,
    its token at step `at` as end-of-text (check_end_of_text), then max_tokens."""
    checks.require_own(naive_decode, "naive_decode")
    with checks.course_parts_under(ns, *DECODING), checks.reference_forbidden("naive_decode"):
        golden = visible_golden()
        model32 = checks.load_model()
        case = next(c for c in golden["cases"] if c["params"]["temperature"] == 0 and len(c["token_ids"]) > 5)
        prompt, want = case["prompt_token_ids"], case["token_ids"]
        got, processed, calls = recorded_run(naive_decode, model32, case, golden["eos_token_id"], case["name"])
        assert got == want, f"{case['name']}: the tokens differ from the golden run; pass the visible naive_decode tests first"
        checks.check_prefix_recompute(calls, prompt, want, case["name"])
        checks.observe(f"{case['name']}: the tokens fed to the model at each step", [c["ids"] for c in calls],
                       expect=[prompt + want[:t] for t in range(len(want))])
        processed = checks.as_count(processed, f"{case['name']}: tokens_processed")
        expected = checks.tokens_processed(len(prompt), len(want))
        checks.observe(f"{case['name']}: tokens_processed", processed, expect=expected)
        assert processed == expected == case["tokens_processed"], (
            f"{case['name']}: tokens_processed should be Σ(Lp + t) over the {len(want)} steps = {expected} "
            f"(Lp = {len(prompt)}), got {processed}")
        check_end_of_text(naive_decode, model32, case, want, at, past, case["name"])
        params = SamplingParams(**dict(case["params"], max_tokens=max_tokens))
        got = checks.as_tokens(naive_decode(model32, prompt, params, golden["eos_token_id"])[0], "token_ids")
        assert got == want[:max_tokens], f"{case['name']} with max_tokens={max_tokens}: expected {want[:max_tokens]}, got {got}"
        checks.observe(f"{case['name']} with max_tokens={max_tokens}: token_ids", got, expect=want[:max_tokens])


def report_decode(naive_decode, report, ns, at, past) -> None:
    """Hidden: every hidden case decoded with the whole prefix at each step, its tokens and tokens processed
    reported; then the longest of your greedy runs, its token at step `at` as end-of-text (check_end_of_text)."""
    checks.require_own(naive_decode, "naive_decode")
    with checks.course_parts_under(ns, *DECODING), checks.reference_forbidden("naive_decode"):
        model32, eos = checks.load_model(), report.data()["eos_token_id"]
        runs = {}
        for case in report.cases():
            what = f"hidden case {case['name']}"
            got, processed, calls = recorded_run(naive_decode, model32, case, eos, what)
            runs[case["name"]] = got
            checks.check_prefix_recompute(calls, case["prompt_token_ids"], got, what)
            checks.observe(f"{what}: the number of tokens fed to the model at each step", [c["n"] for c in calls])
            report.add("golden", case, "token_ids", got)
            report.add("golden", case, "tokens_processed", checks.as_count(processed, f"{what}: tokens_processed"))
        case = max((c for c in report.cases() if c["params"]["temperature"] == 0), key=lambda c: len(runs[c["name"]]))
        run = runs[case["name"]]
        assert len(run) > at, (f"hidden case {case['name']}: your greedy run ended after {len(run)} token(s), and the "
                               f"end-of-text test needs {at + 1}: does decoding stop only at eos_token_id or max_tokens?")
        check_end_of_text(naive_decode, model32, case, run, at, past, f"hidden case {case['name']}", hidden=True)


# ---------------------------------------------------------------- Task 6: your engine

def serve(sample, cases):
    """LLM, with your sample() as its sampler, serves every case in one batch of up to eight: its outputs."""
    llm = LLM(model=checks.load_model(), sampler=PerRowSampler(sample), max_num_seqs=8)
    return llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])


def check_engine(sample) -> int:
    """Every visible golden case served by your engine, token for token. Returns the number of runs."""
    checks.require_own(sample, "sample")
    with checks.reference_forbidden("your engine's sampler"):
        cases = visible_golden()["cases"]
        tok = checks.load_tokenizer()
        for case, out in zip(cases, serve(sample, cases)):
            got, want = checks.as_tokens(out.token_ids, f"{case['name']}: token_ids"), case["token_ids"]
            assert got == want, (f"your engine, {case['name']} ({case['params']}): {difference(tok, got, want)}. "
                                 f"Every part is yours here (sample, greedy, top_k_mask, top_p_mask): if Task 4's "
                                 f"tests pass, look at the earlier tasks")
            checks.observe(f"your engine, {case['name']}: token_ids", got, expect=want)
    return len(cases)


def report_engine(sample, report) -> None:
    """Hidden: your engine serves the hidden cases; their tokens go into the report."""
    checks.require_own(sample, "sample")
    with checks.reference_forbidden("your engine's sampler"):
        cases = report.cases()
        for case, out in zip(cases, serve(sample, cases)):
            report.add("golden", case, "token_ids", out.token_ids)
