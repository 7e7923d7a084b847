"""``bench decode`` (milestone 2, the KV cache): naive decode against KV-cached decode on this CPU."""
from __future__ import annotations

import statistics
import time

import torch

from miniengine.course.bench.inputs import bench_prompt
from miniengine.course.cached_decode import cached_generate
from miniengine.model import load_model
from miniengine.paths import resolve_model_dir
from miniengine.reference import in_dtype, naive_generate
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer


def time_decode(fn, model, prompt, params, runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn(model, [prompt], params, dtype=model.dtype)[0]
        seconds.append(time.perf_counter() - t0)
        assert len(out.token_ids) == params.max_tokens
    return seconds


def decode(args) -> int:
    model_dir = resolve_model_dir(args.model)
    tok = load_tokenizer(model_dir)
    base = load_model(model_dir)
    prompt = bench_prompt(tok, args.prompt_tokens)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    rows = []
    for name, fn, dtype in [("naive (no cache)", naive_generate, torch.float64),
                            ("naive (no cache)", naive_generate, torch.float32),
                            ("KV cache", cached_generate, torch.float32)]:
        model = in_dtype(base, dtype)
        fn(model, [prompt], SamplingParams(temperature=0, max_tokens=2), dtype=dtype)  # warm-up
        secs = time_decode(fn, model, prompt, params, args.runs)
        rows.append((name, str(dtype).replace("torch.", ""), statistics.median(secs), secs))
    print(f"decode benchmark: {model_dir.name}, {len(prompt)}-token prompt + {args.new_tokens} new tokens, "
          f"greedy, {args.runs} runs each, torch threads {torch.get_num_threads()}")
    print(f"{'method':<18} {'dtype':<8} {'median s':>9} {'tokens/s':>9}   all runs (s)")
    for name, dtype, med, secs in rows:
        print(f"{name:<18} {dtype:<8} {med:>9.3f} {args.new_tokens / med:>9.1f}   {', '.join(f'{s:.3f}' for s in secs)}")
    naive32, cached32 = rows[1][2], rows[2][2]
    print(f"naive float64/float32 time: {rows[0][2] / naive32:.2f}x")
    print(f"cached/naive speedup: {naive32 / cached32:.1f}x")
    return 0


def register(sub) -> None:
    """Adds ``bench decode`` and its flags to the ``bench`` sub-commands."""
    d = sub.add_parser("decode", help="naive vs KV-cached decode on this CPU")
    d.add_argument("--model", default="target")
    d.add_argument("--prompt-tokens", type=int, default=32)
    d.add_argument("--new-tokens", type=int, default=200)
    d.add_argument("--runs", type=int, default=3)
    d.set_defaults(func=decode)
