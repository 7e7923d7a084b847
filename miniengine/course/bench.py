"""Benchmarks that print tables of medians and ratios measured side by side in one run.

    python -m miniengine bench decode [--prompt-tokens 32 --new-tokens 200 --runs 3]
    python -m miniengine bench batch  [--batches 1 4 16 64 --device cpu]   (needs the `hf` extra)
    python -m miniengine bench serve  [--requests 64 --rate 200 --seed 0]
    python -m miniengine bench kv     [--requests 200 --kv-tokens 65536 --block-size 16 --max-tokens 2048]
    python -m miniengine bench spec   [--prompts 4 --new-tokens 64 --gammas 1 2 4 8]
    python -m miniengine bench quant  [--group-size 64 --new-tokens 128 --runs 3]
    python -m miniengine bench tp     [--batches 1 16 --steps 20 --repeats 3 --cases 40 --tp-size 8 --latency-us 10]
    python -m miniengine bench gpu    [--batches 1 16 64 --context 512 --repeats 50 --new-tokens 256]   (CUDA only)

Speed claims live here, not in tests: this machine is shared and noisy, so a
ratio of medians taken in the same run is the number worth quoting.
"""
from __future__ import annotations

import statistics
import time

import torch

from miniengine.course import corpus
from miniengine.course.cached_decode import cached_generate
from miniengine.model import load_model
from miniengine.paths import resolve_model_dir
from miniengine.reference import in_dtype, naive_generate
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer


def bench_prompt(tok, n_tokens: int) -> list[int]:
    """The first ``n_tokens`` of the first validation file: real code the model did not train on."""
    _, val = corpus.split_files()
    return tok.encode(val[0].read_text()).ids[:n_tokens]


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


def batch_prompts(tok, n_prompts: int, n_tokens: int) -> list[list[int]]:
    """n different prompts of exactly n_tokens each (consecutive windows of validation code), so HF needs no padding."""
    _, val = corpus.split_files()
    ids = [t for f in val[:8] for t in tok.encode(f.read_text()).ids]
    return [ids[i * n_tokens:(i + 1) * n_tokens] for i in range(n_prompts)]


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


def warm_up(engine) -> None:
    """One tiny request before the timed replay: first-call costs stay out of the measurement (and its three tokens
    share no KV block with any trace)."""
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()


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


def chunked(args) -> int:
    """Decode ITL P99 when long prompts arrive: chunked prefill against prefill-first, simulated and measured."""
    import numpy as np

    from miniengine.serving import metrics, simulator as sim
    from miniengine.config import EngineConfig
    from miniengine.engine import ContinuousBatching, LLMEngine, TraceRequest, replay
    from miniengine.engine.scheduler import chunk_to_fit
    from miniengine.cost.roofline import GPUS, CostModel, llama3_8b

    def decode_itl_p99(timelines, n_decodes):
        gaps = np.concatenate([metrics.itl(t) for t in timelines[:n_decodes]])
        return float(np.percentile(gaps, 99)), float(gaps.max())

    def long_ttft_p50(timelines, n_decodes):
        return float(np.median([metrics.ttft(t) for t in timelines[n_decodes:]]))

    # The simulator: Llama-3-8B on an H100 (the course's cost model), 32 running chats, 8 prompts of 6,000 tokens.
    cost = CostModel(llama3_8b(), GPUS["H100"])
    rows = {"simulator": [], "cpu": []}
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        arrivals = np.cumsum(rng.exponential(1 / 2.0, 8)) + 0.2
        for mode, budget, rule in (("prefill-first", 16384, None), ("chunked", args.sim_chunk, chunk_to_fit)):
            reqs = [sim.SimRequest(i, 0.0, 128, 400) for i in range(32)]
            reqs += [sim.SimRequest(32 + i, float(a), 6000, 64) for i, a in enumerate(arrivals)]
            run = sim.simulate(reqs, ContinuousBatching(), cost, max_num_seqs=64, max_num_batched_tokens=budget,
                               chunk_prefill=rule)
            t = [r.timeline for r in sorted(run.requests, key=lambda r: r.id)]
            rows["simulator"].append((seed, mode, decode_itl_p99(t, 32), long_ttft_p50(t, 32)))
    # This CPU: the course's model, 8 running decodes, 4 prompts of 448 tokens arriving while they decode.
    model_dir = resolve_model_dir(args.model)
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    prompts = batch_prompts(tok, 12, 448)
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        arrivals = np.cumsum(rng.exponential(1 / 20.0, 4)) + 0.05
        trace = [TraceRequest(0.0, p[:16], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
                 for p in prompts[:8]]
        trace += [TraceRequest(float(a), p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
                  for a, p in zip(arrivals, prompts[8:])]
        for mode, budget, chunk in (("prefill-first", 512, False), ("chunked", args.cpu_chunk, True)):
            engine = LLMEngine(EngineConfig(model=model, max_num_seqs=16, max_num_batched_tokens=budget,
                                            enable_chunked_prefill=chunk, kv_cache_tokens=8192))
            warm_up(engine)
            t = [r.timeline for r in replay(engine, trace)]
            rows["cpu"].append((seed, mode, decode_itl_p99(t, 8), long_ttft_p50(t, 8)))
    print(f"chunked prefill vs prefill-first, {args.seeds} seeds; decode ITL P99 over the running decodes, TTFT P50 "
          f"over the long prompts")
    print(f"  simulator: Llama-3-8B on an H100 (cost model), 32 chats decoding, 8 prompts of 6,000 tokens at 2/s; "
          f"chunks of {args.sim_chunk} tokens")
    print(f"  this CPU: {model_dir.name}, 8 requests decoding, 4 prompts of 448 tokens at 20/s; chunks of "
          f"{args.cpu_chunk} tokens; wall clock")
    print(f"{'where':<10} {'seed':>4} {'mode':<14} {'ITL P99':>10} {'ITL max':>10} {'TTFT P50':>10}")
    summary = {}
    for where, found in rows.items():
        for seed, mode, (p99, worst), ttft in found:
            print(f"{where:<10} {seed:>4} {mode:<14} {1e3 * p99:>8.1f}ms {1e3 * worst:>8.1f}ms {1e3 * ttft:>8.1f}ms")
        by = {m: [r for r in found if r[1] == m] for m in ("prefill-first", "chunked")}
        itl_ratio = [a[2][0] / b[2][0] for a, b in zip(by["prefill-first"], by["chunked"])]
        ttft_ratio = [b[3] / a[3] for a, b in zip(by["prefill-first"], by["chunked"])]
        summary[where] = (float(np.median(itl_ratio)), float(np.median(ttft_ratio)))
        print(f"{where}: decode ITL P99 prefill-first/chunked {float(np.median(itl_ratio)):.1f}x (median; per seed "
              f"{', '.join(f'{x:.1f}' for x in itl_ratio)}), long-prompt TTFT P50 chunked/prefill-first "
              f"{float(np.median(ttft_ratio)):.2f}x")
    print(f"chunked prefill: decode ITL P99 {summary['simulator'][0]:.1f}x lower on the simulator, "
          f"{summary['cpu'][0]:.1f}x lower on this CPU (medians of {args.seeds} seeds); long-prompt TTFT P50 "
          f"{summary['simulator'][1]:.2f}x and {summary['cpu'][1]:.2f}x")
    return 0


def kv(args) -> int:
    """KV utilisation and concurrency, contiguous reservation against paged blocks, at equal memory."""
    from miniengine.course.kv_study import chat_requests, kv_study

    reqs = chat_requests(args.requests, args.seed)
    rows = [kv_study(reqs, args.kv_tokens, layout, args.block_size, args.max_tokens, args.max_num_seqs)
            for layout in ("contiguous", "paged")]
    print(f"KV memory: {args.requests} chat requests (lognormal prompts ~512, outputs ~256 tokens, seed {args.seed}) "
          f"queued at once, max_tokens={args.max_tokens}, {args.kv_tokens} KV positions for each layout, "
          f"block size {args.block_size}, the engine's scheduler")
    print(f"{'layout':<11} {'utilisation':>11} {'mean running':>13} {'max running':>12} {'preemptions':>12} {'steps':>6}")
    for r in rows:
        print(f"{r.layout:<11} {r.utilisation:>10.1%} {r.mean_running:>13.1f} {r.max_running:>12} "
              f"{r.preemptions:>12} {r.steps:>6}")
    contiguous, paged = rows
    print("(utilisation: positions in use / positions held; mean running: over the steps when requests waited)")
    print(f"contiguous KV utilisation: {100 * contiguous.utilisation:.1f}%")
    print(f"paged KV utilisation: {100 * paged.utilisation:.1f}%")
    print(f"concurrent sequences paged/contiguous: {paged.max_running / contiguous.max_running:.1f}x")
    return 0


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


def quant(args) -> int:
    """Weight-only quantization: bytes, quality (perplexity, agreement, parse rate), paper-GPU and CPU speed."""
    import math

    from miniengine.layers.quant import model_weight_bytes, quantize_model
    from miniengine.llm import LLM
    from miniengine.course.modelcard import parse_rate, top1_agreement
    from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
    from miniengine.course.train import encode_corpus, evaluate

    model_dir = resolve_model_dir(args.model)
    tok = load_tokenizer(model_dir)
    _, val_files = corpus.split_files()
    val_ids = encode_corpus(tok, val_files)
    base = load_model(model_dir)
    variants = {"float32": base, "int8": quantize_model(load_model(model_dir), "int8"),
                "int4": quantize_model(load_model(model_dir), "int4", args.group_size)}
    prompt = bench_prompt(tok, 32)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    rows = {}
    for name, model in variants.items():
        loss = evaluate(model, val_ids, 256)
        llm = LLM(model=model)
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2))  # warm-up
        seconds = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            llm.generate([prompt], params)
            seconds.append(time.perf_counter() - t0)
        rows[name] = dict(bytes=model_weight_bytes(model), loss=loss, ppl=math.exp(loss),
                          agree=1.0 if model is base else top1_agreement(model, base, tok),
                          parse=parse_rate(model, tok)[0], tok_s=args.new_tokens / statistics.median(seconds))
    f = rows["float32"]
    print(f"weight-only quantization of {model_dir.name}: int8 per output channel, int4 in groups of {args.group_size} "
          f"(embedding and LM head included); validation = 32 windows of 256 tokens; CPU decode at batch 1, "
          f"{args.new_tokens} tokens, median of {args.runs} runs, torch threads {torch.get_num_threads()}")
    print(f"{'weights':<8} {'bytes':>10} {'x fp32':>7} {'val loss':>9} {'ppl':>7} {'ppl +%':>7} {'top-1 agree':>12} "
          f"{'parses':>7} {'CPU tok/s':>10} {'x fp32':>7}")
    for name, r in rows.items():
        print(f"{name:<8} {r['bytes']:>10,} {r['bytes'] / f['bytes']:>7.3f} {r['loss']:>9.4f} {r['ppl']:>7.3f} "
              f"{100 * (r['ppl'] / f['ppl'] - 1):>6.2f}% {r['agree']:>11.1%} {r['parse']:>7.0%} {r['tok_s']:>10.1f} "
              f"{r['tok_s'] / f['tok_s']:>6.2f}x")
    faster = [n for n in ("int8", "int4") if rows[n]["tok_s"] > f["tok_s"]]
    print("On this CPU the quantized layers first rebuild a float32 weight matrix (unpack, scale) in every forward, "
          "then run the same float32 matmul: extra work, and the tiny model's float weights already sit in cache, "
          f"so there is no memory traffic to save. Faster than float32 here: {', '.join(faster) or 'neither'}.")
    print("paper GPU (cost model, H100), Llama-3-8B decode step, context 1024 (weights read once per step; "
          "scales in bf16, as a bf16 model stores them):")
    bytes_per_param = {"bf16": 2.0, "int8": 1.0 + 2 / 4096, "int4": 0.5 + 2 / args.group_size}
    for batch in (1, 64):
        times = {n: CostModel(llama3_8b(), GPUS["H100"], bytes_per_param=b).decode(batch, 1024).step_time_s
                 for n, b in bytes_per_param.items()}
        print(f"  batch {batch:>2}: " + ", ".join(f"{n} {1e3 * t:.2f} ms ({times['bf16'] / t:.2f}x)" for n, t in times.items()))
    for name in ("int8", "int4"):
        print(f"{name} perplexity increase: {100 * (rows[name]['ppl'] / f['ppl'] - 1):.2f}%")
    return 0


def _tp_step_rank(rank, world_size, model_dir, prompt, batches, steps, repeats):
    """One rank of ``bench tp``: per batch size, decode steps of the unsharded model (rank 0 alone) and of
    the shards (every rank), interleaved ``repeats`` times so that both see the same machine load."""
    from miniengine.config import EngineConfig
    from miniengine.engine import LLMEngine
    from miniengine.kv import PagedKV
    from miniengine.distributed import GlooComm, comm_stats, rank_kv_shape, reset_comm_stats, ring_all_reduce, shard_model

    full = load_model(model_dir)
    models = {world_size: shard_model(full, rank, world_size)}
    if rank == 0:
        models[1] = shard_model(full, 0, 1)  # the same layers on one rank: no all-reduce
    out = {}
    for b in batches:
        engines = {}
        for ws, model in models.items():
            blocks = b * -(-(len(prompt) + repeats * steps + 2) // 16)
            engines[ws] = e = LLMEngine(EngineConfig(model=model, kv=PagedKV(rank_kv_shape(model.config, ws), blocks),
                                                     max_num_seqs=b, kv_cache_tokens=16 * blocks,
                                                     max_num_batched_tokens=max(4096, b * len(prompt))))
            for _ in range(b):
                e.add_request(prompt, SamplingParams(temperature=0, max_tokens=repeats * steps + 2, ignore_eos=True))
            e.step()  # every prefill
            e.step()  # a warm-up decode step
        times = {ws: [] for ws in engines}
        comm_s, calls = [], 0
        for _ in range(repeats):
            for ws in (1, world_size):  # the other ranks wait at the barrier while rank 0 runs the unsharded model
                torch.distributed.barrier()
                for _ in range(steps if ws in engines else 0):
                    reset_comm_stats(models[ws])
                    t0 = time.perf_counter()
                    engines[ws].step()
                    times[ws].append(time.perf_counter() - t0)
                    if ws > 1:
                        comm, calls = comm_stats(models[ws])
                        comm_s.append(comm)
        # The same all-reduces back to back, with no compute between them: the transport alone, without
        # the waits for a rank that arrives late.
        torch.distributed.barrier()
        x, loop, ring_loop, comm = torch.zeros(b, full.config.hidden_size), [], [], GlooComm()
        for _ in range(steps * 5):
            t0 = time.perf_counter()
            torch.distributed.all_reduce(x)
            loop.append(time.perf_counter() - t0)
        torch.distributed.barrier()
        for _ in range(steps * 5):  # the course's ring (Lab 09's), over point-to-point messages
            t0 = time.perf_counter()
            ring_all_reduce(x, comm)
            ring_loop.append(time.perf_counter() - t0)
        out[b] = dict(step={ws: statistics.median(t) for ws, t in times.items()}, comm=statistics.median(comm_s),
                      calls=calls, back_to_back=calls * statistics.median(loop), one=statistics.median(loop),
                      ring=statistics.median(ring_loop))
    return out


def tp(args) -> int:
    """Tensor parallelism: step and all-reduce time on 1 and 2 CPU ranks, exactness, the 70B-on-8-GPUs forecast."""
    import json

    from miniengine.config import EngineConfig
    from miniengine.engine import LLMEngine
    from miniengine.course.golden import GAP, VISIBLE_FILE
    from miniengine.reference import naive_generate
    from miniengine.cost.roofline import GPUS, INTERCONNECTS, CostModel, Interconnect, llama3_70b, tensor_parallel_decode
    from miniengine.course.tp_reference import tp_reference_generate
    from miniengine.distributed import check_world_size, launch, tp_generate

    for flag in ("steps", "repeats", "prompt_tokens", "large_batch"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be an integer >= 1, got {getattr(args, flag)}")
    if min(args.batches) < 1:
        raise ValueError(f"--batches must be integers >= 1, got {args.batches}")
    try:
        check_world_size(llama3_70b(), args.tp_size)  # the forecast splits whole heads and KV heads too
    except ValueError as e:
        raise ValueError(f"--tp-size for Llama-3-70B: {e}") from None
    model_dir = resolve_model_dir("target")  # the model of the golden cases
    prompt = bench_prompt(load_tokenizer(model_dir), args.prompt_tokens)
    timings = launch(_tp_step_rank, 2, (str(model_dir), prompt, args.batches, args.steps, args.repeats),
                     timeout_s=300)[0]
    print(f"tensor parallelism on this CPU: {model_dir.name}, gloo over loopback, 1 torch thread per rank, decode "
          f"steps after a {len(prompt)}-token prompt, greedy; median of {args.repeats} x {args.steps} steps, 1 and 2 "
          f"ranks interleaved; all-reduce: time inside the row-parallel layers' all-reduce calls on rank 0, waits "
          f"for the other rank included")
    print(f"{'ranks':>5} {'batch':>5} {'step ms':>8} {'all-reduce ms':>14} {'share':>6} {'all-reduces':>12} "
          f"{'back-to-back ms':>16} {'vs 1 rank':>10}")
    for b, t in timings.items():
        one, two = t["step"][1], t["step"][2]
        print(f"{1:>5} {b:>5} {1e3 * one:>8.2f} {0:>14.2f} {0:>6.0%} {0:>12} {0:>16.2f} {1:>9.2f}x")
        print(f"{2:>5} {b:>5} {1e3 * two:>8.2f} {1e3 * t['comm']:>14.2f} {t['comm'] / two:>6.0%} {t['calls']:>12} "
              f"{1e3 * t['back_to_back']:>16.2f} {two / one:>9.2f}x")
    print("(back-to-back: the same number of all-reduces of the same size timed in a loop with no compute between "
          "them: the transport, without the waits for a late rank)")
    for b, t in timings.items():
        print(f"one all-reduce of [{b}, hidden] float32 on 2 ranks: gloo's all_reduce {1e6 * t['one']:.0f} us, the "
              f"course's ring_all_reduce over isend/recv (Lab 09) {1e6 * t['ring']:.0f} us ({t['ring'] / t['one']:.2f}x)")
    from miniengine.model import load_config

    t, layers = timings[args.batches[0]], load_config(model_dir).num_hidden_layers
    print(f"per layer at batch {args.batches[0]}: {1e3 * t['step'][1] / layers:.2f} ms of work on 1 rank, against "
          f"{1e3 * t['back_to_back'] / layers:.2f} ms for its 2 all-reduces back to back: a model this small has too "
          f"little work per layer to hide a gloo all-reduce behind")

    # Exactness: the golden cases on 2 ranks against the unsharded runs, tokens and logits.
    golden = json.loads(VISIBLE_FILE.read_text())
    cases = golden["cases"][:args.cases]
    prompts, params = [c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases]
    base = load_model(model_dir)
    engine = LLMEngine(EngineConfig(model=base, max_num_seqs=len(cases)), keep_logits=True)
    seqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    while engine.has_unfinished_requests():
        engine.step()
    ref64 = naive_generate(base, prompts, params, return_logits=True)
    tp32 = tp_generate(model_dir, prompts, params, 2, torch.float32, return_logits=True)
    tp64 = tp_reference_generate(model_dir, prompts, params, 2, torch.float64, return_logits=True)

    def exact(outs):
        return sum(o.token_ids == c["token_ids"] for o, c in zip(outs, cases))

    def max_diff(a, b):
        return max((x.double() - y.double()).abs().max().item() for la, lb in zip(a, b) for x, y in zip(la, lb))

    d32 = max_diff([o.logits for o in tp32], [s.logits for s in seqs])
    d32_ref = max_diff([o.logits for o in tp32], [o.logits for o in ref64])
    d64 = max_diff([o.logits for o in tp64], [o.logits for o in ref64])
    margin = min(c["min_margins"]["gap"] for c in cases)
    print(f"exactness on {len(cases)} golden cases (greedy and sampled), 2 ranks: float32 engine {exact(tp32)}/"
          f"{len(cases)} token-exact, float64 reference decoder {exact(tp64)}/{len(cases)}")
    print(f"  max |logit difference|, float32 2 ranks vs 1 rank (same engine): {d32:.2e}; vs the float64 reference: "
          f"{d32_ref:.2e}; float64 2 ranks vs 1 rank: {d64:.2e}")
    print(f"  golden screening: every decision clears GAP = {GAP:g}; the smallest margin among these cases is "
          f"{margin:g}, {margin / d32:.0f}x the float32 difference")

    link = INTERCONNECTS["NVLink-H100"]
    if args.latency_us is not None:
        link = Interconnect(link.name, link.bandwidth, args.latency_us * 1e-6)
    cost = CostModel(llama3_70b(), GPUS["H100"])
    p = args.tp_size
    print(f"cost model: Llama-3-70B decode at context {args.context}, {p} x H100 with {link.name}: "
          f"{link.bandwidth / 1e9:.0f} GB/s each way per GPU, {link.latency_s * 1e6:g} us per all-reduce (assumed); "
          f"ring all-reduce 2(p-1)/p x bytes / bandwidth + latency, 2 per layer, not overlapped")
    print(f"{'batch':>5} {'1 GPU ms':>9} {'compute ms':>11} {'comm ms':>8} {'comm/compute':>13} {'comm share':>11} "
          f"{'bytes/all-reduce':>17}")
    forecast = {}
    for b in (1, args.large_batch):
        step = tensor_parallel_decode(cost, p, b, args.context, link)
        forecast[b] = step
        print(f"{b:>5} {1e3 * cost.decode(b, args.context).step_time_s:>9.2f} {1e3 * step.compute_s:>11.2f} "
              f"{1e3 * step.comm_s:>8.2f} {step.comm_s / step.compute_s:>13.2f} {step.comm_share:>11.0%} "
              f"{step.allreduce_bytes:>17,.0f}")
    print("(1 GPU: the same step on one paper H100, ignoring that 141 GB of weights do not fit in its 80 GB)")
    t = timings[args.batches[0]]
    step1, comm1 = t["step"][2], t["comm"]
    print(f"tensor parallel: 2 ranks on this CPU {step1 / t['step'][1]:.2f}x step time "
          f"(batch {args.batches[0]}), all-reduce {comm1 / step1:.0%} of the step; Llama-3-70B on {p} GPUs (NVLink): "
          f"comm {forecast[1].comm_share:.0%} of the step (batch 1), {forecast[args.large_batch].comm_share:.0%} "
          f"(batch {args.large_batch})")
    return 0 if exact(tp32) == exact(tp64) == len(cases) else 1


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="bench", required=True)
    d = sub.add_parser("decode", help="naive vs KV-cached decode on this CPU")
    d.add_argument("--model", default="target")
    d.add_argument("--prompt-tokens", type=int, default=32)
    d.add_argument("--new-tokens", type=int, default=200)
    d.add_argument("--runs", type=int, default=3)
    d.set_defaults(func=decode)
    b = sub.add_parser("batch", help="batched decode: this engine vs HF generate, tokens/s per batch size")
    b.add_argument("--model", default="target")
    b.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    b.add_argument("--prompt-tokens", type=int, default=32)
    b.add_argument("--new-tokens", type=int, default=200)
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--device", default="cpu")
    b.set_defaults(func=batch)
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
    c = sub.add_parser("chunked", help="decode ITL P99 when long prompts arrive: chunked prefill vs prefill-first")
    c.add_argument("--model", default="target")
    c.add_argument("--seeds", type=int, default=5)
    c.add_argument("--sim-chunk", type=int, default=512, help="the simulator's token budget per step when chunking")
    c.add_argument("--cpu-chunk", type=int, default=64, help="this CPU's token budget per step when chunking")
    c.set_defaults(func=chunked)
    k = sub.add_parser("kv", help="KV utilisation and concurrent sequences: paged vs contiguous at equal memory")
    k.add_argument("--requests", type=int, default=200)
    k.add_argument("--kv-tokens", type=int, default=65536, help="KV positions, the same for both layouts")
    k.add_argument("--block-size", type=int, default=16)
    k.add_argument("--max-tokens", type=int, default=2048, help="what each request asks for (its cap)")
    k.add_argument("--max-num-seqs", type=int, default=256)
    k.add_argument("--seed", type=int, default=0)
    k.set_defaults(func=kv)
    sp = sub.add_parser("spec", help="speculative decoding: alpha, tokens per target call, wall-clock speedup")
    sp.add_argument("--prompts", type=int, default=4)
    sp.add_argument("--prompt-tokens", type=int, default=32)
    sp.add_argument("--new-tokens", type=int, default=64)
    sp.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 4, 8])
    sp.add_argument("--runs", type=int, default=3)
    sp.set_defaults(func=spec)
    qp = sub.add_parser("quant", help="int8 and int4 weights: bytes, perplexity, agreement, paper-GPU and CPU speed")
    qp.add_argument("--model", default="target")
    qp.add_argument("--group-size", type=int, default=64)
    qp.add_argument("--new-tokens", type=int, default=128)
    qp.add_argument("--runs", type=int, default=3)
    qp.set_defaults(func=quant)
    t = sub.add_parser("tp", help="tensor parallelism: step and all-reduce time on 1 and 2 CPU ranks, the 70B forecast")
    t.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    t.add_argument("--prompt-tokens", type=int, default=32)
    t.add_argument("--steps", type=int, default=20, help="timed decode steps per batch size and repeat")
    t.add_argument("--repeats", type=int, default=3, help="1-rank and 2-rank runs, interleaved")
    t.add_argument("--cases", type=int, default=None, help="golden cases in the exactness check (default: all)")
    t.add_argument("--tp-size", type=int, default=8, help="GPUs in the cost model's forecast")
    t.add_argument("--context", type=int, default=1024, help="cached tokens per sequence in the forecast")
    t.add_argument("--large-batch", type=int, default=64, help="the forecast's larger batch")
    t.add_argument("--latency-us", type=float, default=None, help="per all-reduce latency (default: the link's)")
    t.set_defaults(func=tp)
    from miniengine.course.bench_gpu import add_arguments as gpu_arguments

    gpu_arguments(sub.add_parser("gpu", help="on a CUDA GPU: eager against CUDA-graph decode steps, and the cost model"))
