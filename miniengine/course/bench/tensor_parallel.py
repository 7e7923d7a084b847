"""``bench tp`` (milestone 9, tensor parallelism): step and all-reduce time on 1 and 2 CPU ranks, exactness on the
golden cases, and the cost model's forecast for Llama-3-70B on 8 GPUs."""
from __future__ import annotations

import statistics
import time

import torch

from miniengine.course.bench.inputs import bench_prompt
from miniengine.model import load_model
from miniengine.paths import resolve_model_dir
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer


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


def register(sub) -> None:
    """Adds ``bench tp`` and its flags to the ``bench`` sub-commands."""
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
