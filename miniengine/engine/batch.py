"""The scheduled batch: what one step feeds, sequence by sequence, and what each row of its output means.

``Scheduler.schedule()`` makes one; ``ModelRunner`` feeds it (``tokens_to_feed``, ``num_fed_tokens``);
``Scheduler.postprocess()`` appends what its rows emitted.  A speculative step (spec/decoding.py) feeds each
decode's drafted tokens after its own (``with_drafts``), so no sequence's tokens change before the verifier
has ruled on them.
"""
from __future__ import annotations

import dataclasses
import numbers

from miniengine.engine.sequence import Sequence
from miniengine.sampling import SamplingParams, child_params


@dataclasses.dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # tokens of its own each sequence feeds now: a prompt (or a chunk), or its last token
    num_decodes: int = 0       # the first num_decodes sequences were running before this step
    # Speculative decoding: the KV slots the scheduler reserved past each decode's last token (Scheduler.lookahead),
    # and the drafted tokens each decode feeds after its own in this pass (spec.decoding).  Empty otherwise.
    num_lookahead_slots: list[int] = dataclasses.field(default_factory=list)
    draft_token_ids: list[list[int]] = dataclasses.field(default_factory=list)
    # One entry per sample row (sample_rows()) when a row asks for logprobs: {token id: logprob} or None.
    logprobs: list | None = None

    def drafts(self, i: int) -> list[int]:
        """The drafted tokens sequence i feeds after its own new tokens (none outside a speculative step)."""
        return self.draft_token_ids[i] if i < len(self.draft_token_ids) else []

    @property
    def num_fed_tokens(self) -> list[int]:
        """Tokens each sequence feeds in this pass: its own new tokens, then its drafts."""
        return [n + len(self.drafts(i)) for i, n in enumerate(self.num_new_tokens)]

    def tokens_to_feed(self, i: int) -> list[int]:
        """Sequence i's fed tokens, in order: the ones after its cached positions, then its drafts."""
        s, n = self.seqs[i], self.num_new_tokens[i]
        return s.token_ids[s.num_cached_tokens:s.num_cached_tokens + n] + self.drafts(i)

    def with_drafts(self, drafts) -> "ScheduledBatch":
        """This batch with ``drafts[i]`` fed after decode i's last token (the sequences are left as they are)."""
        return dataclasses.replace(self, draft_token_ids=[list(d) for d in drafts])

    @property
    def num_tokens(self) -> int:
        return sum(self.num_fed_tokens)

    def partial(self, i: int) -> bool:
        """Does sequence i feed only a chunk of what it must feed (a chunked prefill, not its last chunk)?"""
        return self.num_new_tokens[i] < self.seqs[i].num_new_tokens

    def sample_rows(self) -> list[tuple[int, SamplingParams]]:
        """(index into seqs, params) of every token to sample: one per sequence, n for a sequence whose
        request forks its other completions after this (prefill) step, each with its own seed; none for a
        sequence whose prefill goes on in a later step."""
        rows = []
        for i, s in enumerate(self.seqs):
            if self.partial(i):
                continue
            if s.fork_pending:
                rows += [(i, child_params(s.params, c)) for c in range(s.params.n)]
            else:
                rows.append((i, s.params))
        return rows


def emitted_tokens(row) -> list[int]:
    """One row of ``postprocess``'s token_ids as a list of token ids (a bare id, the simulator's shorthand, is one)."""
    return [int(row)] if isinstance(row, numbers.Integral) else [int(t) for t in row]
