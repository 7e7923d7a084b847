"""Golden outputs: the reference's tokens on screened prompts, which every milestone is tested against.

    python -m miniengine golden            # rewrite data/golden/visible.json and autograder/hidden/golden.json
    python -m miniengine golden --check    # exit 1 if the shipped files differ from a fresh regeneration

Screening (miniengine/README.md, The invariant) keeps near-ties out, so that any correct float32
implementation matches token for token:
  * greedy: at every step the top-1 and top-2 logits differ by at least GAP;
  * sampled: the top-1 and top-2 Gumbel-perturbed scores differ by at least GAP,
    and no token within CUTOFF of the top-k or top-p boundary (whose fate a
    float32 implementation could decide differently) wins or comes within GAP.
A sampled case that fails is retried with the next seed; a case that still
fails is cut just before its first near-tie (and dropped if that leaves fewer
than MIN_TOKENS tokens).

The hidden prompts are for the autograder's hidden tests.  They, and their
golden file, live under autograder/hidden/, which ``autograder release`` never
copies to students; without that folder only the visible file is built.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np

from miniengine.model import load_model
from miniengine.paths import GOLDEN, MODELS, REPO_ROOT, TARGET
from miniengine.reference import naive_generate
from miniengine.sampling import SamplingParams, child_params, gumbel_noise, softmax, top_k_mask
from miniengine.tokenizer import load_tokenizer

GAP = 1e-3
CUTOFF = 1e-4
MAX_TOKENS = 24
MIN_TOKENS = 8  # a greedy case cut shorter than this is dropped
SEED_TRIES = 6
HIDDEN_SEED_BASE = 500_000

VISIBLE_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
    'def is_prime(n):\n    """Return True if n is prime."""',
    "with open(filename) as f:",
    "try:\n    import json\nexcept ImportError:",
    "def read_config(path):\n    config = {}",
]
# One case per sampler the course builds: greedy, plain temperature, top-k, top-p, and all three.
CASE_KINDS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.8),
    "top_k": dict(temperature=1.0, top_k=20),
    "top_p": dict(temperature=1.0, top_p=0.8),
    "combined": dict(temperature=0.7, top_k=40, top_p=0.9),
}
# SamplingParams(n=FORK_N) cases: the reference runs each completion on its own, with its derived seed
# (miniengine.sampling.child_seed); an engine that forks after the prefill must match every one.
FORK_N = 4
FORK_PROMPTS = 3  # the first prompts of each file get an n > 1 case
FORK_PARAMS = dict(temperature=0.8, top_k=40)
# Quantized models (milestone 7): the reference runs the *dequantized* weights, the very numbers the
# quantized engine computes with, so exactness is tested apart from the quality the quantization costs.
QUANT_SCHEMES = ("int8", "int4")  # int4 with the engine's default group size
QUANT_KINDS = {k: CASE_KINDS[k] for k in ("greedy", "combined")}
# The GQA model converted from the target (milestone 7): golden cases of its own, from the same reference.
GQA_MODEL = "target-gqa2"
VISIBLE_FILE = GOLDEN / "visible.json"
HIDDEN_DIR = REPO_ROOT / "autograder" / "hidden"
HIDDEN_FILE = HIDDEN_DIR / "golden.json"
HIDDEN_PROMPTS_FILE = HIDDEN_DIR / "prompts.json"  # instructor-only, like the golden file built from it


def gqa_file(hidden: bool = False) -> Path:
    return (HIDDEN_DIR if hidden else GOLDEN) / f"{GQA_MODEL.replace('target-', '')}.json"


def quant_file(scheme: str, hidden: bool = False) -> Path:
    return (HIDDEN_DIR if hidden else GOLDEN) / f"{scheme}.json"


def step_margins(logits: np.ndarray, params: SamplingParams, position: int) -> dict:
    """How far one sampling step is from a tie that float32 rounding could tip.

    greedy: the gap between the top two logits.  Sampled: tokens within CUTOFF
    of the top-k or top-p boundary are *ambiguous* (another correct
    implementation may keep or drop them); the step is safe when the winner
    over the kept and ambiguous tokens is not itself ambiguous, and "gap" is its
    lead over the runner-up among them (0 when the winner is ambiguous).
    """
    logits = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        top2 = np.sort(logits)[-2:]
        return {"gap": float(top2[1] - top2[0]), "ambiguous": 0}
    scaled = logits / params.temperature
    keep = top_k_mask(scaled, params.top_k)
    ambiguous = np.zeros(logits.shape, dtype=bool)
    if 0 < params.top_k < logits.size:
        s = np.sort(scaled)[::-1]
        if s[params.top_k - 1] - s[params.top_k] < CUTOFF:  # the k-th and (k+1)-th nearly tie
            for v in (s[params.top_k - 1], s[params.top_k]):
                ambiguous |= np.abs(scaled - v) < CUTOFF
    if params.top_p < 1:
        probs = softmax(np.where(keep, scaled, -np.inf))
        order = np.argsort(-probs, kind="stable")
        mass_before = np.empty_like(probs)
        mass_before[order] = np.cumsum(probs[order]) - probs[order]
        keep &= mass_before < params.top_p
        ambiguous |= np.abs(mass_before - params.top_p) < CUTOFF
    scores = np.where(keep | ambiguous, scaled + gumbel_noise(params.seed, position, logits.size), -np.inf)
    winner = int(np.argmax(scores))
    top2 = np.sort(scores)[-2:]
    gap = 0.0 if ambiguous[winner] else float(top2[1] - top2[0])
    return {"gap": gap, "ambiguous": int(ambiguous.sum())}


def first_unsafe_step(completion, params: SamplingParams) -> tuple[int | None, dict]:
    """Index of the first step that fails screening (None if all pass), the smallest gap and the most ambiguous tokens."""
    worst = {"gap": np.inf, "ambiguous": 0}
    for step, logits in enumerate(completion.logits):
        m = step_margins(logits.numpy(), params, len(completion.prompt_token_ids) + step)
        worst = {"gap": min(worst["gap"], m["gap"]), "ambiguous": max(worst["ambiguous"], m["ambiguous"])}
        if m["gap"] < GAP:
            return step, worst
    return None, worst


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
            "params": {k: getattr(params, k) for k in ("temperature", "top_k", "top_p", "max_tokens", "seed")},
            "token_ids": c.token_ids,
            "text": tok.decode(c.token_ids),
            "finish_reason": c.finish_reason,
            "tokens_processed": c.tokens_processed,
            "chosen_logits": [round(float(l[t]), 6) for l, t in zip(c.logits, c.token_ids)],
            "min_margins": {"gap": round(worst["gap"], 6), "ambiguous": worst["ambiguous"]},
        })
    return cases


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
                            "fork_cases": build_fork_cases(model, tok, VISIBLE_PROMPTS[:FORK_PROMPTS], eos)}}
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
        files[HIDDEN_FILE] = {**header, "cases": build_cases(model, tok, hidden, eos, seed_base=HIDDEN_SEED_BASE),
                              "fork_cases": build_fork_cases(model, tok, hidden[:FORK_PROMPTS], eos,
                                                             seed_base=HIDDEN_SEED_BASE)}
    return files


def dumps(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


def load_golden(path: Path = VISIBLE_FILE) -> dict:
    return json.loads(Path(path).read_text())


def same(a, b, tol: float = 1e-5) -> bool:
    """Equal, except that floats may differ by ``tol`` (BLAS summation order varies across machines)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol * max(1.0, abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b))
    return a == b


def run(args) -> int:
    files = build(Path(args.model))
    if args.check:
        stale = [p for p, d in files.items() if not p.exists() or not same(d, load_golden(p))]
        for p in stale:
            print(f"{p.relative_to(REPO_ROOT)} differs from a fresh regeneration")
        return 1 if stale else 0
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(data))
        print(f"wrote {len(data['cases'])} cases to {path.relative_to(REPO_ROOT)}")
    return 0


def add_arguments(p) -> None:
    p.add_argument("--model", default=str(TARGET), help="model directory (default: the shipped target)")
    p.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing them")
