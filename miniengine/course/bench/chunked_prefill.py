"""``bench chunked`` (milestone 8, chunked prefill): decode ITL P99 when long prompts arrive, simulated and measured."""
from __future__ import annotations

from miniengine.course.bench.inputs import batch_prompts, warm_up
from miniengine.model import load_model
from miniengine.paths import resolve_model_dir
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer


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


def register(sub) -> None:
    """Adds ``bench chunked`` and its flags to the ``bench`` sub-commands."""
    c = sub.add_parser("chunked", help="decode ITL P99 when long prompts arrive: chunked prefill vs prefill-first")
    c.add_argument("--model", default="target")
    c.add_argument("--seeds", type=int, default=5)
    c.add_argument("--sim-chunk", type=int, default=512, help="the simulator's token budget per step when chunking")
    c.add_argument("--cpu-chunk", type=int, default=64, help="this CPU's token budget per step when chunking")
    c.set_defaults(func=chunked)
