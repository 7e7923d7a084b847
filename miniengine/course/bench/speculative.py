"""``bench spec`` (milestone 6, speculative decoding): alpha, tokens per target call, wall-clock speedup at batch 1."""
from __future__ import annotations

import time

import torch

from miniengine.course.bench.inputs import batch_prompts
from miniengine.paths import resolve_model_dir
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer

DRAFTS = {"shipped": "draft", "distilled": "draft-distilled"}


def spec(args) -> int:
    """Speculative decoding at batch 1: alpha, tokens per target call against theory, wall-clock speedup."""
    from miniengine import paths
    from miniengine.llm import LLM
    from miniengine.cost.roofline import GPUS, llama3_8b, llama3_70b
    from miniengine.spec.theory import expected_tokens_per_call, paper_gpu_speedup

    model_dir = resolve_model_dir("target")
    prompts = batch_prompts(load_tokenizer(model_dir), args.prompts, args.prompt_tokens)
    modes = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=0.8, top_k=40)}

    def params(mode, i):
        return SamplingParams(max_tokens=args.new_tokens, ignore_eos=True, seed=i, **modes[mode])

    def serve(llm, mode):  # one request at a time: batch 1
        t0 = time.perf_counter()
        outs = [llm.generate([p], params(mode, i))[0].token_ids for i, p in enumerate(prompts)]
        return time.perf_counter() - t0, outs

    plain = LLM(model_dir)
    serve(plain, "greedy")  # warm-up
    base = {m: min(serve(plain, m) for _ in range(args.runs)) for m in modes}  # the fastest of a few runs
    drafts = {name: d for name, d in DRAFTS.items() if (paths.MODELS / d / "config.json").exists()}
    rows, split = [], {}
    for name, draft in drafts.items():
        for verifier in ("coupled", "rejection"):
            for mode in modes:
                for gamma in args.gammas:
                    llm = LLM(model_dir, speculative_model=draft, num_speculative_tokens=gamma,
                              speculative_verifier=verifier)
                    seconds, outs = serve(llm, mode)
                    sd = llm.engine.spec
                    same = outs == base[mode][1]
                    rows.append((name, verifier, mode, gamma, sd.alpha, sd.tokens_per_call,
                                 expected_tokens_per_call(sd.alpha, gamma), base[mode][0] / seconds, same))
                    split[(name, verifier, mode, gamma)] = dict(sd.seconds, calls=sd.target_calls)
    print(f"speculative decoding at batch 1: {args.prompts} prompts of {args.prompt_tokens} tokens, {args.new_tokens} new "
          f"tokens each, sampled = temperature 0.8, top-k 40; wall speedup against plain decoding (fastest of "
          f"{args.runs} runs), torch threads {torch.get_num_threads()}")
    print(f"{'draft':<10} {'verifier':<10} {'mode':<8} {'γ':>2} {'alpha':>6} {'tok/call':>9} {'theory':>7} "
          f"{'wall':>6}  same tokens as plain")
    for name, verifier, mode, gamma, alpha, tpc, theory, wall, same in rows:
        print(f"{name:<10} {verifier:<10} {mode:<8} {gamma:>2} {alpha:>6.2f} {tpc:>9.2f} {theory:>7.2f} "
              f"{wall:>5.2f}x  {same}")
    print("theory: (1 - alpha^(γ+1)) / (1 - alpha) with the measured alpha")
    missing = [n for n in DRAFTS if n not in drafts]
    if missing:
        print(f"not built yet: the {', '.join(missing)} draft (data/models/{DRAFTS[missing[0]]})")
    print("paper GPU (cost model, H100, batch 1, context 1024), Llama-3-70B verified, Llama-3-8B drafting "
          "(memory not checked: 70B needs several GPUs, which shrink both step times alike):")
    for alpha in (0.6, 0.7, 0.8, 0.9):
        print(f"  alpha {alpha:.1f}: " + ", ".join(
            f"γ={g} {paper_gpu_speedup(alpha, g, llama3_70b(), llama3_8b(), GPUS['H100']):.2f}x" for g in (2, 4, 8)))
    best = "distilled" if "distilled" in drafts else "shipped"
    row = next((r for r in rows if r[0] == best and r[1] == "coupled" and r[2] == "greedy" and r[3] == 4), None)
    if row is not None:
        sp = split[(best, "coupled", "greedy", 4)]
        plain_step = base["greedy"][0] / (args.prompts * args.new_tokens)
        print(f"where the time goes ({best} draft, coupled, greedy, γ=4), per target call: "
              + ", ".join(f"{k} {1e3 * v / sp['calls']:.2f} ms" for k, v in sp.items() if k != "calls")
              + f"; a plain decode step takes {1e3 * plain_step:.2f} ms")
        print(f"{best} draft, greedy, γ=4: alpha {row[4]:.2f}, tokens per target call {row[5]:.2f}, "
              f"wall speedup {row[7]:.2f}x")
    return 0 if all(r[8] for r in rows if r[1] == "coupled" or r[2] == "greedy") else 1


def register(sub) -> None:
    """Adds ``bench spec`` and its flags to the ``bench`` sub-commands."""
    sp = sub.add_parser("spec", help="speculative decoding: alpha, tokens per target call, wall-clock speedup")
    sp.add_argument("--prompts", type=int, default=4)
    sp.add_argument("--prompt-tokens", type=int, default=32)
    sp.add_argument("--new-tokens", type=int, default=64)
    sp.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 4, 8])
    sp.add_argument("--runs", type=int, default=3)
    sp.set_defaults(func=spec)
