"""The model runner: one scheduled batch in, the sampled tokens out.

It flattens the batch's fed tokens into ``input_ids`` (each sequence's new tokens, then any drafted tokens a
speculative step feeds after them: ``ScheduledBatch.tokens_to_feed``), asks the KV plug for the step's backend
(which knows the positions and where K/V live), runs the model once, keeps only the rows that choose a token
(``logits_indices``: the last token of each sequence), and hands those rows to the sampler.
"""
from __future__ import annotations

import numpy as np
import torch

from miniengine import plugs
from miniengine.engine.batch import ScheduledBatch
from miniengine.logits_processors import process_row, top_logprobs
from miniengine.plugs.conformance import check


def processed(batch: ScheduledBatch, rows, logits: torch.Tensor, process=process_row) -> torch.Tensor:
    """The rows the sampler draws from: penalties and min_p applied (``process``, logits_processors.process_row unless
    a LogitsProcessor is plugged in) to the rows that ask for them, in float64 from their own sequence's tokens; the
    logits themselves when no row does."""
    asking = [j for j, (_, p) in enumerate(rows) if p.processes_logits]
    if not asking:
        return logits
    out = logits.detach().double().clone()  # float64 holds every float32 exactly: the other rows are unchanged
    for j in asking:
        i, params = rows[j]
        seq = batch.seqs[i]
        row = process(out[j].cpu().numpy().copy(), list(seq.prompt_token_ids), list(seq.output_token_ids), params)
        row = np.asarray(row, dtype=np.float64)
        if row.shape != (out.shape[1],):
            raise RuntimeError(f"the logits processor returned shape {row.shape} for a row of {out.shape[1]} logits")
        out[j] = torch.from_numpy(row).to(out.device)
    return out


class ModelRunner:
    def __init__(self, model, kv, sampler, keep_logits: bool = False, graphs=None, logits_processor=None):
        self.model, self.kv, self.sampler, self.keep_logits = model, kv, sampler, keep_logits
        self.logits_processor = process_row if logits_processor is None else logits_processor
        self.graphs = graphs  # cuda_graphs.DecodeGraphs: decode-only steps run padded to a bucket, replayed on CUDA
        self._backend_checked = False  # the KV plug's first backend is held to plugs.AttentionBackend

    @torch.inference_mode()
    def forward(self, batch: ScheduledBatch, rows=None) -> torch.Tensor:
        """Run the model over the batch's fed tokens; the logits of ``rows`` of the flattened step
        (default: the last fed token of each sequence)."""
        device = self.model.device
        ids = [t for i in range(len(batch.seqs)) for t in batch.tokens_to_feed(i)]
        fed = batch.num_fed_tokens
        input_ids = torch.tensor(ids, device=device)
        backend = self.kv.backend(batch.seqs, fed)
        if not self._backend_checked:
            check("kv.backend(seqs, new_tokens)", backend, plugs.AttentionBackend)
            self._backend_checked = True
        positions = backend.positions(device)
        if rows is None:
            rows = torch.tensor(fed).cumsum(0) - 1
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
        raw, logits = logits, processed(batch, rows, logits, self.logits_processor)
        tokens = self.sampler(logits, [p for _, p in rows], positions)
        if any(p.logprobs is not None for _, p in rows):  # postprocess hands each row's entry to its sequence
            lp_rows = raw.detach().double().cpu().numpy()
            batch.logprobs = [None if p.logprobs is None else top_logprobs(lp_rows[j], tokens[j], p.logprobs)
                              for j, (_, p) in enumerate(rows)]
        return tokens

    def run(self, batch: ScheduledBatch) -> list[list[int]]:
        """One step: for each row of ``batch.sample_rows()``, the tokens it emits, a list of one (for postprocess)."""
        if self.graphs is not None and self.graphs.accepts(batch):
            logits = self.graphs.run(batch.seqs)
        else:
            logits = self.forward(batch)
        return [[t] for t in self.sample(batch, logits)]
