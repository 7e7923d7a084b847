"""The speculative step, a component of the engine: draft, verify in one target pass, report what the verifier kept.

    LLM(speculative_model="draft", num_speculative_tokens=4)                       # coupled verifier
    LLM(speculative_model="draft", num_speculative_tokens=4, speculative_verifier="rejection")

As in vLLM's spec-decode worker, it gets what it uses and nothing else: the target's model runner and KV layout,
a proposer (the draft model with a cache of its own), a verifier, and the step's budgets in the scheduled batch.
The scheduler has already given every decoding sequence KV slots for its last token and the drafts it may verify
(``ScheduledBatch.num_lookahead_slots``, from ``Scheduler.lookahead``).  Then ``LLMEngine.step`` runs:

1. ``propose_and_verify(batch, live_seq_ids)``: the proposer drafts up to γ_i tokens for each decode (fewer near
   its max_tokens); the runner feeds [last, x_1..x_γ] at positions N..N+γ through the same seam as any step (a
   multi-token decode), beside the step's prefills, with the drafts carried by the batch
   (``ScheduledBatch.with_drafts``), never written into a sequence; each decode's verifier returns the tokens it
   emits (k accepted drafts and one of the target's).  It returns the batch as fed and one row of tokens per
   sample row;
2. ``Scheduler.postprocess`` appends every row the one way it appends any: token by token, the one stop rule
   after each, the accepted drafts' K/V kept;
3. ``rollback(batch)``: the target's KV memory goes back to the confirmed tokens (``kv.truncate``: blocks taken
   for rejected drafts return to the pool); the draft's is rolled back at its next proposal.

Each sequence accepts a different number of tokens in the same step.
"""
from __future__ import annotations

import time

import torch

from miniengine import plugs
from miniengine.engine.batch import ScheduledBatch
from miniengine.plugs.conformance import check, check_speculative_kv
from miniengine.spec.proposer import DraftProposer
from miniengine.spec.verify import coupled_verify, rejection_verify


def check_emitted(emitted, drafts) -> None:
    """A verifier is a plug point: say exactly which rule its answer breaks."""
    if not isinstance(emitted, (list, tuple)) or not 1 <= len(emitted) <= len(drafts) + 1:
        raise RuntimeError(f"a verifier must return a list of 1 to {len(drafts) + 1} tokens (the accepted drafts, then "
                           f"one of the target's), got {emitted!r}")
    if list(emitted[:-1]) != list(drafts[:len(emitted) - 1]):
        raise RuntimeError(f"a verifier's tokens before the last must be the accepted drafts {list(drafts)}, "
                           f"in order; got {list(emitted)}")


class SpeculativeDecoder:
    """``runner``: the target's ModelRunner; ``kv``: its KV layout (plugs.SpeculativeKV, rolled back here);
    ``draft_model``: the draft, for the course's proposer (or ``proposer``, a plugs.Proposer); ``gamma``: drafts per
    step; ``verifier``: "coupled", "rejection" or a plugs.Verifier.  ``max_num_seqs``, ``kv_cache_tokens`` and
    ``block_size`` size the draft's own pool: every sequence the target holds, plus its drafts and a partial block."""

    def __init__(self, runner, kv, draft_model, gamma: int, verifier, *, max_num_seqs: int, kv_cache_tokens: int,
                 block_size: int, proposer=None):
        self.runner, self.kv, self.gamma = runner, check_speculative_kv(kv), gamma
        # A verifier function (the plug point) verifies like rejection sampling: it needs the draft's q rows.
        self.verify = (coupled_verify if verifier == "coupled" else rejection_verify if verifier == "rejection" else
                       check("speculative_verifier", verifier, plugs.Verifier))
        if proposer is None:
            positions = kv_cache_tokens + max_num_seqs * (gamma + 2 * block_size)
            proposer = DraftProposer(draft_model, -(-positions // block_size), block_size,
                                     "coupled" if verifier == "coupled" else "rejection")
        self.proposer = check("proposer", proposer, plugs.Proposer)
        self.accepted = self.drafted = self.target_calls = 0  # for alpha and tokens per target call
        self.verified = self.rejected = 0  # verifications (one per decoding sequence per step), and those that rejected
        self.seconds = {"draft": 0.0, "target": 0.0, "verify and the rest": 0.0}  # where a speculative step's time goes

    def propose_and_verify(self, batch: ScheduledBatch, live_seq_ids) -> tuple[ScheduledBatch, list[list[int]]]:
        """Draft for the batch's decodes, run the target once over the batch with the drafts fed, verify.

        ``live_seq_ids``: the sequences running now (the proposer forgets the others).  Returns the batch as fed
        (``draft_token_ids`` set) and, for each row of its ``sample_rows()``, the tokens it emits: a decode's
        accepted drafts and one of the target's, a prefill's one sampled token (n after a fork)."""
        t0 = time.perf_counter()
        decodes = batch.seqs[: batch.num_decodes]
        self.proposer.release(live_seq_ids)
        gammas = list(batch.num_lookahead_slots[: batch.num_decodes])
        drafts, qs = self.proposer.propose(decodes, gammas)
        t_draft = time.perf_counter()
        fed_batch = batch.with_drafts(drafts)
        fed = fed_batch.num_fed_tokens
        ends = torch.tensor(fed).cumsum(0)
        rows = [r for i, (e, n) in enumerate(zip(ends.tolist(), fed)) for r in (range(e - n, e) if i < len(decodes) else [e - 1])]
        logits = self.runner.forward(fed_batch, rows)  # every fed row of a decode, the last row of a prefill
        t_target = time.perf_counter()
        self.target_calls += 1
        out, r = [], 0
        for i, (s, d) in enumerate(zip(decodes, drafts)):
            target = logits[r:r + fed[i]].double().cpu().numpy()
            r += fed[i]
            first = s.num_tokens  # the position x_1 was drafted for
            positions = list(range(first, first + len(d) + 1))
            if self.verify is coupled_verify:
                emitted = coupled_verify(target, d, s.params, positions)
            else:
                emitted = self.verify(target, list(d), qs[i], s.params, positions)
                check_emitted(emitted, d)
            self.drafted += len(d)
            self.accepted += len(emitted) - 1
            self.verified += 1
            self.rejected += len(emitted) - 1 < len(d)
            out.append([int(t) for t in emitted])
        prefills = ScheduledBatch(batch.seqs[batch.num_decodes:], batch.num_new_tokens[batch.num_decodes:])
        if prefills.seqs:
            out += [[t] for t in self.runner.sample(prefills, logits[r:])]
        self.seconds["draft"] += t_draft - t0
        self.seconds["target"] += t_target - t_draft
        self.seconds["verify and the rest"] += time.perf_counter() - t_target
        return fed_batch, out

    def rollback(self, batch: ScheduledBatch) -> None:
        """After ``Scheduler.postprocess``: each decode still running forgets the K/V past its confirmed tokens."""
        t0 = time.perf_counter()
        for s in batch.seqs[: batch.num_decodes]:
            if not s.is_finished:
                self.kv.truncate(s, s.num_cached_tokens)
        self.seconds["verify and the rest"] += time.perf_counter() - t0

    @property
    def tokens_per_call(self) -> float:
        """Tokens each target pass produced per decoding sequence, on average: accepted drafts plus one."""
        return (self.accepted + self.verified) / self.verified if self.verified else 0.0

    @property
    def alpha(self) -> float:
        """The acceptance rate: accepted drafts over the drafts the verifier ruled on (those after the first
        rejection of a step are never looked at), the α of (1 − α^(γ+1)) / (1 − α)."""
        ruled = self.accepted + self.rejected
        return self.accepted / ruled if ruled else 0.0
