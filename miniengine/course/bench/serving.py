"""``bench serve`` (milestones 4 and 8): a Poisson trace replayed on the wall clock.

Plain, it compares sequential, static and continuous batching on the same trace; with ``--shared-prefix`` every
request starts with one system prompt, and the engine runs with and without automatic prefix caching.
"""
from __future__ import annotations

import statistics
import time

import torch

from miniengine.course.bench.inputs import batch_prompts, warm_up
from miniengine.model import load_model
from miniengine.paths import resolve_model_dir
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer


def decode_step_tok_s(model, batch: int, prompt: list[int], steps: int = 20) -> float:
    """Tokens/s of one engine decode step with ``batch`` running sequences (median over ``steps`` steps)."""
    from miniengine.config import EngineConfig
    from miniengine.engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=batch, kv_cache_tokens=batch * (len(prompt) + steps + 2)))
    for _ in range(batch):
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True))
    engine.step()  # every prefill
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


def serve(args) -> int:
    """A seeded Poisson trace replayed on the wall clock under three policies: sequential, static, continuous."""
    if getattr(args, "shared_prefix", 0):  # callers that build args by hand may leave it out
        return serve_shared_prefix(args)
    import numpy as np

    from miniengine.serving import metrics
    from miniengine.config import EngineConfig
    from miniengine.engine import ContinuousBatching, FCFSPolicy, LLMEngine, StaticBatching, TraceRequest, replay
    from miniengine.serving.simulator import lognormal_lengths

    model_dir = resolve_model_dir(args.model)
    tok = load_tokenizer(model_dir)
    rng = np.random.default_rng(args.seed)
    prompt_lens = np.clip(lognormal_lengths(rng, 32, 0.5, args.requests), 4, 128)
    new_lens = (np.clip(lognormal_lengths(rng, args.mean_new_tokens, args.output_sigma, args.requests), 4, 256)
                if args.output_sigma > 0 else np.full(args.requests, args.mean_new_tokens))
    windows = batch_prompts(tok, args.requests, 128)
    arrivals = np.cumsum(rng.exponential(1 / args.rate, args.requests))
    trace = [TraceRequest(float(a), w[:int(p)], SamplingParams(temperature=0, max_tokens=int(n), ignore_eos=True))
             for a, w, p, n in zip(arrivals, windows, prompt_lens, new_lens)]
    model = load_model(model_dir)
    policies = [("sequential (batch 1)", FCFSPolicy(max_num_seqs=1)),
                (f"static (batches of {args.static_batch})", StaticBatching(args.static_batch, timeout_s=0.05)),
                (f"continuous ({args.max_num_seqs} seats)", ContinuousBatching())]
    rows, tokens = [], {}
    for name, policy in policies:
        engine = LLMEngine(EngineConfig(model=model, scheduling_policy=policy, max_num_seqs=args.max_num_seqs,
                                        kv_cache_tokens=sum(int(p) + int(n) for p, n in zip(prompt_lens, new_lens))))
        warm_up(engine)
        steps = []  # sequences that got a token at each step: how full the batch really was
        step = engine.step
        engine.step = lambda: steps.append(len(out := step())) or out
        results = replay(engine, trace)
        tokens[name] = [r.seq.output_token_ids for r in results]
        s = metrics.summarize([r.timeline for r in results])
        rows.append((name, {**s, "seqs_per_step": sum(steps) / max(1, len(steps))}))
    same = all(t == tokens[rows[0][0]] for t in tokens.values())
    # The hardware's own ceiling for the ratio: a decode step with every seat full against a batch-1 step.
    full, single = (decode_step_tok_s(model, b, trace[0].prompt_token_ids) for b in (args.max_num_seqs, 1))
    print(f"serving benchmark: {model_dir.name}, {args.requests} requests, Poisson arrivals at {args.rate}/s (seed "
          f"{args.seed}), prompts ~32 and outputs ~{args.mean_new_tokens} tokens (lognormal, sigma {args.output_sigma}), "
          f"greedy, "
          f"torch threads {torch.get_num_threads()}, wall clock")
    print(f"{'policy':<26} {'tokens/s':>9} {'TTFT P50':>9} {'TTFT P99':>9} {'TPOT P50':>9} {'seqs/step':>10}")
    for name, s in rows:
        print(f"{name:<26} {s['throughput_tok_s']:>9.1f} {s['ttft_p50_s']:>8.2f}s {s['ttft_p99_s']:>8.2f}s "
              f"{1e3 * s['tpot_p50_s']:>7.1f}ms {s['seqs_per_step']:>10.1f}")
    print(f"same tokens under every policy: {same}")
    print(f"ceiling on this machine: a decode step with all {args.max_num_seqs} seats full gives {full:.0f} tok/s, "
          f"batch 1 gives {single:.0f} tok/s ({full / single:.1f}x); arrivals, prefills and the longest outputs "
          f"keep a real trace below it")
    base = rows[0][1]["throughput_tok_s"]
    print(f"static/sequential throughput: {rows[1][1]['throughput_tok_s'] / base:.1f}x")
    print(f"continuous/sequential throughput: {rows[2][1]['throughput_tok_s'] / base:.1f}x")
    return 0 if same else 1


def serve_shared_prefix(args) -> int:
    """Requests that share a long system prompt, replayed with and without automatic prefix caching."""
    import numpy as np

    from miniengine.serving import metrics
    from miniengine.config import EngineConfig
    from miniengine.engine import LLMEngine, TraceRequest, replay
    from miniengine.serving.simulator import lognormal_lengths

    model_dir = resolve_model_dir(args.model)
    tok = load_tokenizer(model_dir)
    rng = np.random.default_rng(args.seed)
    system, *windows = batch_prompts(tok, args.requests + 1, max(args.shared_prefix, 128))
    system = system[:args.shared_prefix]
    user_lens = np.clip(lognormal_lengths(rng, 32, 0.5, args.requests), 4, 128)
    new_lens = np.clip(lognormal_lengths(rng, args.mean_new_tokens, args.output_sigma, args.requests), 4, 256)
    arrivals = np.cumsum(rng.exponential(1 / args.rate, args.requests))
    trace = [TraceRequest(float(a), system + w[:int(u)], SamplingParams(temperature=0, max_tokens=int(n), ignore_eos=True))
             for a, w, u, n in zip(arrivals, windows, user_lens, new_lens)]
    model = load_model(model_dir)
    rows, tokens = [], {}
    for cached in (False, True):
        engine = LLMEngine(EngineConfig(model=model, max_num_seqs=args.max_num_seqs, enable_prefix_caching=cached,
                                        kv_cache_tokens=sum(len(r.prompt_token_ids) + r.params.max_tokens for r in trace)))
        warm_up(engine)
        results = replay(engine, trace)
        tokens[cached] = [r.seq.output_token_ids for r in results]
        # What the prefills fed: every token fed, minus one per decode step (the last token is never fed).
        prefill = sum(r.seq.tokens_processed - (len(r.seq.output_token_ids) - 1) for r in results)
        rows.append((cached, prefill, metrics.summarize([r.timeline for r in results])))
    prompt_total = sum(len(r.prompt_token_ids) for r in trace)
    print(f"shared-prefix serving: {model_dir.name}, {args.requests} requests at {args.rate}/s (Poisson, seed "
          f"{args.seed}), a {len(system)}-token system prompt + ~32-token user prompts ({prompt_total} prompt tokens), "
          f"outputs ~{args.mean_new_tokens} tokens, greedy, continuous batching ({args.max_num_seqs} seats), "
          f"block size 16, wall clock")
    print(f"{'prefix cache':<13} {'prefill tokens':>15} {'tokens/s':>9} {'TTFT P50':>9} {'TTFT P99':>9} {'TPOT P50':>9}")
    for cached, prefill, s in rows:
        print(f"{'on' if cached else 'off':<13} {prefill:>15} {s['throughput_tok_s']:>9.1f} {s['ttft_p50_s']:>8.3f}s "
              f"{s['ttft_p99_s']:>8.3f}s {1e3 * s['tpot_p50_s']:>7.1f}ms")
    same = tokens[False] == tokens[True]
    print(f"same tokens with and without the cache: {same}")
    (_, off, s_off), (_, on, s_on) = rows
    print(f"prefix cache: prefill tokens saved {100 * (1 - on / off):.1f}%, "
          f"TTFT P50 {s_off['ttft_p50_s'] / s_on['ttft_p50_s']:.1f}x lower")
    return 0 if same else 1


def register(sub) -> None:
    """Adds ``bench serve`` and its flags to the ``bench`` sub-commands."""
    s = sub.add_parser("serve", help="a Poisson trace on the wall clock: sequential, static and continuous batching")
    s.add_argument("--model", default="target")
    s.add_argument("--requests", type=int, default=64)
    s.add_argument("--rate", type=float, default=200.0, help="arrivals per second")
    s.add_argument("--mean-new-tokens", type=int, default=64)
    s.add_argument("--output-sigma", type=float, default=0.5,
                   help="spread of the output lengths (lognormal sigma); 0 gives every request the same length")
    s.add_argument("--max-num-seqs", type=int, default=64)
    s.add_argument("--static-batch", type=int, default=16)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--shared-prefix", type=int, nargs="?", const=256, default=0, metavar="TOKENS",
                   help="every request starts with the same system prompt of TOKENS tokens (256 if no number): "
                        "compare the engine with and without automatic prefix caching")
    s.set_defaults(func=serve)
