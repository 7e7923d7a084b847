"""``bench kv`` (milestone 5, PagedAttention): KV utilisation and concurrency, contiguous against paged KV memory,
at equal memory."""
from __future__ import annotations


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


def register(sub) -> None:
    """Adds ``bench kv`` and its flags to the ``bench`` sub-commands."""
    k = sub.add_parser("kv", help="KV utilisation and concurrent sequences: paged vs contiguous at equal memory")
    k.add_argument("--requests", type=int, default=200)
    k.add_argument("--kv-tokens", type=int, default=65536, help="KV positions, the same for both layouts")
    k.add_argument("--block-size", type=int, default=16)
    k.add_argument("--max-tokens", type=int, default=2048, help="what each request asks for (its cap)")
    k.add_argument("--max-num-seqs", type=int, default=256)
    k.add_argument("--seed", type=int, default=0)
    k.set_defaults(func=kv)
