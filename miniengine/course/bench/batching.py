"""``bench batch`` (milestone 4, batching): tokens/s of this engine against HF ``generate``, batch by batch.

Needs the ``hf`` extra (transformers).
"""
from __future__ import annotations

import statistics
import time

import torch

from miniengine.course.bench.inputs import batch_prompts
from miniengine.paths import resolve_model_dir
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer


def batch(args) -> int:
    """Tokens/s of this engine and of HF generate on the same weights, batch by batch, runs interleaved."""
    from transformers import LlamaForCausalLM

    from miniengine.llm import LLM

    model_dir = resolve_model_dir(args.model)
    tok = load_tokenizer(model_dir)
    hf = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(args.device).eval()
    new = args.new_tokens
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)

    def ours(llm, prompts):
        outs = llm.generate(prompts, params)
        assert all(len(o.token_ids) == new for o in outs)
        return [o.token_ids for o in outs]

    def theirs(prompts):
        with torch.inference_mode():
            ids = torch.tensor(prompts, device=args.device)
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0)
        return out[:, ids.shape[1]:].tolist()

    def timed(fn):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = fn()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, result

    rows = {}
    for b in args.batches:
        prompts = batch_prompts(tok, b, args.prompt_tokens)
        llm = LLM(model=model_dir, device=args.device, max_num_seqs=b, kv_cache_tokens=b * (args.prompt_tokens + new),
                  max_num_batched_tokens=max(4096, b * args.prompt_tokens))
        ours(llm, [p[:8] for p in prompts[:2]])  # warm-up
        theirs([p[:8] for p in prompts[:2]])
        t_ours, t_hf, same = [], [], True
        for _ in range(args.runs):  # interleaved, so both see the same machine load
            t, a = timed(lambda: ours(llm, prompts))
            t_ours.append(t)
            t, h = timed(lambda: theirs(prompts))
            t_hf.append(t)
            same = same and a == h
        rows[b] = (b * new / statistics.median(t_ours), b * new / statistics.median(t_hf), same)
    print(f"batched decode: {model_dir.name}, {args.prompt_tokens}-token prompts + {new} new tokens, greedy, "
          f"{args.device}, median of {args.runs} interleaved runs, torch threads {torch.get_num_threads()}")
    print(f"{'batch':>5} {'ours tok/s':>11} {'HF tok/s':>10} {'ours/HF':>8}  same tokens")
    for b, (o, h, same) in rows.items():
        print(f"{b:>5} {o:>11.1f} {h:>10.1f} {o / h:>7.2f}x  {same}")
    if 1 in rows and 16 in rows:
        print(f"batch 16 / batch 1: {rows[16][0] / rows[1][0]:.1f}x")
    for b, (o, h, _) in rows.items():
        print(f"ours / HF at batch {b}: {o / h:.2f}x")
    return 0


def register(sub) -> None:
    """Adds ``bench batch`` and its flags to the ``bench`` sub-commands."""
    b = sub.add_parser("batch", help="batched decode: this engine vs HF generate, tokens/s per batch size")
    b.add_argument("--model", default="target")
    b.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    b.add_argument("--prompt-tokens", type=int, default=32)
    b.add_argument("--new-tokens", type=int, default=200)
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--device", default="cpu")
    b.set_defaults(func=batch)
