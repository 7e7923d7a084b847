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

import time

import torch

from miniengine.engine.scheduler import ScheduledBatch
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
    def __init__(self, engine, draft_model, gamma: int, verifier):
        self.engine, self.gamma = engine, gamma
        # A verifier function (the plug point) verifies like rejection sampling: it needs the draft's q rows.
        self.verify = (coupled_verify if verifier == "coupled" else
                       rejection_verify if verifier == "rejection" else verifier)
        c = engine.config
        # The draft's pool holds every sequence the target can hold, plus its drafts and a partial block each.
        positions = c.kv_cache_tokens + c.max_num_seqs * (gamma + 2 * c.block_size)
        self.proposer = DraftProposer(draft_model, -(-positions // c.block_size), c.block_size,
                                      "coupled" if verifier == "coupled" else "rejection")
        self.accepted = self.drafted = self.target_calls = 0  # for alpha and tokens per target call
        self.verified = self.rejected = 0  # verifications (one per decoding sequence per step), and those that rejected
        self.seconds = {"draft": 0.0, "target": 0.0, "verify and the rest": 0.0}  # where a speculative step's time goes

    def step(self, batch: ScheduledBatch) -> list:
        """Draft, verify and roll back; returns the sequences that finished (the engine reports who stepped)."""
        t0 = time.perf_counter()
        sched, runner, kv = self.engine.scheduler, self.engine.runner, self.engine.kv
        decodes = batch.seqs[: batch.num_decodes]
        self.proposer.release({s.seq_id for s in sched.running})
        gammas = [sched.lookahead(s) for s in decodes]
        drafts, qs = self.proposer.propose(decodes, gammas)
        t_draft = time.perf_counter()
        fed = list(batch.num_new_tokens)
        for i, (s, d) in enumerate(zip(decodes, drafts)):
            s.token_ids.extend(d)  # only for this pass: the runner feeds token_ids[num_cached:]
            fed[i] = 1 + len(d)
        step = ScheduledBatch(batch.seqs, fed, batch.num_decodes)
        ends = torch.tensor(fed).cumsum(0)
        rows = [r for i, (e, n) in enumerate(zip(ends.tolist(), fed)) for r in (range(e - n, e) if i < len(decodes) else [e - 1])]
        t_forward = time.perf_counter()
        logits = runner.forward(step, rows)
        t_target = time.perf_counter()
        for s, d in zip(decodes, drafts):
            del s.token_ids[len(s.token_ids) - len(d):]
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
            out.append(emitted)
        prefills = ScheduledBatch(batch.seqs[batch.num_decodes:], batch.num_new_tokens[batch.num_decodes:])
        if prefills.seqs:
            out += runner.sample(prefills, logits[r:])
        finished = sched.postprocess(step, out)
        for s in decodes:
            if not s.is_finished:
                kv.truncate(s, s.num_cached_tokens)
        self.seconds["draft"] += t_draft - t0
        self.seconds["target"] += t_target - t_forward
        self.seconds["verify and the rest"] += time.perf_counter() - t0 - (t_draft - t0) - (t_target - t_forward)
        return finished

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
