"""The command line behind `python -m miniengine` {generate,serve,info,roofline,bench,simulate,disagg,train,convert-gqa,golden,card} ...

Bad arguments exit with status 2 and one line on stderr, never a traceback.
"""
from __future__ import annotations

import argparse
import sys


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage too; students want the one line that matters
        raise SystemExit(_fail(f"{self.prog}: error: {message}"))


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 2


def cmd_generate(args) -> int:
    from miniengine.llm import LLM
    from miniengine.sampling import SamplingParams

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed)
    llm = LLM(model=args.model)
    sys.stdout.write(args.prompt)
    for delta in llm.stream(args.prompt, params):
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_train(args) -> int:
    from miniengine.course import train

    train.train(args)
    return 0


def cmd_info(args) -> int:
    from miniengine.model import load_model
    from miniengine.paths import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    model = load_model(model_dir)
    c = model.config
    kind = "MHA" if c.num_key_value_heads == c.num_attention_heads else f"GQA (group {c.num_attention_heads // c.num_key_value_heads})"
    rows = [
        ("model", str(model_dir)),
        ("architecture", f"Llama, {c.num_hidden_layers} layers, {kind}"),
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("heads (query / kv)", f"{c.num_attention_heads} / {c.num_key_value_heads}, head_dim {c.head_dim}"),
        ("vocab_size", c.vocab_size),
        ("max_position_embeddings", c.max_position_embeddings),
        ("tied embeddings", c.tie_word_embeddings),
        ("parameters", f"{model.num_parameters():,}"),
        ("KV bytes per token", f"{c.kv_bytes_per_token(4):,} (fp32), {c.kv_bytes_per_token(2):,} (fp16)"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from miniengine.course import bench, golden, modelcard, train
    from miniengine.course.commands import disagg, roofline, simulate

    parser = _Parser(prog="python -m miniengine", description="The course's mini LLM inference engine.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="stream a completion of PROMPT to stdout")
    g.add_argument("prompt")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--model", default="target", help="model directory or shipped model name (default: target)")
    g.set_defaults(func=cmd_generate)

    i = sub.add_parser("info", help="architecture, parameter count and KV bytes per token")
    i.add_argument("--model", default="target")
    i.set_defaults(func=cmd_info)

    t = sub.add_parser("train", help="train a tiny Llama on the Python standard library")
    train.add_arguments(t)
    t.set_defaults(func=cmd_train)

    from miniengine.course import gqa_uptrain as gqa
    cg = sub.add_parser("convert-gqa", help="turn the MHA target into a GQA model (mean-pooled K/V heads), then uptrain")
    gqa.add_arguments(cg)
    cg.set_defaults(func=gqa.run)

    gd = sub.add_parser("golden", help="regenerate (or --check) the golden reference outputs")
    golden.add_arguments(gd)
    gd.set_defaults(func=golden.run)

    mc = sub.add_parser("card", help="write a model's card (README.md and loss.png)")
    modelcard.add_arguments(mc)
    mc.set_defaults(func=modelcard.run)

    rf = sub.add_parser("roofline", help="the paper-GPU cost model: step time, bound, MFU, KV capacity")
    roofline.add_arguments(rf)
    rf.set_defaults(func=roofline.run)

    bench.add_arguments(sub.add_parser("bench", help="benchmarks: tables of medians and ratios measured in one run"))
    simulate.add_arguments(sub.add_parser("simulate", help="batch-1, static and continuous batching on the paper GPU, over seeds"))
    disagg.add_arguments(sub.add_parser("disagg", help="colocated vs prefill/decode-split GPUs on the paper GPU"))

    from miniengine.serving.api import launch
    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server: /v1/completions (streaming too), /metrics")
    launch.add_arguments(sv)
    sv.set_defaults(func=launch.run)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        return _fail(f"python -m miniengine {args.command}: error: {e}")


if __name__ == "__main__":
    sys.exit(main())
