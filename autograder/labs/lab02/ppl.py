"""Lab 02's tests of the design part, continued: the perplexity of a text through the low-bit cache, and the low-bit
cache measured and shown beside the token-exact engine. Part of the lab02 harness: lab02/__init__.py says what every test
checks, and lab02/lowbit.py how the bytes and the perplexity are measured.

The yardstick of a perplexity increase is the float32 cache's perplexity on the same windows through the same path
(``window_nlls``): a visible test cell gives it (the visible text's, from data/golden/kv_text.json), and the increase
is observed with its bound; a hidden text's stays with the grader, which judges the perplexity observed here against
it (autograder/grade/yardsticks.py), so that no figure of the hidden text enters the notebook.
"""
from __future__ import annotations

import json
import math

import torch

from autograder import notebook_checks as checks
from autograder.labs.lab02.common import require_own_class
from autograder.labs.lab02.lowbit import (CHUNK, DESIGN_KEY, PPL_BASELINE, PPL_LIMIT, VISIBLE_TEXT, Checked, advanced,
                                          allocated, fill, float32_bytes, held_tensors, new_pass, reachable_bytes,
                                          share_words, window_nlls)
from miniengine.kv import PerSequenceKV


def perplexity(nlls) -> float:
    return math.exp(sum(nlls) / len(nlls))  # every window has the same length: the mean of means is the mean


@torch.no_grad()
def check_attends_to_what_it_holds(LowBitKVCache, LowBitAttention, model, windows, what, hidden) -> None:
    """The attention reads what the cache object holds, and nothing else: after each cache's first chunk, zeroing
    every tensor of one must change the next chunk's logits, and a cache given another's tensors must give that
    other's logits."""
    kv = PerSequenceKV(LowBitKVCache, LowBitAttention, model.config, model.dtype, model.device)
    texts = [torch.tensor(windows[w][:2 * CHUNK]) for w in (0, 1, 0, 0)]  # 0: the one given 1's tensors, 2: zeroed
    seqs = [allocated(kv, 2 * CHUNK, what, hidden) for _ in texts]
    logits = []
    for p in range(2):
        if p == 1:
            tensors = [[t for t in held_tensors(s.kv) if isinstance(t, torch.Tensor)] for s in seqs]
            shared = {t.untyped_storage().data_ptr() for i in (0, 1, 3) for t in tensors[i]}
            for t in tensors[2]:
                if t.untyped_storage().data_ptr() not in shared:  # never a tensor other caches hold too
                    t.zero_()
            if [(t.shape, t.dtype) for t in tensors[0]] == [(t.shape, t.dtype) for t in tensors[1]]:
                for mine, theirs in zip(tensors[0], tensors[1]):
                    if mine is not theirs:
                        mine.copy_(theirs)
                texts[0] = texts[1]  # from now on sequence 0 continues sequence 1's text on sequence 1's tensors
        at = f"{what}, pass {p}"
        backend, positions = new_pass(kv, seqs, [CHUNK] * len(seqs), at, hidden)
        out = model(torch.cat([t[p * CHUNK:(p + 1) * CHUNK] for t in texts]), positions, Checked(backend, at, hidden))
        advanced(backend, seqs, [p * CHUNK] * len(seqs), [CHUNK] * len(seqs), at, hidden)
        logits.append(out.view(len(seqs), CHUNK, -1))
    zeroed, untouched = logits[1][2], logits[1][3]
    changed = not torch.allclose(zeroed, untouched, atol=1e-4)
    assert changed, (
        f"{what}: with every tensor of the cache zeroed after the first chunk, the second chunk's logits did not "
        f"change: LowBitAttention must attend to the K/V that LowBitKVCache holds (and the tests count), not to a "
        f"copy kept elsewhere")
    checks.observe(f"{what}: zeroing a cache's tensors after its first chunk changes the next chunk's logits", changed,
                   expect=True)
    follows = texts[0] is not texts[1] or torch.allclose(logits[1][0], logits[1][1], atol=1e-4)
    assert follows, (
        f"{what}: a cache given another cache's tensors after the first chunk did not give that cache's logits: "
        f"attention depends on something besides the tensors the cache holds (keep codes and scales in tensors "
        f"of the cache object, where the tests count them)")
    checks.observe(f"{what}: a cache given another's tensors (where their shapes agree) gives that cache's logits",
                   bool(follows), expect=True)


def check_lowbit_ppl(LowBitKVCache, LowBitAttention, windows, float32_ppl=None, what="the text",
                     hidden=False) -> tuple[float, float | None]:
    """Perplexity of the windows through your cache, against the float32 cache's on the same windows through the same
    path: full points at most PPL_LIMIT over it, a share of them down to PPL_BASELINE, none beyond (a miss is not
    raised here: the grader gives the share, ledger.credit); the attention must read what the cache holds.  A visible
    text gives float32_ppl, and the increase is observed with its target.  A hidden text's float32 perplexity never
    enters the kernel: the perplexity is observed, and the grader judges it against the instructors' file
    (autograder/grade/yardsticks.py, lab02-hidden-ppl).  Returns (perplexity, increase), the increase None for a
    hidden text."""
    require_own_class(LowBitKVCache, "LowBitKVCache")
    require_own_class(LowBitAttention, "LowBitAttention")
    if (float32_ppl is None) != hidden:
        raise ValueError("check_lowbit_ppl: a visible text gives float32_ppl; a hidden one (hidden=True) does not")
    label = f"hidden case {what}" if hidden else what
    with checks.reference_forbidden("your low-bit cache", forbidden=DESIGN_KEY):
        model = checks.load_model()
        check_attends_to_what_it_holds(LowBitKVCache, LowBitAttention, model, windows, f"{label}, windows 0 and 1",
                                       hidden)
        ppl = perplexity(window_nlls(LowBitKVCache, LowBitAttention, model, windows, label, hidden=hidden))
    assert math.isfinite(ppl), f"{label} ({len(windows)} windows of {len(windows[0])} tokens): the perplexity is {ppl}"
    if hidden:
        checks.observe(f"{label}: perplexity through your cache (the grader compares it with the float32 cache's)",
                       ppl, at_most=PPL_LIMIT, baseline=PPL_BASELINE, judge="lab02-hidden-ppl")
        print(f"{label}: perplexity {ppl:.4f} on {len(windows)} windows; the grader compares it with the float32 "
              f"cache's (target at most +{PPL_LIMIT:.1%}, none from +{PPL_BASELINE:.1%})")
        return ppl, None
    increase = ppl / float32_ppl - 1
    checks.observe(f"{label}: perplexity through your cache / the float32 cache's - 1", increase, at_most=PPL_LIMIT,
                   baseline=PPL_BASELINE)
    print(f"{label} ({len(windows)} windows of {len(windows[0])} tokens): perplexity {ppl:.4f} through your cache, "
          f"over the float32 cache's {float32_ppl:.4f} by {share_words(increase, PPL_LIMIT, PPL_BASELINE, '%')}")
    return ppl, increase


def visible_text(first: int | None = None) -> list[list[int]]:
    """The visible text's windows (token ids), from data/golden/kv_text.json: all of them, or the first `first`."""
    with open(VISIBLE_TEXT) as f:
        return [case["prompt_token_ids"] for case in json.load(f)["cases"]][:first]


# ---------------------------------------------------------------- outside the tests: measuring and showing your cache

def measure_lowbit(cache_class, backend_class, windows: int = 8) -> tuple[float, float]:
    """(bytes ratio of a full cache of the target model's shape, perplexity increase on the first `windows` visible
    windows over the float32 cache's on the same windows). `cache_class` may be a functools.partial (bits=...); a
    setting that it rejects raises its ValueError here."""
    with open(VISIBLE_TEXT) as f:
        data = json.load(f)
    if isinstance(windows, bool) or not isinstance(windows, int) or not 1 <= windows <= len(data["cases"]):
        raise ValueError(f"windows must be an integer from 1 to {len(data['cases'])}, got {windows!r}")
    model = checks.load_model()
    cache_class(model.config, 1, model.dtype, model.device)  # a setting your cache rejects raises its own ValueError
    _, seqs = fill(backend_class, cache_class, model.config, [data["window"]], "measure_lowbit", tolerance=math.inf)
    ratio = reachable_bytes([seqs[0].kv], backend_class) / float32_bytes(model.config, data["window"])  # as the tests count
    nlls = window_nlls(cache_class, backend_class, model, visible_text(windows), "measure_lowbit")
    return ratio, perplexity(nlls) / perplexity(data["float32_window_nlls"][:windows]) - 1


def golden_agreement(cache_class, backend_class, per_kind: int | None = None) -> tuple[int, int, int, int]:
    """LLM on your low-bit cache serves the visible golden cases (all, or `per_kind` of each sampler kind): (runs
    token-exact, runs, golden tokens before each run's first difference, golden tokens). Lossy: shown, never graded."""
    from miniengine import LLM
    from miniengine.sampling import SamplingParams

    cases, taken = json.loads(checks.VISIBLE_GOLDEN.read_text())["cases"], {}
    if per_kind is not None:
        kind = lambda c: c["name"].split("-", 1)[1]  # noqa: E731 - "p3-top_p" -> "top_p"
        cases = [c for c in cases if taken.setdefault(kind(c), []).append(c) is None and len(taken[kind(c)]) <= per_kind]
    model = checks.load_model()
    llm = LLM(model=model, kv=PerSequenceKV(cache_class, backend_class, model.config, model.dtype, model.device),
              max_num_seqs=4)
    outs = llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
    exact = agreed = total = 0
    for case, out in zip(cases, outs):
        got, want = list(out.token_ids), case["token_ids"]
        exact += got == want
        agreed += next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        total += len(want)
    return exact, len(cases), agreed, total
