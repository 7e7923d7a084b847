"""``python -m miniengine roofline``: the cost of one forward pass on a paper GPU, as a table or one JSON object.

The cost model itself is :mod:`miniengine.cost.roofline`; this module is only the command: its flags, their
checks (a bad value raises ValueError naming the flag, which the CLI turns into exit status 2) and the table.

    python -m miniengine roofline --model llama3-8b --gpu H100 --phase decode --batch 64 --context 2048
"""
from __future__ import annotations

import json

from miniengine.cost.counting import MODELS, get_model_config
from miniengine.cost.hardware import GPUS, get_gpu
from miniengine.cost.roofline import CostModel, report


def add_arguments(parser) -> None:
    """Flags of ``python -m miniengine roofline``."""
    parser.add_argument("--model", default="llama3-8b", help=f"one of: {', '.join(MODELS)}")
    parser.add_argument("--gpu", default="H100", help=f"one of: {', '.join(GPUS)}")
    parser.add_argument("--phase", default="decode", help="prefill or decode")
    parser.add_argument("--batch", type=int, default=1, help="sequences in the forward")
    parser.add_argument("--context", type=int, default=1024,
                        help="prefill: prompt tokens per sequence; decode: cached tokens per sequence")
    parser.add_argument("--compute-eff", type=float, default=0.7, help="share of peak FLOP/s reached, in (0, 1]")
    parser.add_argument("--bandwidth-eff", type=float, default=0.8, help="share of bandwidth reached, in (0, 1]")
    parser.add_argument("--overhead-ms", type=float, default=0.5, help="fixed cost per forward, >= 0")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _validate(args):
    if args.phase not in ("prefill", "decode"):
        raise ValueError(f"--phase {args.phase!r} is not a phase; choose one of: prefill, decode")
    if args.batch < 1:
        raise ValueError(f"--batch must be an integer >= 1, got {args.batch}")
    least = 1 if args.phase == "prefill" else 0  # a prefill processes at least one token
    if args.context < least:
        raise ValueError(f"--context must be an integer >= {least} for {args.phase}, got {args.context}")
    for flag, value in (("--compute-eff", args.compute_eff), ("--bandwidth-eff", args.bandwidth_eff)):
        if not 0 < value <= 1:
            raise ValueError(f"{flag} must be in (0, 1], got {value}")
    if not args.overhead_ms >= 0:
        raise ValueError(f"--overhead-ms must be >= 0, got {args.overhead_ms}")
    gpu = get_gpu(args.gpu)  # raises for an unknown name, listing the choices
    cfg = get_model_config(args.model)
    return CostModel(cfg, gpu, args.compute_eff, args.bandwidth_eff, args.overhead_ms / 1e3)


def run(args) -> int:
    """Prints the cost of one forward; raises ValueError for a bad flag (the CLI exits 2 on it)."""
    model = _validate(args)
    out = report(model, args.phase, args.batch, args.context)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.model} on {model.gpu.name}, {args.phase}, batch {args.batch}, context {args.context} "
          f"(compute {model.compute_eff:.0%}, bandwidth {model.bandwidth_eff:.0%}, overhead {args.overhead_ms} ms)")
    rows = [
        ("parameters", f"{out['params'] / 1e9:.2f} B"),
        ("FLOPs", f"{out['flops']:.3e}"),
        ("bytes moved", f"{out['bytes'] / 1e9:.2f} GB"),
        ("arithmetic intensity", f"{out['flops'] / out['bytes']:.1f} FLOP/byte (ridge {model.ridge_point:.0f})"),
        ("step time", f"{out['step_time_s'] * 1e3:.3f} ms ({out['bound']}-bound)"),
        ("time per token", f"{out['time_per_token_s'] * 1e6:.1f} us"),
        ("MFU", f"{out['mfu']:.1%}"),
        ("KV per token", f"{out['kv_bytes_per_token'] / 1024:.0f} KiB"),
        ("KV capacity", f"{out['kv_capacity_tokens']:,} tokens"),
        ("max batch at this context", f"{out['max_batch']:,}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if out["kv_capacity_tokens"] == 0:
        print(f"  note: the weights alone exceed {model.usable_memory:.0%} of this GPU's memory: it takes "
              "several GPUs or quantized weights to serve this model")
    return 0
