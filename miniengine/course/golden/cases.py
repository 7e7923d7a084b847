"""Building the golden files: the float64 reference's screened cases, for every model and sampler the course tests."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from miniengine.course.golden.dataset import (CASE_KINDS, FEATURE_KINDS, FEATURES_NAME, FORK_N, FORK_PARAMS, FORK_PROMPTS, GQA_MODEL, HIDDEN_DIR,
                                              HIDDEN_FILE, HIDDEN_PROMPTS_FILE, HIDDEN_SEED_BASE, MAX_TOKENS,
                                              QUANT_KINDS, QUANT_SCHEMES, VISIBLE_FILE, VISIBLE_PROMPTS, gqa_file,
                                              quant_file)
from miniengine.course.golden.screening import CUTOFF, GAP, MIN_TOKENS, SEED_TRIES, first_unsafe_step
from miniengine.logits_processors import top_logprobs
from miniengine.model import load_model
from miniengine.paths import GOLDEN, MODELS, REPO_ROOT, TARGET
from miniengine.reference import naive_generate
from miniengine.sampling import SamplingParams, child_params
from miniengine.tokenizer import load_tokenizer


def model_sha256(model_dir: Path) -> str:
    return hashlib.sha256((Path(model_dir) / "model.safetensors").read_bytes()).hexdigest()


def build_cases(model, tok, prompts: list[str], eos_id: int, seed_base: int = 0, kinds: dict = CASE_KINDS) -> list[dict]:
    """Screened cases, one per (prompt, sampler kind), ordered by prompt then kind.

    Each kind runs all its prompts as one ragged batch (decoding is batch-invariant).
    A sampled run that meets a near-tie is retried with the next seed; after
    SEED_TRIES, the longest screened prefix (at least MIN_TOKENS) is kept by
    lowering max_tokens to just before the near-tie.
    """
    ids = [tok.encode(p).ids for p in prompts]
    chosen: dict[tuple[int, str], tuple] = {}
    for kind, fields in kinds.items():
        pending, longest = list(range(len(prompts))), {}
        for attempt in range(1 if kind == "greedy" else SEED_TRIES):
            params = [SamplingParams(max_tokens=MAX_TOKENS, seed=seed_base + 1000 * pi + attempt, **fields) for pi in pending]
            outs = naive_generate(model, [ids[pi] for pi in pending], params, eos_id, return_logits=True)
            still = []
            for pi, sp, c in zip(pending, params, outs):
                bad, worst = first_unsafe_step(c, sp)
                if bad is None:
                    chosen[pi, kind] = (sp, c, worst)
                    continue
                still.append(pi)
                if bad >= MIN_TOKENS and bad > longest.get(pi, (0, None))[0]:
                    longest[pi] = (bad, sp)
            pending = still
            if not pending:
                break
        cut = [pi for pi in pending if pi in longest]
        if cut:  # keep the screened prefix: the tokens before a near-tie do not depend on max_tokens
            params = [dataclasses.replace(longest[pi][1], max_tokens=longest[pi][0]) for pi in cut]
            outs = naive_generate(model, [ids[pi] for pi in cut], params, eos_id, return_logits=True)
            for pi, sp, c in zip(cut, params, outs):
                chosen[pi, kind] = (sp, c, first_unsafe_step(c, sp)[1])
        for pi in pending:
            if pi not in longest:
                print(f"  dropped {kind!r} for prompt {pi}: no screened run of {MIN_TOKENS}+ tokens")

    cases = []
    for (pi, kind), (params, c, worst) in sorted(chosen.items(), key=lambda kv: (kv[0][0], list(kinds).index(kv[0][1]))):
        cases.append({
            "name": f"p{pi}-{kind}",
            "prompt": prompts[pi],
            "prompt_token_ids": ids[pi],
            "params": recorded(params),
            "token_ids": c.token_ids,
            "text": tok.decode(c.token_ids),
            "finish_reason": c.finish_reason,
            "tokens_processed": c.tokens_processed,
            "chosen_logits": [round(float(l[t]), 6) for l, t in zip(c.logits, c.token_ids)],
            "min_margins": {"gap": round(worst["gap"], 6), "ambiguous": worst["ambiguous"]},
            **logprob_entries(params, c),
        })
    return cases


def recorded(params: SamplingParams) -> dict:
    """A case's params: the sampler's five fields, and any other field set away from its default."""
    out = {k: getattr(params, k) for k in ("temperature", "top_k", "top_p", "max_tokens", "seed")}
    default = SamplingParams()
    for f in ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p", "logprobs"):
        if getattr(params, f) != getattr(default, f):
            out[f] = getattr(params, f)
    return out


def logprob_entries(params: SamplingParams, c) -> dict:
    """With logprobs=k: per output token, [token id, logprob] of the chosen token and the k most likely, from the
    float64 reference's raw logits (JSON keys are strings, so pairs)."""
    if params.logprobs is None:
        return {}
    rows = [top_logprobs(l.numpy(), t, params.logprobs) for l, t in zip(c.logits, c.token_ids)]
    return {"logprobs": [[[t, round(v, 6)] for t, v in row.items()] for row in rows]}


def build_fork_cases(model, tok, prompts: list[str], eos_id: int, seed_base: int = 0) -> list[dict]:
    """One screened n=FORK_N case per prompt: every completion clears the margins, or the request's max_tokens
    is cut before the first near-tie of any completion (all completions share one max_tokens)."""
    cases = []
    for pi, prompt in enumerate(prompts):
        ids = tok.encode(prompt).ids
        best = None  # (usable steps, params, completions)
        for attempt in range(SEED_TRIES):
            params = SamplingParams(max_tokens=MAX_TOKENS, seed=seed_base + 1000 * pi + 777 + attempt, n=FORK_N,
                                    **FORK_PARAMS)
            children = [child_params(params, i) for i in range(FORK_N)]
            outs = naive_generate(model, [ids] * FORK_N, children, eos_id, return_logits=True)
            bad = [first_unsafe_step(c, sp)[0] for c, sp in zip(outs, children)]
            usable = min(MAX_TOKENS if b is None else b for b in bad)
            if best is None or usable > best[0]:
                best = (usable, params)
            if usable == MAX_TOKENS:
                break
        usable, params = best
        if usable < MIN_TOKENS:
            print(f"  dropped the n={FORK_N} case for prompt {pi}: no screened run of {MIN_TOKENS}+ tokens")
            continue
        params = dataclasses.replace(params, max_tokens=usable)
        children = [child_params(params, i) for i in range(FORK_N)]
        outs = naive_generate(model, [ids] * FORK_N, children, eos_id, return_logits=True)
        worst = [first_unsafe_step(c, sp)[1] for c, sp in zip(outs, children)]
        cases.append({
            "name": f"p{pi}-n{FORK_N}",
            "prompt": prompt,
            "prompt_token_ids": ids,
            "params": {k: getattr(params, k) for k in ("temperature", "top_k", "top_p", "max_tokens", "seed", "n")},
            "completions": [{"index": i, "seed": sp.seed, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
                            for i, (sp, c) in enumerate(zip(children, outs))],
            "min_margins": {"gap": round(min(w["gap"] for w in worst), 6),
                            "ambiguous": max(w["ambiguous"] for w in worst)},
        })
    return cases


def build(model_dir: Path = TARGET) -> dict[Path, dict]:
    model = load_model(model_dir)
    tok = load_tokenizer(model_dir)
    header = {
        "about": "Reference (float64 naive decode) outputs on screened prompts; regenerate with `python -m miniengine golden`.",
        "model": Path(model_dir).resolve().relative_to(REPO_ROOT).as_posix() if Path(model_dir).resolve().is_relative_to(REPO_ROOT) else str(model_dir),
        "model_sha256": model_sha256(model_dir),
        "screening": {"gap": GAP, "cutoff": CUTOFF},
        "eos_token_id": model.config.eos_token_id,
    }
    eos = model.config.eos_token_id
    files = {VISIBLE_FILE: {**header, "cases": build_cases(model, tok, VISIBLE_PROMPTS, eos),
                            "fork_cases": build_fork_cases(model, tok, VISIBLE_PROMPTS[:FORK_PROMPTS], eos)},
             GOLDEN / FEATURES_NAME: {**header, "cases": build_cases(model, tok, VISIBLE_PROMPTS, eos,
                                                                     kinds=FEATURE_KINDS)}}
    from miniengine.layers.quant import dequantized_copy
    hidden = json.loads(HIDDEN_PROMPTS_FILE.read_text())["prompts"] if HIDDEN_PROMPTS_FILE.exists() else None
    for scheme in QUANT_SCHEMES:
        deq = dequantized_copy(model, scheme)
        head = {**header, "quantization": scheme, "about": f"Reference (float64 naive decode) outputs of the {scheme} "
                "model's dequantized weights on screened prompts; regenerate with `python -m miniengine golden`."}
        files[quant_file(scheme)] = {**head, "cases": build_cases(deq, tok, VISIBLE_PROMPTS, eos, kinds=QUANT_KINDS)}
        if hidden:
            files[quant_file(scheme, hidden=True)] = {**head, "cases": build_cases(
                deq, tok, hidden, eos, seed_base=HIDDEN_SEED_BASE, kinds=QUANT_KINDS)}
    gqa_dir = MODELS / GQA_MODEL
    if (gqa_dir / "config.json").exists():
        gqa = load_model(gqa_dir)
        head = {**header, "model": f"data/models/{GQA_MODEL}", "model_sha256": model_sha256(gqa_dir),
                "eos_token_id": gqa.config.eos_token_id}
        files[gqa_file()] = {**head, "cases": build_cases(gqa, tok, VISIBLE_PROMPTS, eos, kinds=QUANT_KINDS)}
        if hidden:
            files[gqa_file(hidden=True)] = {**head, "cases": build_cases(gqa, tok, hidden, eos,
                                                                          seed_base=HIDDEN_SEED_BASE, kinds=QUANT_KINDS)}
    # Lab 07's engine tests serve the student's own mean-pooled conversion (not the uptrained model): its reference
    # tokens on the visible prompts, and on the hidden ones (kept out of the student's kernel with the other
    # hidden outputs).
    from miniengine.gqa import convert

    pooled = convert(model, 2)
    head = {**header, "model": "gqa.convert(target, 2) (mean-pooled, not uptrained)",
            "about": "Reference (float64 naive decode) outputs of the target converted to 2 KV heads by mean "
                     "pooling, on screened prompts; regenerate with `python -m miniengine golden`."}
    files[GOLDEN / "gqa2_pooled.json"] = {**head, "cases": build_cases(pooled, tok, VISIBLE_PROMPTS, eos,
                                                                      kinds=QUANT_KINDS)}
    if hidden:
        files[HIDDEN_DIR / "gqa2_pooled.json"] = {**head, "cases": build_cases(
            pooled, tok, hidden, eos, seed_base=HIDDEN_SEED_BASE, kinds=QUANT_KINDS)}
        # Seeds of their own, so that no hidden sampled run shares its noise with a visible one.
        files[HIDDEN_DIR / FEATURES_NAME] = {**header, "cases": build_cases(
            model, tok, hidden, eos, seed_base=HIDDEN_SEED_BASE, kinds=FEATURE_KINDS)}
        files[HIDDEN_FILE] = {**header, "cases": build_cases(model, tok, hidden, eos, seed_base=HIDDEN_SEED_BASE),
                              "fork_cases": build_fork_cases(model, tok, hidden[:FORK_PROMPTS], eos,
                                                             seed_base=HIDDEN_SEED_BASE)}
    return files
