"""Lab 02's tests of Task 4 (cached_decode) and Task 5 (your engine). Part of the lab02 harness: lab02/__init__.py says
what every test checks.

While cached_decode is tested, ContiguousKVCache and CachedAttention are the course's classes (lent in the
notebook's namespace, ns); the engine tests run your classes, inside the course's engine.
"""
from __future__ import annotations

import numpy as np
import torch

from autograder import notebook_checks as checks
from autograder.labs.lab02.common import ANSWER_KEY, ENGINE_KEY, difference, require_own_class, visible_golden
from miniengine import LLM
from miniengine.kv import PerSequenceKV
from miniengine.sampling import SamplingParams, sample_token

PARTS = ("ContiguousKVCache", "CachedAttention")  # what cached_decode() calls: the course's while it is tested


# ---------------------------------------------------------------- Task 4: cached_decode

def logit_rows(rows, n_tokens, vocab, what):
    """The student's logits as float64 arrays of shape (vocab,), one per generated token."""
    if isinstance(rows, torch.Tensor) and rows.dim() == 2:
        rows = list(rows)
    assert isinstance(rows, (list, tuple)), f"{what}: logits should be a list of 1-D tensors, got {type(rows).__name__}"
    assert len(rows) == n_tokens, f"{what}: expected one logits row per generated token ({n_tokens}), got {len(rows)}"
    out = []
    for t, row in enumerate(rows):
        if isinstance(row, torch.Tensor):
            row = row.detach().cpu().double().numpy()
        assert isinstance(row, np.ndarray) and row.shape == (vocab,), (
            f"{what}: logits[{t}] should be a 1-D tensor of {vocab} logits, got {type(row).__name__} "
            f"of shape {getattr(row, 'shape', '?')}")
        out.append(row.astype(np.float64))
    return out


def decoded(cached_decode, model_, case, eos, what):
    """cached_decode on one case: (its three results, the tokens as plain ints)."""
    out = cached_decode(model_, case["prompt_token_ids"], SamplingParams(**case["params"]), eos)
    assert isinstance(out, tuple) and len(out) == 3, f"{what}: cached_decode should return (token_ids, tokens_processed, logits)"
    return out, checks.as_tokens(out[0], f"{what}: token_ids")


def check_processed(processed, lp, n, what) -> None:
    """A cached decode feeds the prompt once, then one token per step but the last: Lp + Lo - 1 tokens."""
    processed = checks.as_count(processed, f"{what}: tokens_processed")
    assert processed == lp + n - 1, (f"{what}: tokens_processed should be Lp + Lo - 1 = {lp} + {n} - 1 "
                                     f"= {lp + n - 1}, got {processed}")
    checks.observe(f"{what}: tokens_processed", processed, expect=lp + n - 1)


def check_golden_run(cached_decode, model_, case, eos, tok, what):
    """Decode one golden case: tokens, chosen logits and tokens processed. Returns the generated tokens."""
    out, got = decoded(cached_decode, model_, case, eos, what)
    want, p = case["token_ids"], case["params"]
    sampler = "greedy" if p["temperature"] == 0 else ", ".join(
        f"{k}={p[k]}" for k in ("temperature", "top_k", "top_p", "seed") if (k, p[k]) not in (("top_k", 0), ("top_p", 1.0)))
    assert got == want, (f"{what} (prompt {case['prompt']!r}, {sampler}): {difference(tok, got, want)} "
                         f"({len(got)} tokens generated, {len(want)} expected)"
                         + ("" if p["temperature"] == 0 else
                            "; if greedy runs pass, check sample_token's position: cache.length after advance()"))
    checks.observe(f"{what}: token_ids", got, expect=want)
    rows = logit_rows(out[2], len(got), model_.config.vocab_size, what)
    for t, (row, token, expected) in enumerate(zip(rows, want, case["chosen_logits"])):
        assert abs(float(row[token]) - expected) <= 1e-4, (
            f"{what}, step {t}: the logit of the chosen token {checks.show(tok, token)} is {float(row[token]):.6f}, "
            f"expected {expected:.6f} (tolerance 1e-4)")
    checks.observe(f"{what}: the chosen tokens' logits", [float(row[token]) for row, token in zip(rows, want)],
                   expect=case["chosen_logits"], tol=1e-4)
    check_processed(out[1], len(case["prompt_token_ids"]), len(want), what)
    return got


def check_own_run(cached_decode, model_, case, eos, what):
    """Hidden: decode one case; each token must be the one sample_token picks from your own logits of that step.

    Returns the generated tokens and the logit of each chosen token, for the grader to compare with the reference's.
    """
    params = SamplingParams(**case["params"])
    out, got = decoded(cached_decode, model_, case, eos, what)
    vocab = model_.config.vocab_size
    rows = logit_rows(out[2], len(got), vocab, what)
    lp = len(case["prompt_token_ids"])
    for t, (row, token) in enumerate(zip(rows, got)):
        assert 0 <= token < vocab, f"{what}, step {t}: {token} is not a token id (0..{vocab - 1})"
        assert token == sample_token(row, params, lp + t), (
            f"{what}, step {t}: your token is not the one sample_token picks from your own logits[{t}] at position "
            f"Lp + {t} = {lp + t}: each step's token comes from that step's logits, sampled at its absolute position "
            f"(cache.length after advance())")
    checks.observe(f"{what}: each token is sample_token's pick from your own logits of its step", True, expect=True)
    check_processed(out[1], lp, len(got), what)
    return got, [float(row[token]) for row, token in zip(rows, got)]


def check_one_token_per_step(calls, prompt, tokens, what):
    """Call 0 feeds the prompt at positions 0..Lp-1; call t >= 1 feeds tokens[t-1] alone, at position Lp+t-1."""
    lp = len(prompt)
    assert len(calls) == len(tokens), (
        f"{what}: generated {len(tokens)} tokens with {len(calls)} model calls; cached decode makes one call per token")
    first = calls[0]
    assert first["ids"] == prompt and first["positions"] == list(range(lp)), (
        f"{what}, step 0 (prefill): expected the {lp} prompt tokens at positions 0..{lp - 1}, got {first['n']} tokens "
        f"at positions {first['positions'][:5]}{'...' if first['n'] > 5 else ''}")
    for t, call in enumerate(calls[1:], start=1):
        assert call["n"] == 1, (f"{what}, step {t}: a decode step feeds exactly one token (the one chosen at step {t - 1}), "
                                f"got {call['n']} tokens: is the cache being used?")
        assert call["ids"] == [tokens[t - 1]], f"{what}, step {t}: expected token {tokens[t - 1]} (chosen at step {t - 1}), got {call['ids']}"
        assert call["positions"] == [lp + t - 1], (
            f"{what}, step {t}: the token chosen at step {t - 1} sits at position {lp + t - 1}, got positions {call['positions']}")
        assert call["backend"] != "NoCacheBackend", f"{what}, step {t}: use your CachedAttention, not NoCacheBackend"
    checks.observe(f"{what}: the positions each model call fed", [call["positions"] for call in calls],
                   expect=[list(range(lp))] + [[lp + t - 1] for t in range(1, len(tokens))])


def check_decode(cached_decode, ns) -> list[str]:
    """One visible golden run of each kind (check_golden_run). Returns the runs' names."""
    checks.require_own(cached_decode, "cached_decode")
    with checks.course_parts_under(ns, *PARTS), checks.reference_forbidden("cached_decode", forbidden=ANSWER_KEY):
        golden = visible_golden()
        model32, tok = checks.load_model(), checks.load_tokenizer()
        chosen = checks.one_case_per_kind(golden["cases"])
        for case in chosen:
            check_golden_run(cached_decode, model32, case, golden["eos_token_id"], tok, case["name"])
    return [c["name"] for c in chosen]


def check_decode_steps(cached_decode, ns, at, max_tokens) -> None:
    """The first visible greedy run of more than 5 tokens, through a model that records its calls: prefill once,
    then one token per step; its token at step `at` as end-of-text (stop right after it, keeping it); max_tokens."""
    checks.require_own(cached_decode, "cached_decode")
    with checks.course_parts_under(ns, *PARTS), checks.reference_forbidden("cached_decode", forbidden=ANSWER_KEY):
        golden = visible_golden()
        model32, tok = checks.load_model(), checks.load_tokenizer()
        case = next(x for x in golden["cases"] if x["params"]["temperature"] == 0 and len(x["token_ids"]) > 5)
        prompt, want = case["prompt_token_ids"], case["token_ids"]
        with checks.RecordingModel(model32) as recorder:
            check_golden_run(cached_decode, recorder, case, golden["eos_token_id"], tok, case["name"])
        check_one_token_per_step(recorder.calls, prompt, want, case["name"])
        fake_eos = want[at]
        stop = want.index(fake_eos)  # its first occurrence
        out = cached_decode(model32, prompt, SamplingParams(**case["params"]), fake_eos)
        got = checks.as_tokens(out[0], f"{case['name']} with eos_token_id={fake_eos}: token_ids")
        assert got == want[:stop + 1], (f"{case['name']} with eos_token_id={fake_eos}: expected {stop + 1} tokens ending "
                                        f"with the end-of-text token, got {len(got)}: {got}")
        processed = checks.as_count(out[1], "tokens_processed")
        assert processed == len(prompt) + stop, (
            f"{case['name']} with eos_token_id={fake_eos}: tokens_processed should be {len(prompt) + stop}, got {out[1]}")
        checks.observe(f"{case['name']}, token {at} as end-of-text: token_ids, tokens_processed", [got, processed],
                       expect=[want[:stop + 1], len(prompt) + stop])
        params = SamplingParams(**dict(case["params"], max_tokens=max_tokens))
        got = checks.as_tokens(cached_decode(model32, prompt, params, golden["eos_token_id"])[0], "token_ids")
        assert got == want[:max_tokens], f"{case['name']} with max_tokens={max_tokens}: expected {want[:max_tokens]}, got {got}"
        checks.observe(f"{case['name']} with max_tokens={max_tokens}: token_ids", got, expect=want[:max_tokens])


def report_decode(cached_decode, report, ns) -> None:
    """Hidden: every case of the report (check_own_run, one token per step); tokens and chosen logits reported."""
    checks.require_own(cached_decode, "cached_decode")
    with checks.course_parts_under(ns, *PARTS), checks.reference_forbidden("cached_decode", forbidden=ANSWER_KEY):
        model32, eos = checks.load_model(), report.data()["eos_token_id"]
        for case in report.cases():
            with checks.RecordingModel(model32) as recorder:
                got, chosen = check_own_run(cached_decode, recorder, case, eos, f"hidden case {case['name']}")
            check_one_token_per_step(recorder.calls, case["prompt_token_ids"], got, f"hidden case {case['name']}")
            report.add("golden", case, "token_ids", got)
            report.add("golden", case, "chosen_logits", chosen)


# ---------------------------------------------------------------- Task 5: your engine

def serve(ContiguousKVCache, CachedAttention, cases):
    """LLM on your cache and backend serves every case, four at a time: prefills join while others decode."""
    model32 = checks.load_model()
    kv = PerSequenceKV(ContiguousKVCache, CachedAttention, model32.config, model32.dtype, model32.device)
    llm = LLM(model=model32, kv=kv, max_num_seqs=4)
    return llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])


def check_engine(ContiguousKVCache, CachedAttention) -> int:
    """Every visible golden case, token for token, and Lp + Lo - 1 tokens fed for each. Returns the number of runs."""
    for name, cls in zip(PARTS, (ContiguousKVCache, CachedAttention)):
        require_own_class(cls, name)
    with checks.reference_forbidden("your engine's KV cache", forbidden=ENGINE_KEY):
        cases = visible_golden()["cases"]
        tok = checks.load_tokenizer()
        for case, out in zip(cases, serve(ContiguousKVCache, CachedAttention, cases)):
            got, want = checks.as_tokens(out.token_ids, f"{case['name']}: token_ids"), case["token_ids"]
            assert got == want, (f"your engine, {case['name']} ({case['params']}): {difference(tok, got, want)}. The "
                                 f"engine mixes prefills and decodes in one pass: check positions() and attend() for a "
                                 f"batch like new_tokens=[1, 1, 9]")
            lp = len(case["prompt_token_ids"])
            assert out.tokens_processed == lp + len(want) - 1, (
                f"your engine, {case['name']}: fed {out.tokens_processed} tokens, expected Lp + Lo - 1 = {lp + len(want) - 1}")
            checks.observe(f"your engine, {case['name']}: token_ids, tokens fed",
                           [got, checks.as_count(out.tokens_processed, "tokens_processed")],
                           expect=[want, lp + len(want) - 1])
    return len(cases)


def report_engine(ContiguousKVCache, CachedAttention, report) -> None:
    """Hidden: your engine serves the report's cases; Lp + Lo - 1 tokens fed for each; tokens reported."""
    for name, cls in zip(PARTS, (ContiguousKVCache, CachedAttention)):
        require_own_class(cls, name)
    with checks.reference_forbidden("your engine's KV cache", forbidden=ENGINE_KEY):
        cases = report.cases()
        outs = serve(ContiguousKVCache, CachedAttention, cases)
        assert len(outs) == len(cases), f"your engine returned {len(outs)} outputs for {len(cases)} requests"
        for case, out in zip(cases, outs):
            got = checks.as_tokens(out.token_ids, f"hidden case {case['name']}: token_ids")
            lp = len(case["prompt_token_ids"])
            assert out.tokens_processed == lp + len(got) - 1, (
                f"your engine, hidden case {case['name']}: fed {out.tokens_processed} tokens for {len(got)} generated, "
                f"expected Lp + Lo - 1 = {lp + len(got) - 1}")
            checks.observe(f"your engine, hidden case {case['name']}: tokens fed - tokens generated",
                           checks.as_count(out.tokens_processed, "tokens_processed") - len(got), expect=lp - 1)
            report.add("golden", case, "token_ids", got)
