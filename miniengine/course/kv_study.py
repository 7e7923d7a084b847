"""KV memory under a chat workload: contiguous reservation against paged blocks, at equal memory.

    reqs = chat_requests(200, seed=0)
    for layout in ("contiguous", "paged"):
        r = kv_study(reqs, kv_tokens=65536, layout=layout)
        print(layout, f"{r.utilisation:.1%}", r.mean_running, r.max_running, r.preemptions)

The engine's real :class:`~miniengine.engine.scheduler.Scheduler` and the real KV layouts
(:class:`~miniengine.kv.ContiguousKV`, :class:`~miniengine.kv.PagedKV` and its block manager) serve the
requests, all queued at once (the server is overloaded, as when its capacity is measured).  Only the model
is missing: memory is bookkeeping, so the layouts get a model of one number per position (one layer, one
head of size 1), and a request stops when it has produced the output length the workload drew for it,
which the scheduler never sees.  A request asks for ``max_tokens`` (a chat API's cap, far above most
answers): contiguous reservation must hold that much for it; paged memory grows block by block.

Each step records the positions in use (every running sequence's tokens so far, the one it feeds
included) against the positions held (reservations, or whole blocks), and how many sequences run; the
mean counts only steps at which requests were still waiting, when memory was what limited the batch.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from miniengine.engine.policy import ContinuousBatching
from miniengine.engine.scheduler import Scheduler
from miniengine.engine.sequence import Sequence
from miniengine.sampling import SamplingParams
from miniengine.kv.contiguous import ContiguousKV
from miniengine.kv.paged import PagedKV

_EOS, _OTHER = 0, 1
_ONE_NUMBER = SimpleNamespace(num_hidden_layers=1, num_key_value_heads=1, head_dim=1)  # a position is one float


def chat_requests(n: int, seed: int = 0, prompt_mean: float = 512, output_mean: float = 256, sigma: float = 1.0):
    """The simulator's chat workload (lognormal prompt and output lengths), arrival times ignored."""
    from miniengine.serving.simulator import chat_workload

    return chat_workload(n, 1.0, seed, prompt_mean, output_mean, sigma)


@dataclasses.dataclass
class KVStudy:
    layout: str
    kv_tokens: int
    utilisation: float   # positions in use / positions held, summed over steps
    mean_running: float  # sequences running per step, on average over the steps when requests were waiting
    #                      (over every step if none ever waited)
    max_running: int     # the most sequences that ever ran together
    preemptions: int
    steps: int


def kv_study(requests, kv_tokens: int, layout: str, block_size: int = 16, max_tokens: int = 2048,
             max_num_seqs: int = 256, block_manager=None) -> KVStudy:
    """Serve ``requests`` (``.prompt_len``, ``.output_len``) until all finish; see the module docstring.

    ``block_manager``: for the paged layout, a block manager class (called as ``cls(num_blocks, block_size)``)
    or instance to do the bookkeeping instead of the course's.
    """
    if layout == "paged":
        num_blocks = kv_tokens // block_size  # whole blocks that fit: never more memory than the contiguous layout
        if isinstance(block_manager, type):
            block_manager = block_manager(num_blocks, block_size)
        kv = PagedKV(_ONE_NUMBER, num_blocks, block_size, block_manager=block_manager)

        def held() -> int:
            return (num_blocks - kv.block_manager.num_free_blocks) * block_size
    elif layout == "contiguous":
        kv = ContiguousKV(_ONE_NUMBER, kv_tokens)

        def held() -> int:
            return kv.arena.slots_reserved
    else:
        raise ValueError(f"layout must be 'paged' or 'contiguous', got {layout!r}")
    scheduler = Scheduler(kv, _EOS, max_num_seqs, max_num_batched_tokens=1 << 40, policy=ContinuousBatching())
    output_len = {}
    for r in requests:
        if r.prompt_len + max_tokens > kv_tokens:
            raise ValueError(f"a request of {r.prompt_len} prompt tokens + max_tokens={max_tokens} can never fit in "
                             f"kv_tokens={kv_tokens}")
        seq = Sequence([_OTHER] * r.prompt_len, SamplingParams(max_tokens=max_tokens))
        output_len[seq.seq_id] = min(r.output_len, max_tokens)
        scheduler.add(seq)
    used_sum = held_sum = running_sum = all_running = busy_steps = steps = max_running = 0
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        if not batch.seqs:
            raise RuntimeError("the KV pool cannot hold even one waiting request: raise kv_tokens")
        used_sum += sum(s.num_tokens for s in scheduler.running)
        held_sum += held()
        all_running += len(scheduler.running)
        if scheduler.waiting:  # memory, not the queue, limits the batch
            running_sum += len(scheduler.running)
            busy_steps += 1
        max_running = max(max_running, len(scheduler.running))
        steps += 1
        tokens = [_EOS if len(s.output_token_ids) + 1 >= output_len[s.seq_id] else _OTHER for s in batch.seqs]
        scheduler.postprocess(batch, tokens)
    if not busy_steps:  # nobody ever waited: the queue, not memory, was the limit; average over every step
        running_sum, busy_steps = all_running, steps
    return KVStudy(layout, kv_tokens, used_sum / held_sum, running_sum / busy_steps, max_running,
                   scheduler.num_preemptions, steps)
