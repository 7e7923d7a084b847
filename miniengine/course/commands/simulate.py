"""``python -m miniengine simulate``: batch-1 FCFS, static and continuous batching on the paper GPU, over seeds.

The simulator itself is :mod:`miniengine.serving.simulator`; this module runs the three policies on the same
seeded workloads (:func:`compare_policies`), prints mean ± standard deviation [min, max] over the seeds
(:func:`compare_table`), and holds the command's flags.
"""
from __future__ import annotations

import numpy as np

from miniengine.cost.roofline import GPUS, CostModel, llama3_8b
from miniengine.engine.policy import ContinuousBatching, StaticBatching
from miniengine.serving.metrics import SLO, summarize
from miniengine.serving.simulator import FCFS, simulate
from miniengine.serving.workloads import chat_workload


COMPARED = ("throughput_tok_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
            "itl_p50_s", "itl_p90_s", "itl_p99_s", "slo_attainment", "goodput_req_s")


def compare_policies(model, rate: float, seeds=range(5), n_requests: int = 300, slo: SLO = SLO(),
                     static_batch: int = 32, max_num_seqs: int = 256, **workload) -> dict:
    """Batch-1 FCFS, static and continuous batching on the same seeded workloads, one per seed.

    Returns {policy: {metric: array of one value per seed}}: average them, and look at their spread.
    """
    policies = {"batch-1 FCFS": FCFS, f"static B={static_batch}": lambda: StaticBatching(static_batch),
                f"continuous ({max_num_seqs} seats)": ContinuousBatching}
    out = {name: {m: [] for m in COMPARED} for name in policies}
    for seed in seeds:
        for name, make in policies.items():
            run = simulate(chat_workload(n_requests, rate, seed, **workload), make(), model, max_num_seqs=max_num_seqs)
            row = summarize(run.timelines, slo)
            for m in COMPARED:
                out[name][m].append(row[m])
    return {name: {m: np.array(v) for m, v in rows.items()} for name, rows in out.items()}


def compare_table(results: dict) -> str:
    """mean ± standard deviation [min, max] over seeds, one column per policy; latencies in ms."""
    names = list(results)
    lines = [f"{'metric':<20}" + "".join(f"{n:>40}" for n in names)]
    for m in COMPARED:
        latency = m.startswith(("ttft", "tpot", "itl"))
        scale, label = (1e3, m[:-2] + " (ms)") if latency else (1.0, m)
        cells = []
        for n in names:
            v = results[n][m] * scale
            cells.append(f"{v.mean():.4g} ± {v.std():.2g} [{v.min():.4g}, {v.max():.4g}]")
        lines.append(f"{label:<20}" + "".join(f"{c:>40}" for c in cells))
    return "\n".join(lines)


def run_compare(args) -> int:
    """``python -m miniengine simulate``: the three policies on the paper GPU, averaged over seeds."""
    model = CostModel(llama3_8b(), GPUS[args.gpu])
    slo = SLO(ttft_s=args.ttft, tpot_s=args.tpot)
    results = compare_policies(model, args.rate, range(args.seeds), args.requests, slo, args.static_batch, args.max_num_seqs)
    print(f"simulated: Llama-3-8B on a paper {args.gpu}, {args.requests} chat requests at {args.rate}/s, "
          f"SLO TTFT <= {args.ttft} s and TPOT <= {1e3 * args.tpot:.0f} ms, {args.seeds} seeds: mean ± std [min, max]")
    print(compare_table(results))
    return 0


def add_arguments(p) -> None:
    p.add_argument("--rate", type=float, default=1.0, help="arrivals per second")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--gpu", default="H100", choices=["H100", "H200", "A100-80GB", "T4"])
    p.add_argument("--ttft", type=float, default=1.0, help="SLO on time to first token, seconds")
    p.add_argument("--tpot", type=float, default=0.05, help="SLO on time per output token, seconds")
    p.add_argument("--static-batch", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.set_defaults(func=run_compare)
