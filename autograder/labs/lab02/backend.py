"""Lab 02's tests of Task 3, CachedAttention. Part of the lab02 harness: lab02/__init__.py says what every test checks.

While these tests run, ContiguousKVCache is the course's class (lent in the notebook's namespace, ns), so that a
mistake in Task 2 costs only Task 2; the caches below are made from that lent class.
"""
from __future__ import annotations

import numpy as np
import torch

from autograder import notebook_checks as checks
from autograder.labs.lab02.common import ANSWER_KEY, require_own_class, visible_golden
from miniengine.sampling import SamplingParams, sample_token


@torch.no_grad()
def run_step(CachedAttention, model_, caches, feeds, what):
    """One forward pass through CachedAttention: feeds[i] are sequence i's new token ids.

    Checks positions() and advance(), and returns the last row of logits of each sequence (float64 numpy).
    """
    lengths = [checks.as_count(c.length, f"{what}: cache.length") for c in caches]
    backend = CachedAttention(caches, [len(f) for f in feeds])
    got = checks.as_tokens(backend.positions(), f"{what}: positions()")
    want = [p for n, f in zip(lengths, feeds) for p in range(n, n + len(f))]
    assert got == want, (f"{what}: with caches at lengths {lengths} and {[len(f) for f in feeds]} new tokens, "
                         f"positions() should be {want[:12]}{'...' if len(want) > 12 else ''}, got {got[:12]}")
    last = torch.tensor([len(f) for f in feeds]).cumsum(0) - 1
    logits = model_(torch.tensor([t for f in feeds for t in f]), torch.tensor(want), backend)
    assert isinstance(logits, torch.Tensor) and logits.shape[0] == len(want), f"{what}: the model returned an unexpected shape"
    backend.advance()
    after = [checks.as_count(c.length, f"{what}: cache.length") for c in caches]
    assert after == [n + len(f) for n, f in zip(lengths, feeds)], (
        f"{what}: after advance(), the caches' lengths should be {[n + len(f) for n, f in zip(lengths, feeds)]}, got {after}")
    return [logits[i].double().numpy() for i in last.tolist()]


def check_logit(row, case, t, what, tok, seen=None):
    """The logit of golden token t within 1e-4 of the golden run's; for a greedy run it must also be the largest.
    `seen` (a dict of lists) collects the logit, and the largest logit's token, for the grader."""
    want = case["token_ids"][t]
    got = float(row[want])
    assert abs(got - case["chosen_logits"][t]) <= 1e-4, (
        f"{what}, {case['name']}, step {t} ({'prefill' if t == 0 else 'decode'}): the logit of the golden token "
        f"{checks.show(tok, want)} is {got:.6f}, expected {case['chosen_logits'][t]:.6f} (tolerance 1e-4)")
    top = int(np.argmax(row))
    if case["params"]["temperature"] == 0:
        assert top == want, (f"{what}, {case['name']}, step {t}: the largest logit is {checks.show(tok, top)}, "
                             f"expected {checks.show(tok, want)}")
    if seen is not None:
        seen.setdefault("logits", []).append(got)
        seen.setdefault("top", []).append(top)


def observe_run(what, case, steps, seen) -> None:
    """The logits of the golden tokens at `steps` within 1e-4 of the golden run's; a greedy run's largest logits."""
    checks.observe(f"{what}, {case['name']}: the golden tokens' logits at steps {list(steps)}", seen["logits"],
                   expect=[case["chosen_logits"][t] for t in steps], tol=1e-4)
    if case["params"]["temperature"] == 0:
        checks.observe(f"{what}, {case['name']}: the largest logit's token at steps {list(steps)}", seen["top"],
                       expect=[case["token_ids"][t] for t in steps])


def check_positions(CachedAttention, Cache, config, lengths, new_tokens, want) -> None:
    """Caches at the given lengths, getting new_tokens each: positions() must be `want`, and advance() must add
    each sequence's new tokens to its cache's length."""
    caches = [Cache(config, 16) for _ in lengths]
    for cache, n in zip(caches, lengths):
        cache.length = n
    call = f"CachedAttention([{', '.join(f'cache at length {n}' for n in lengths)}], {list(new_tokens)}).positions()"
    backend = CachedAttention(caches, list(new_tokens))
    got = checks.as_tokens(backend.positions(), call)
    assert got == want, f"{call} should be {want}, got {got}"
    checks.observe(call, got, expect=list(want))
    backend.advance()
    after = tuple(n + k for n, k in zip(lengths, new_tokens))
    assert tuple(c.length for c in caches) == after, (
        f"after advance(), the lengths should be {after}, got ({', '.join(str(c.length) for c in caches)})")
    checks.observe(f"{call}, then advance(): the caches' lengths",
                   [checks.as_count(c.length, "cache.length") for c in caches], expect=list(after))


def check_one_sequence(CachedAttention, Cache, model32, golden, tok, steps) -> None:
    """The first visible greedy run of 6 tokens or more: its prefill, then decode steps fed the golden tokens."""
    case = [x for x in golden["cases"] if x["params"]["temperature"] == 0 and len(x["token_ids"]) >= 6][0]
    prompt, steps = case["prompt_token_ids"], min(steps, len(case["token_ids"]))
    cache = Cache(model32.config, len(prompt) + steps)
    feed, seen = prompt, {}
    for t in range(steps):
        (row,) = run_step(CachedAttention, model32, [cache], [feed], f"one sequence, step {t}")
        check_logit(row, case, t, "one sequence", tok, seen)
        feed = [case["token_ids"][t]]
    observe_run("one sequence", case, range(steps), seen)


def check_mixed_batch(CachedAttention, Cache, model32, golden, tok) -> None:
    """A greedy and two sampled visible runs, on three prompts, fed the golden tokens. Pass 0: sequences 0 and 1
    prefill. Pass 1: they decode while sequence 2 prefills. Passes 2-3: all decode."""
    long_enough = [x for x in golden["cases"] if len(x["token_ids"]) >= 6]
    trio = checks.one_case_per_kind(long_enough)[:3]
    caches = [Cache(model32.config, len(x["prompt_token_ids"]) + 4) for x in trio]
    step = lambda caches_, feeds, what: run_step(CachedAttention, model32, caches_, feeds, what)
    seen = [{}, {}, {}]
    rows = step(caches[:2], [x["prompt_token_ids"] for x in trio[:2]], "a batch, pass 0 (two prefills)")
    for i in range(2):
        check_logit(rows[i], trio[i], 0, f"a batch, pass 0 (sequence {i})", tok, seen[i])
    feeds = [[trio[0]["token_ids"][0]], [trio[1]["token_ids"][0]], trio[2]["prompt_token_ids"]]
    rows = step(caches, feeds, "a batch, pass 1 (two decodes and a prefill)")
    for i, t in enumerate((1, 1, 0)):
        check_logit(rows[i], trio[i], t, f"a batch, pass 1: two decodes and a prefill (sequence {i})", tok, seen[i])
    for p in (2, 3):
        steps = (p, p, p - 1)
        feeds = [[x["token_ids"][t - 1]] for x, t in zip(trio, steps)]
        rows = step(caches, feeds, f"a batch, pass {p}")
        for i, t in enumerate(steps):
            check_logit(rows[i], trio[i], t, f"a batch, pass {p} (sequence {i})", tok, seen[i])
    for i, (case, last) in enumerate(zip(trio, (3, 3, 2))):
        observe_run(f"a batch, sequence {i}", case, range(last + 1), seen[i])


def check_backend(CachedAttention, ContiguousKVCache, ns, positions, steps) -> None:
    """positions: a hand-made case (cache lengths, new tokens, expected positions); then `steps` steps of one
    sequence, then the mixed batch. The logits must match the golden runs'."""
    require_own_class(ContiguousKVCache, "ContiguousKVCache")
    require_own_class(CachedAttention, "CachedAttention")
    with checks.course_parts_under(ns, "ContiguousKVCache") as lent, \
            checks.reference_forbidden("CachedAttention", forbidden=ANSWER_KEY):
        golden = visible_golden()
        model32, tok = checks.load_model(), checks.load_tokenizer()
        Cache = lent["ContiguousKVCache"]
        check_positions(CachedAttention, Cache, model32.config, *positions)
        check_one_sequence(CachedAttention, Cache, model32, golden, tok, steps)
        check_mixed_batch(CachedAttention, Cache, model32, golden, tok)


def pass_label(p, n_prefill, n_decode):
    mix = [f"{n} {kind}{'s' * (n != 1)}" for n, kind in ((n_decode, "decode"), (n_prefill, "prefill")) if n]
    return f"hidden, pass {p} ({' and '.join(mix)})"


def report_backend(CachedAttention, ContiguousKVCache, report, ns, joins) -> None:
    """Hidden: the cell's cases in one batch, sequence i joining at pass joins(i); each follows its own tokens,
    chosen from your logits with the course's sample_token, until it ends. Tokens and logits are reported."""
    require_own_class(ContiguousKVCache, "ContiguousKVCache")
    require_own_class(CachedAttention, "CachedAttention")
    with checks.course_parts_under(ns, "ContiguousKVCache") as lent, \
            checks.reference_forbidden("CachedAttention", forbidden=ANSWER_KEY):
        cases, eos = report.cases(), report.data()["eos_token_id"]
        model32 = checks.load_model()
        params = [SamplingParams(**x["params"]) for x in cases]
        caches = [lent["ContiguousKVCache"](model32.config, len(x["prompt_token_ids"]) + q.max_tokens)
                  for x, q in zip(cases, params)]
        tokens, chosen, done = [[] for _ in cases], [[] for _ in cases], [False] * len(cases)
        p, fed = 0, []
        while not all(done):
            live = [i for i in range(len(cases)) if joins(i) <= p and not done[i]]
            if live:
                feeds = [tokens[i][-1:] if tokens[i] else cases[i]["prompt_token_ids"] for i in live]
                fed.append([len(f) for f in feeds])
                n_prefill = sum(not tokens[i] for i in live)
                rows = run_step(CachedAttention, model32, [caches[i] for i in live], feeds,
                                pass_label(p, n_prefill, len(live) - n_prefill))
                for i, row in zip(live, rows):
                    lp, t = len(cases[i]["prompt_token_ids"]), len(tokens[i])
                    token = sample_token(row, params[i], lp + t)
                    tokens[i].append(token)
                    chosen[i].append(float(row[token]))
                    done[i] = t + 1 >= params[i].max_tokens or (token == eos and not params[i].ignore_eos)
            p += 1
        # positions() and advance() were checked at every pass (run_step): what each pass fed, for the grader
        checks.observe("hidden: the tokens each pass fed, sequence by sequence", fed)
        for case, got, logits in zip(cases, tokens, chosen):
            report.add("golden", case, "token_ids", got)
            report.add("golden", case, "chosen_logits", logits)
