"""The proposer: the draft model, with a KV cache of its own, drafts γ tokens for each decoding sequence.

The draft keeps a *view* of every sequence it drafts for: the tokens as it knows them and how many of
them its cache holds.  Before each proposal the view is brought back in line with the target's sequence:
the draft's cache keeps only the longest prefix both agree on (a rejected draft's K/V is dropped, whole
blocks go back to the pool), and the tokens it has not seen yet (the target's own token, or the prompt of
a new sequence) are fed in the first draft step.  The draft's cache is always paged, whatever the
target's layout: its sequences grow and shrink by a few tokens every step.
"""
from __future__ import annotations

from miniengine.engine.model_runner import ModelRunner
from miniengine.engine.scheduler import ScheduledBatch
from miniengine.kv.paged import PagedKV
from miniengine.spec.verify import draft_token


class DraftView:
    """A sequence as the draft knows it (the block manager reads ``seq_id`` and ``num_tokens``)."""

    def __init__(self, seq):
        self.seq_id, self.params = seq.seq_id, seq.params
        self.token_ids = list(seq.token_ids)
        self.num_cached_tokens = 0
        self.kv = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftProposer:
    def __init__(self, model, num_blocks: int, block_size: int, verifier: str):
        self.model, self.verifier = model, verifier
        self.kv = PagedKV(model.config, num_blocks, block_size, model.dtype, model.device)
        self.runner = ModelRunner(model, self.kv, sampler=None)  # its forward only: the draft samples below
        self.views: dict[int, DraftView] = {}

    def release(self, live_seq_ids) -> None:
        """Forget the views (and free the draft memory) of sequences no longer decoding."""
        for sid in [s for s in self.views if s not in live_seq_ids]:
            view = self.views.pop(sid)
            if view.kv is not None:
                self.kv.free(view)

    def _sync(self, seq) -> DraftView:
        view = self.views.get(seq.seq_id)
        if view is None:
            view = self.views[seq.seq_id] = DraftView(seq)
            return view
        # At least the last token stays to be fed: the draft needs a new row to propose from.
        keep = min(view.num_cached_tokens, common_prefix(view.token_ids, seq.token_ids), len(seq.token_ids) - 1)
        view.token_ids, view.num_cached_tokens = list(seq.token_ids), keep
        if view.kv is not None:
            self.kv.truncate(view, keep)
        return view

    def propose(self, seqs, gammas) -> tuple[list[list[int]], list[list]]:
        """Up to ``gammas[i]`` drafted tokens for each sequence, and (rejection sampling) the q rows they came from."""
        views = [self._sync(s) for s in seqs]
        drafts, qs = [[] for _ in seqs], [[] for _ in seqs]
        for j in range(max(gammas, default=0)):
            active = [i for i, g in enumerate(gammas) if g > j]
            batch = [views[i] for i in active]
            for v in batch:
                if v.kv is None:
                    if not self.kv.can_allocate(v):
                        raise RuntimeError("the draft's KV pool is full: it is sized to hold every running sequence")
                    self.kv.allocate(v)
                else:
                    self.kv.cover(v, v.num_tokens)
            new = [v.num_tokens - v.num_cached_tokens for v in batch]
            logits = self.runner.forward(ScheduledBatch(batch, new)).double().cpu().numpy()  # each view's last row
            for i, v, n, row in zip(active, batch, new, logits):
                v.num_cached_tokens += n
                tok, q = draft_token(row, v.params, v.num_tokens, self.verifier)
                v.token_ids.append(tok)
                drafts[i].append(tok)
                qs[i].append(q)
        return drafts, qs
