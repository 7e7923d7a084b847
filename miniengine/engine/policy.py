"""Scheduling policies: which waiting requests join the next step.

Interface (what ``LLM(..., scheduling_policy=...)`` accepts): an object with

    admit(waiting, running, budget) -> list[Sequence]

``waiting`` is the FCFS queue (oldest first), ``running`` the sequences that
will decode this step, and ``budget`` a :class:`Budget` of what is left of the
step's sequence and token limits and of KV memory.  It returns the waiting
sequences to prefill in this step, in order.  The scheduler checks the answer
against the budget, allocates KV memory, and runs those prefills together with
the running decodes (selective batching: ragged tokens in one pass).
"""
from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass
class Budget:
    max_seqs: int    # sequences that may still join this step
    max_tokens: int  # tokens that may still join this step
    can_allocate: Callable  # can_allocate(seq) -> bool: does KV memory for it fit now?


class FCFSPolicy:
    """Iteration-level first-come first-served: admit from the head of the queue while the step has room.

    It stops at the first request that does not fit, so a later, smaller request
    never overtakes an earlier one (no starvation of long prompts).
    """

    def admit(self, waiting, running, budget: Budget):
        admitted, seqs, tokens = [], budget.max_seqs, budget.max_tokens
        for seq in waiting:
            if seqs < 1 or seq.num_new_tokens > tokens or not budget.can_allocate(seq):
                break
            admitted.append(seq)
            seqs, tokens = seqs - 1, tokens - seq.num_new_tokens
        return admitted
