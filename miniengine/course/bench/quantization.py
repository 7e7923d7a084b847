"""``bench quant`` (milestone 7, quantization): bytes, quality and speed of int8 and int4 weights."""
from __future__ import annotations

import statistics
import time

import torch

from miniengine.course import corpus
from miniengine.course.bench.inputs import bench_prompt
from miniengine.model import load_model
from miniengine.paths import resolve_model_dir
from miniengine.sampling import SamplingParams
from miniengine.tokenizer import load_tokenizer


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


def register(sub) -> None:
    """Adds ``bench quant`` and its flags to the ``bench`` sub-commands."""
    qp = sub.add_parser("quant", help="int8 and int4 weights: bytes, perplexity, agreement, paper-GPU and CPU speed")
    qp.add_argument("--model", default="target")
    qp.add_argument("--group-size", type=int, default=64)
    qp.add_argument("--new-tokens", type=int, default=128)
    qp.add_argument("--runs", type=int, default=3)
    qp.set_defaults(func=quant)
