"""The scheduler: which sequences run in this step, and what happens to them after it.

``schedule()`` returns this step's batch: every running sequence decodes one
token, and the policy admits waiting ones to prefill, within the step's
sequence budget (``max_num_seqs``), token budget (``max_num_batched_tokens``)
and the KV memory left.  ``postprocess()`` appends the sampled tokens and
applies the engine's one stop rule.  Neither knows how long a request will
run: only the simulator may know that in advance.
"""
from __future__ import annotations

import dataclasses
from collections import deque

from .policy import Budget, ContinuousBatching
from .sequence import Sequence, SequenceStatus


@dataclasses.dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # tokens each sequence feeds in this step

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


def stop_reason(seq: Sequence, token_id: int, eos_token_id: int) -> str | None:
    """The engine's one stop rule: right after end-of-text (unless ignore_eos), or at max_tokens."""
    if token_id == eos_token_id and not seq.params.ignore_eos:
        return "stop"
    if len(seq.output_token_ids) >= seq.params.max_tokens:
        return "length"
    return None


class Scheduler:
    def __init__(self, kv, eos_token_id: int, max_num_seqs: int, max_num_batched_tokens: int, policy=None):
        self.kv, self.eos_token_id = kv, eos_token_id
        self.policy = policy if policy is not None else ContinuousBatching()
        # A policy may bring its own batch limit (batch-1 FCFS, a static batch size) within the engine's.
        own = getattr(self.policy, "max_num_seqs", None)
        self.max_num_seqs = min(max_num_seqs, own) if own else max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id) -> Sequence | None:
        """Stop a request wherever it is, and free everything it holds."""
        for queue in (self.waiting, self.running):
            for seq in list(queue):
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self._finish(seq, "abort")
                    return seq
        return None

    def schedule(self, now: float = 0.0) -> ScheduledBatch:
        decodes = self.running[: self.max_num_seqs]
        budget = Budget(max_seqs=self.max_num_seqs - len(decodes),
                        max_tokens=self.max_num_batched_tokens - len(decodes),
                        can_allocate=self.kv.can_allocate, now=now)
        admitted = list(self.policy.admit(tuple(self.waiting), tuple(decodes), budget))
        self._check(admitted, budget)
        prefills = []
        for seq in admitted:  # in order; stop at the first one KV memory no longer holds
            if not self.kv.can_allocate(seq):
                break
            self.kv.allocate(seq)
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            prefills.append(seq)
        seqs = decodes + prefills
        return ScheduledBatch(seqs, [s.num_new_tokens for s in seqs])

    def _check(self, admitted, budget: Budget) -> None:
        """A policy is a plug point: say exactly which rule its answer breaks."""
        name = type(self.policy).__name__
        queued = {id(s) for s in self.waiting}
        if any(id(s) not in queued for s in admitted) or len({id(s) for s in admitted}) != len(admitted):
            raise RuntimeError(f"{name}.admit must return distinct sequences taken from `waiting`")
        if len(admitted) > budget.max_seqs:
            raise RuntimeError(f"{name}.admit returned {len(admitted)} sequences, but only {budget.max_seqs} may join "
                               f"this step (max_num_seqs={self.max_num_seqs})")
        tokens = sum(s.num_new_tokens for s in admitted)
        if tokens > budget.max_tokens:
            raise RuntimeError(f"{name}.admit returned {tokens} prompt tokens, but only {budget.max_tokens} fit in this "
                               f"step (max_num_batched_tokens={self.max_num_batched_tokens})")

    def postprocess(self, batch: ScheduledBatch, token_ids: list[int]) -> list[Sequence]:
        """Append each sequence's sampled token; return the sequences that finished in this step."""
        finished = []
        for seq, n, tok in zip(batch.seqs, batch.num_new_tokens, token_ids):
            seq.num_cached_tokens += n
            seq.tokens_processed += n
            seq.token_ids.append(int(tok))
            reason = stop_reason(seq, int(tok), self.eos_token_id)
            if reason is not None:
                self.running.remove(seq)
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    def _finish(self, seq: Sequence, reason: str) -> None:
        if seq.kv is not None:
            self.kv.free(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
