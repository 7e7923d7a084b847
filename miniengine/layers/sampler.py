"""The sampler plug point: a step's logits in, one token per sequence out.

Interface (what ``LLM(..., sampler=...)`` accepts; ``plugs.BatchSampler``)::

    sampler(logits, params, positions) -> list[int]

``logits`` is a [B, vocab] tensor (one row per sequence of the step), ``params``
their SamplingParams, and ``positions`` the absolute position of the token each
row chooses: the key of its Gumbel noise.  A function that samples one row,
``sample(logits_row, params, position) -> int`` (Lab 01's shape), plugs in
through :class:`PerRowSampler`.
"""
from __future__ import annotations

import torch

from miniengine.plugs.conformance import check
from miniengine.plugs import RowSampler
from miniengine.sampling import sample_token


class Sampler:
    """The course's sampler: greedy rows in one batched argmax, the rest by keyed Gumbel-max.

    Keyed noise makes each row's draw independent of the batch around it, so
    no row ever needs another row's data; only the noise generation runs per
    sampled row (Philox in numpy, as the reference does).
    """

    def __call__(self, logits: torch.Tensor, params, positions) -> list[int]:
        tokens = logits.argmax(dim=-1).tolist()  # greedy rows; sampled rows are overwritten below
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if sampled:
            rows = logits[sampled].double().cpu().numpy()
            for row, i in zip(rows, sampled):
                tokens[i] = sample_token(row, params[i], positions[i])
        return tokens


class PerRowSampler:
    """Adapts ``sample(logits_row, params, position) -> int`` to the batched interface.

    Each row reaches ``sample`` as a 1-D numpy float64 array, as in Lab 01.
    """

    def __init__(self, sample):
        self.sample = check("sample", sample, RowSampler)

    def __call__(self, logits, params, positions) -> list[int]:
        rows = logits.detach().double().cpu().numpy()
        return [int(self.sample(rows[i], params[i], positions[i])) for i in range(len(params))]
