"""Naive decode: the course's oracle.

Every step feeds each sequence's *whole* prefix through the model again, with
no cache, in float64.  It is slow on purpose: nothing is reused, so there is
nothing to get wrong.  Every optimisation in the course must reproduce its
tokens exactly.
"""
from __future__ import annotations

import copy
import dataclasses

import torch

from miniengine.attention import NoCacheBackend
from miniengine.logits_processors import process_row
from miniengine.request import validate_requests
from miniengine.sampling import sample_token


@dataclasses.dataclass
class Completion:
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens; ends with the end-of-text id when finish_reason == "stop"
    finish_reason: str  # "stop" (end-of-text) or "length" (max_tokens)
    tokens_processed: int  # tokens fed through the model for this request, over all steps
    logits: list[torch.Tensor] | None = None  # per generated token, when asked for


def in_dtype(model, dtype: torch.dtype):
    """The model itself if it already has ``dtype``, otherwise a converted copy (the original is untouched)."""
    return model if model.dtype == dtype else copy.deepcopy(model).to(dtype)


@torch.no_grad()
def naive_generate(model, prompts, params, eos_token_id: int | None = None, dtype=torch.float64,
                   return_logits: bool = False, on_token=None) -> list[Completion]:
    """Decode a ragged batch of prompts (lists of token ids) by recomputing every prefix at every step.

    ``params`` is one SamplingParams for all prompts or a list of one per prompt.
    Each request's tokens depend only on its own prompt and params: the sampler's
    noise is keyed by (seed, position), and attention never crosses sequences.
    ``on_token(request_index, token_id)``, if given, is called as each token is
    chosen, for streaming.
    """
    cfg = model.config
    if eos_token_id is None:
        eos_token_id = cfg.eos_token_id
    prompts, params = validate_requests(prompts, params, cfg.vocab_size, cfg.max_position_embeddings)
    model = in_dtype(model, dtype)
    device = model.device

    out = [Completion(p, [], "length", 0, [] if return_logits else None) for p in prompts]
    active = list(range(len(prompts)))
    while active:
        seqs = [prompts[i] + out[i].token_ids for i in active]
        lens = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s], device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lens])
        last = torch.tensor(lens, device=device).cumsum(0) - 1  # only the last token of each sequence is sampled
        logits = model(ids, positions, NoCacheBackend(lens), logits_indices=last).cpu()
        still = []
        for row, i in enumerate(active):
            c = out[i]
            c.tokens_processed += lens[row]
            if return_logits:
                c.logits.append(logits[row].clone())
            chosen_from = logits[row]
            if params[i].processes_logits:  # penalties and min_p (logits_processors), from this request's tokens
                chosen_from = process_row(chosen_from.numpy(), prompts[i], c.token_ids, params[i])
            tok = sample_token(chosen_from, params[i], position=lens[row])
            c.token_ids.append(tok)
            if on_token is not None:
                on_token(i, tok)
            if (tok == eos_token_id and not params[i].ignore_eos) or tok in params[i].stop_token_ids:
                c.finish_reason = "stop"
            elif len(c.token_ids) < params[i].max_tokens:
                still.append(i)
        active = still
    return out
