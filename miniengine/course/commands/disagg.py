"""``python -m miniengine disagg``: colocated against every prefill/decode split of the same paper GPUs.

The arrangements, the medians over seeds and the verdict are :mod:`miniengine.serving.disagg`; this module is
the command: its flags, their checks (a ValueError names the flag and its range) and the printed table.

    python -m miniengine disagg                       # colocated vs every split of 4 paper H100s
    python -m miniengine disagg --rate 8 --prompt-mean 2048 --prefill-gpus 2
"""
from __future__ import annotations

from miniengine.cost.roofline import CostModel, get_gpu, get_model_config
from miniengine.serving.disagg import REPORTED, compare_splits, verdict, workload
from miniengine.serving.metrics import SLO


def add_arguments(p) -> None:
    """Flags of ``python -m miniengine disagg``."""
    p.add_argument("--model", default="llama3-8b", help="llama3-8b, or any model of `roofline` that fits one GPU")
    p.add_argument("--gpu", default="H100", help="H100, H200, A100-80GB or T4")
    p.add_argument("--gpus", type=int, default=4, help="GPUs in all, >= 2 (each arrangement uses all of them)")
    p.add_argument("--prefill-gpus", type=int, nargs="+", help="splits to try (default: every one, 1 to gpus-1)")
    p.add_argument("--link-gbps", type=float, default=400.0,
                   help="KV link between the pools, gigabits/s (400: one InfiniBand NDR port, 50 GB/s)")
    p.add_argument("--requests", type=int, default=200, help="chat requests per seed")
    p.add_argument("--rate", type=float, default=16.0, help="arrivals per second (Poisson)")
    p.add_argument("--prompt-mean", type=float, default=4096, help="mean prompt tokens (lognormal)")
    p.add_argument("--output-mean", type=float, default=128, help="mean output tokens (lognormal)")
    p.add_argument("--seeds", type=int, default=5, help="workloads to take medians over")
    p.add_argument("--ttft", type=float, default=SLO.ttft_s, help="SLO on time to first token, seconds")
    p.add_argument("--tpot", type=float, default=SLO.tpot_s, help="SLO on time per output token, seconds")
    p.set_defaults(func=run)


def _cost_model(args):
    """The paper GPU for the flags, after checking every flag (a ValueError names the flag and its range)."""
    if args.gpus < 2:
        raise ValueError(f"--gpus must be an integer >= 2 (one GPU for each pool), got {args.gpus}")
    for p in args.prefill_gpus or ():
        if not 1 <= p < args.gpus:
            raise ValueError(f"--prefill-gpus must be in [1, {args.gpus - 1}] for --gpus {args.gpus}, got {p}")
    for flag, value, least in (("--requests", args.requests, 1), ("--seeds", args.seeds, 1),
                               ("--prompt-mean", args.prompt_mean, 1), ("--output-mean", args.output_mean, 1)):
        if not value >= least:
            raise ValueError(f"{flag} must be >= {least}, got {value:g}")
    for flag, value in (("--rate", args.rate), ("--link-gbps", args.link_gbps), ("--ttft", args.ttft),
                        ("--tpot", args.tpot)):
        if not 0 < value < float("inf"):
            raise ValueError(f"{flag} must be a number > 0, got {value:g}")
    cost = CostModel(get_model_config(args.model), get_gpu(args.gpu))
    if cost.kv_capacity_tokens == 0:
        raise ValueError(f"--model {args.model}: its weights do not fit in one {cost.gpu.name} with room for KV, and "
                         "this simulator puts a whole copy on every GPU (pick a smaller model or a larger GPU)")
    return cost


def run(args) -> int:
    """``python -m miniengine disagg``: colocated against every prefill/decode split, medians over seeds."""
    cost = _cost_model(args)
    slo, context = SLO(args.ttft, args.tpot), cost.config.max_position_embeddings
    splits = sorted(set(args.prefill_gpus or range(1, args.gpus)))
    rows = compare_splits(lambda seed: workload(args.requests, args.rate, seed, args.prompt_mean, args.output_mean,
                                                context),
                          cost, args.gpus, splits, args.link_gbps * 1e9 / 8, range(args.seeds), slo)
    print(f"{args.model} on {args.gpus} paper {cost.gpu.name} GPUs (one model copy each), KV link "
          f"{args.link_gbps:g} Gb/s; {args.requests} chat requests at {args.rate:g}/s, prompts ~{args.prompt_mean:g} "
          f"and outputs ~{args.output_mean:g} tokens (lognormal, cut to the {context:,}-token context); "
          f"SLO TTFT <= {args.ttft:g} s, TPOT <= {args.tpot * 1e3:g} ms; medians over {args.seeds} seeds")
    width = max(map(len, rows))
    print(f"{'arrangement':<{width}} {'TTFT P50':>9} {'TTFT P99':>9} {'TPOT P99':>9} {'max ITL':>9} {'SLO met':>8}")
    print(f"{'':<{width}} {'(ms)':>9} {'(ms)':>9} {'(ms)':>9} {'(ms)':>9} {'':>8}")
    for name, r in rows.items():
        ms = " ".join(f"{r[m] * 1e3:>9.1f}" for m in REPORTED[:4])
        print(f"{name:<{width}} {ms} {r['slo_attainment']:>8.0%}")
    print("\n".join(verdict(rows, slo)))
    return 0
