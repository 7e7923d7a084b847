"""``python -m miniengine bench gpu``: eager against CUDA-graph decode steps, side by side, against the cost model.

Two models, both through the engine's own decode paths (the paged pool, ``PagedBackend`` eagerly, and
``engine.cuda_graphs.DecodeGraphs`` replayed):

1. Lecture 03's GQA configuration (hidden 2048, 8 layers, 16 heads on 4 KV heads, 492M parameters) in
   float16 with random weights, one decode step at context 512, batches 1, 16 and 64: measured ms, the cost
   model's prediction (70% / 80% / 0.5 ms) and the ideal roofline, and the bandwidth achieved (the step's
   bytes by the cost model's count, over the measured time).
2. The shipped tiny model, float32, batch 1, greedy: tokens/s of ``LLM`` with and without graphs.

It ends with ``graphs/eager decode step at batch 1: X.Xx, achieved bandwidth YY% of peak``.  Without CUDA it
says so and exits 1: there is nothing to measure.
"""
from __future__ import annotations

import statistics
import time

import torch


def lecture03_config():
    from miniengine.model import LlamaConfig

    return LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                       num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                       tie_word_embeddings=False)


def _median_ms(fn, repeats: int) -> float:
    times = []
    for i in range(repeats + 3):  # 3 warm-ups: the allocator, kernel selection
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


@torch.inference_mode()
def decode_step_ms(model, batch: int, context: int, repeats: int) -> tuple[float, float]:
    """(eager ms, graph ms) of one decode step of ``batch`` sequences with ``context`` cached tokens each."""
    from miniengine.engine.cuda_graphs import DecodeGraphs
    from miniengine.engine.sequence import Sequence
    from miniengine.kv import PagedKV
    from miniengine.kv.block_manager import blocks_needed
    from miniengine.sampling import SamplingParams

    cfg, dev, bs = model.config, model.device, 16
    blocks = blocks_needed(context + 1, bs)
    kv = PagedKV(cfg, batch * blocks, bs, dtype=model.dtype, device=dev)
    seqs = []
    for _ in range(batch):
        s = Sequence(torch.randint(0, cfg.vocab_size, (context + 1,)).tolist(), SamplingParams(max_tokens=1))
        kv.allocate(s)
        s.num_cached_tokens = context  # the history is cached (random K/V do not change the time)
        seqs.append(s)
    ids = torch.tensor([s.token_ids[context] for s in seqs], device=dev)

    def eager():
        backend = kv.backend(seqs, [1] * batch)
        model(ids, backend.positions(dev), backend)

    graphs = DecodeGraphs(model, kv, (batch,), key_buckets=(blocks,))
    return _median_ms(eager, repeats), _median_ms(lambda: graphs.run(seqs), repeats)


def tokens_per_s(enforce_eager: bool, new_tokens: int) -> float:
    from miniengine.llm import LLM
    from miniengine.sampling import SamplingParams

    llm = LLM(device="cuda", max_num_seqs=1, enforce_eager=enforce_eager)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=8))  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = llm.generate(["def fibonacci(n):"], params)[0]
    torch.cuda.synchronize()
    return len(out.token_ids) / (time.perf_counter() - t0)


def run(args) -> int:
    for flag, values in (("--batches", args.batches), ("--context", [args.context]), ("--repeats", [args.repeats]),
                         ("--new-tokens", [args.new_tokens])):
        if any(v < 1 for v in values):
            raise ValueError(f"{flag} must be >= 1, got {' '.join(map(str, values))}")
    if not torch.cuda.is_available():
        print("bench gpu measures CUDA graphs against eager decode on a GPU, and no CUDA device is visible here "
              "(torch.cuda.is_available() is False). Run it on a GPU machine; `make gpu-check` runs it too.")
        return 1
    from miniengine.model import Llama
    from miniengine.cost.roofline import CostModel, gpu_for_device

    name = torch.cuda.get_device_name()
    spec = gpu_for_device(name)
    cfg = lecture03_config()
    torch.manual_seed(0)
    with torch.device("cuda"):
        big = Llama(cfg).half().eval()  # random float16 weights: timing only
    print(f"{name}: Lecture 03's GQA model, {big.num_parameters() / 1e6:.0f} M parameters in float16, decode at "
          f"context {args.context}, median of {args.repeats} steps; cost model: "
          f"{spec.name if spec else 'no spec for this GPU'} (70% / 80% / 0.5 ms)")
    print(f"{'batch':>5} {'eager ms':>9} {'graphs ms':>10} {'speed-up':>9} {'cost model ms':>14} {'ideal ms':>9} "
          f"{'graphs GB/s':>12} {'of peak':>8}")
    first = None
    for batch in args.batches:
        eager_ms, graph_ms = decode_step_ms(big, batch, args.context, args.repeats)
        row = f"{batch:>5} {eager_ms:>9.3f} {graph_ms:>10.3f} {eager_ms / graph_ms:>8.2f}x"
        share = None
        if spec is not None:
            est = CostModel(cfg, spec).decode(batch, args.context)
            ideal = CostModel(cfg, spec, compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0).decode(batch, args.context)
            achieved = est.cost.bytes / (graph_ms / 1e3)
            share = achieved / spec.bandwidth
            row += (f" {est.step_time_s * 1e3:>14.3f} {ideal.step_time_s * 1e3:>9.3f} {achieved / 1e9:>12.0f} "
                    f"{share:>8.0%}")
        print(row)
        if first is None:
            first = (eager_ms / graph_ms, share)
    eager_tps, graph_tps = tokens_per_s(True, args.new_tokens), tokens_per_s(False, args.new_tokens)
    print(f"tiny model, batch 1, {args.new_tokens} tokens greedy: eager {eager_tps:.0f} tokens/s, "
          f"graphs {graph_tps:.0f} tokens/s ({graph_tps / eager_tps:.2f}x)")
    ratio, share = first
    print(f"graphs/eager decode step at batch {args.batches[0]}: {ratio:.1f}x, achieved bandwidth "
          + (f"{share:.0%} of peak" if share is not None else "unknown (no spec for this GPU)"))
    return 0


def add_arguments(p) -> None:
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--context", type=int, default=512, help="cached tokens per sequence")
    p.add_argument("--repeats", type=int, default=50, help="timed steps per measurement (median)")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens of the tiny model's batch-1 run")
    p.set_defaults(func=run)


def register(sub) -> None:
    """Adds ``bench gpu`` and its flags to the ``bench`` sub-commands."""
    add_arguments(sub.add_parser("gpu", help="on a CUDA GPU: eager against CUDA-graph decode steps, and the cost model"))
