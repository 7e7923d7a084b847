"""The model runner: one scheduled batch in, one sampled token per sequence out.

It flattens the batch's new tokens into ``input_ids``, asks the KV plug for the
step's backend (which knows the positions and where K/V live), runs the model
once, keeps only the last row of each sequence (``logits_indices``), and hands
those rows to the sampler.
"""
from __future__ import annotations

import torch

from miniengine.engine.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model, kv, sampler, keep_logits: bool = False, graphs=None):
        self.model, self.kv, self.sampler, self.keep_logits = model, kv, sampler, keep_logits
        self.graphs = graphs  # cuda_graphs.DecodeGraphs: decode-only steps run padded to a bucket, replayed on CUDA

    @torch.inference_mode()
    def forward(self, batch: ScheduledBatch, rows=None) -> torch.Tensor:
        """Run the model over the batch's new tokens; the logits of ``rows`` of the flattened step
        (default: the last token of each sequence)."""
        device = self.model.device
        ids = [t for s, n in zip(batch.seqs, batch.num_new_tokens) for t in s.token_ids[s.num_cached_tokens:s.num_cached_tokens + n]]
        input_ids = torch.tensor(ids, device=device)
        backend = self.kv.backend(batch.seqs, batch.num_new_tokens)
        positions = backend.positions(device)
        if rows is None:
            rows = torch.tensor(batch.num_new_tokens).cumsum(0) - 1
        logits = self.model(input_ids, positions, backend, logits_indices=torch.as_tensor(rows, device=device))
        backend.advance()
        return logits

    def sample(self, batch: ScheduledBatch, logits: torch.Tensor) -> list[int]:
        """One token per row of ``batch.sample_rows()`` from each sequence's logits row."""
        rows = batch.sample_rows()  # one per sequence, or n for a request that forks after its prefill
        if self.keep_logits:  # the rows that choose a token (a chunk of a prefill chooses none)
            for i, row in zip(range(len(batch.seqs)), logits.float().cpu()):
                if not batch.partial(i):
                    s = batch.seqs[i]
                    s.logits = [] if s.logits is None else s.logits
                    s.logits.append(row.clone())
        if not rows:  # every sequence fed a chunk of its prefill: nothing to sample this step
            return []
        if len(rows) != len(batch.seqs):
            logits = logits[torch.tensor([i for i, _ in rows], dtype=torch.long, device=logits.device)]
        # The token a row chooses lands right after the sequence's last fed token.
        positions = [batch.seqs[i].num_cached_tokens + batch.num_new_tokens[i] for i, _ in rows]
        return self.sampler(logits, [p for _, p in rows], positions)

    def run(self, batch: ScheduledBatch) -> list[int]:
        if self.graphs is not None and self.graphs.accepts(batch):
            return self.sample(batch, self.graphs.run(batch.seqs))
        return self.sample(batch, self.forward(batch))
