"""A speculative engine step: draft, verify in one target pass, keep what the verifier accepts, roll back.

    LLM(speculative_model="draft", num_speculative_tokens=4)                       # coupled verifier
    LLM(speculative_model="draft", num_speculative_tokens=4, speculative_verifier="rejection")

The scheduler has already given every decoding sequence KV slots for its last token and the drafts
(``Scheduler.lookahead``).  Then:

1. the proposer drafts γ_i tokens for each decoding sequence (fewer near its max_tokens);
2. the drafts are appended to the sequences for one pass, so that the runner feeds [last, x_1..x_γ]
   at positions N..N+γ, through the same seam as any step (a multi-token decode), together with the
   step's prefills; the target's logits are kept for every fed row of a decode;
3. each decode's verifier returns the tokens it emits (k accepted drafts and one of the target's);
   ``Scheduler.postprocess`` appends them, stopping at end-of-text or max_tokens;
4. the target's KV memory is rolled back to the confirmed tokens (``kv.truncate``: blocks allocated for
   rejected drafts go back to the pool); the draft's is rolled back at its next proposal.

Each sequence accepts a different number of tokens in the same step.
"""
from __future__ import annotations

import torch

from ..engine.scheduler import ScheduledBatch
from .proposer import DraftProposer
from .verify import coupled_verify, rejection_verify

VERIFIERS = ("coupled", "rejection")


class SpeculativeDecoder:
    def __init__(self, engine, draft_model, gamma: int, verifier: str):
        self.engine, self.gamma, self.verifier = engine, gamma, verifier
        c = engine.config
        # The draft's pool holds every sequence the target can hold, plus its drafts and a partial block each.
        positions = c.kv_cache_tokens + c.max_num_seqs * (gamma + 2 * c.block_size)
        self.proposer = DraftProposer(draft_model, -(-positions // c.block_size), c.block_size, verifier)
        self.accepted = self.drafted = self.target_calls = 0  # for alpha and tokens per target call

    def step(self, batch: ScheduledBatch) -> list:
        sched, runner, kv = self.engine.scheduler, self.engine.runner, self.engine.kv
        decodes = batch.seqs[: batch.num_decodes]
        self.proposer.release({s.seq_id for s in sched.running})
        gammas = [sched.lookahead(s) for s in decodes]
        drafts, qs = self.proposer.propose(decodes, gammas)
        fed = list(batch.num_new_tokens)
        for i, (s, d) in enumerate(zip(decodes, drafts)):
            s.token_ids.extend(d)  # only for this pass: the runner feeds token_ids[num_cached:]
            fed[i] = 1 + len(d)
        step = ScheduledBatch(batch.seqs, fed, batch.num_decodes)
        ends = torch.tensor(fed).cumsum(0)
        rows = [r for i, (e, n) in enumerate(zip(ends.tolist(), fed)) for r in (range(e - n, e) if i < len(decodes) else [e - 1])]
        logits = runner.forward(step, rows)
        for s, d in zip(decodes, drafts):
            del s.token_ids[len(s.token_ids) - len(d):]
        self.target_calls += 1
        out, r = [], 0
        for i, (s, d) in enumerate(zip(decodes, drafts)):
            target = logits[r:r + fed[i]].double().cpu().numpy()
            r += fed[i]
            first = s.num_tokens  # the position x_1 was drafted for
            positions = list(range(first, first + len(d) + 1))
            if self.verifier == "coupled":
                emitted = coupled_verify(target, d, s.params, positions)
            else:
                emitted = rejection_verify(target, d, qs[i], s.params, positions)
            self.drafted += len(d)
            self.accepted += len(emitted) - 1
            out.append(emitted)
        prefills = ScheduledBatch(batch.seqs[batch.num_decodes:], batch.num_new_tokens[batch.num_decodes:])
        if prefills.seqs:
            out += runner.sample(prefills, logits[r:])
        forking = {s.seq_id for s in prefills.seqs if s.fork_pending}
        finished = sched.postprocess(step, out)
        for s in decodes:
            if not s.is_finished:
                kv.truncate(s, s.num_cached_tokens)
        stepped = [c for s in batch.seqs for c in (s.completions if s.seq_id in forking else [s])]
        return stepped, finished

    @property
    def alpha(self) -> float:
        """Share of drafted tokens the target accepted."""
        return self.accepted / self.drafted if self.drafted else 0.0
