"""Scheduling policies: which waiting requests join the next step.

Interface (what ``LLM(..., scheduling_policy=...)`` accepts): an object with

    admit(waiting, running, budget) -> list[Sequence]

``waiting`` is the FCFS queue (oldest first), ``running`` the sequences that
will decode this step, and ``budget`` a :class:`Budget` of what is left of the
step's sequence and token limits and of KV memory, and the clock.  It returns
the waiting sequences to prefill in this step, in order.  The scheduler checks
the answer against the budget, allocates KV memory (stopping at the first that
no longer fits), and runs those prefills together with the running decodes
(selective batching: ragged tokens in one pass).

Optional: ``wake_time(waiting)``, the time at which a policy that is holding
requests back on purpose (a batching timeout) wants to be asked again, and
``padding()``, sequences that finished but still occupy seats (static batching
without early exit): the simulator prices them.

The same objects run the real engine (wall clock) and the simulator (the cost
model's clock): a policy never sees output lengths, only the queues.
"""
from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass
class Budget:
    max_seqs: int    # sequences that may still join this step
    max_tokens: int  # tokens that may still join this step
    can_allocate: Callable  # can_allocate(seq) -> bool: does KV memory for it fit now?
    now: float = 0.0        # the clock: wall time in the engine, simulated time in the simulator


def fits(seq, seqs_left: int, tokens_left: int, can_allocate) -> bool:
    """May this waiting sequence join the step: a seat left, its prompt within the token budget, KV memory for it."""
    return seqs_left >= 1 and seq.num_new_tokens <= tokens_left and bool(can_allocate(seq))


class FCFSPolicy:
    """Iteration-level first-come first-served: admit from the head of the queue while the step has room.

    It stops at the first request that does not fit, so a later, smaller request
    never overtakes an earlier one (no starvation of long prompts).  With
    ``max_num_seqs=1`` this is the batch-1 server; with more, continuous batching.
    """

    def __init__(self, max_num_seqs: int | None = None):
        self.max_num_seqs = max_num_seqs  # None: the engine's own limit

    def admit(self, waiting, running, budget: Budget):
        admitted, seqs, tokens = [], budget.max_seqs, budget.max_tokens
        for seq in waiting:
            if not fits(seq, seqs, tokens, budget.can_allocate):
                break
            admitted.append(seq)
            seqs, tokens = seqs - 1, tokens - seq.num_new_tokens
        return admitted


class ContinuousBatching(FCFSPolicy):
    """Iteration-level scheduling, as in Orca (Yu et al., OSDI 2022): every step, finished requests have already
    left (the scheduler retires them in postprocess) and waiting ones join, oldest first, while the step's
    sequence and token budgets and the KV memory allow.  Running decodes always go first, so they never starve.

    The same rule as :class:`FCFSPolicy`; the name says what it is for.  ``max_num_seqs`` caps the batch.
    """


class StaticBatching:
    """Request-level batching: gather ``batch_size`` requests (or wait ``timeout_s`` past the oldest's
    arrival), prefill them together, decode until the last of them is done, and only then admit more.

    With ``pad_finished`` (the default, like FasterTransformer-era engines) finished requests keep
    their seats and are computed along with the others until the batch ends; without it they stop
    being computed, but their seats still cannot go to a waiting request.
    """

    def __init__(self, batch_size: int, timeout_s: float = 0.2, pad_finished: bool = True):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        self.batch_size, self.timeout_s, self.pad_finished = batch_size, timeout_s, pad_finished
        self.max_num_seqs = batch_size
        self.batch: list = []

    def admit(self, waiting, running, budget: Budget):
        if running or not waiting:
            return []
        if len(waiting) < self.batch_size and budget.now < waiting[0].arrival_time + self.timeout_s:
            return []
        self.batch, tokens = [], budget.max_tokens
        for seq in waiting[: min(self.batch_size, budget.max_seqs)]:
            if seq.num_new_tokens > tokens:
                break
            self.batch.append(seq)
            tokens -= seq.num_new_tokens
        return list(self.batch)

    def wake_time(self, waiting):
        return waiting[0].arrival_time + self.timeout_s if waiting and len(waiting) < self.batch_size else None

    def padding(self):
        """Finished members of the current batch that still hold their seats while others decode."""
        if not self.pad_finished or all(s.is_finished for s in self.batch):
            return []
        return [s for s in self.batch if s.is_finished]
