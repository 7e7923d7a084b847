"""Cached decode on an already loaded model, for lectures and tests that compare decoders side by side.

``cached_generate(model, prompts, params)`` runs the real engine (:class:`~miniengine.engine.LLMEngine`
with the contiguous KV cache) and returns, per request, what :func:`~miniengine.reference.naive_generate`
returns, plus the KV bytes the request used and reserved.  The cache itself lives in
:mod:`miniengine.kv.contiguous`.
"""
from __future__ import annotations

import dataclasses

import torch

from miniengine.config import EngineConfig
from miniengine.engine import LLMEngine
from miniengine.kv.contiguous import CachedBackend, KVCache  # noqa: F401  (re-exported: the lectures' names)
from miniengine.reference import Completion, in_dtype
from miniengine.request import validate_requests

DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}


@dataclasses.dataclass
class CachedCompletion(Completion):
    kv_bytes_used: int = 0
    kv_bytes_reserved: int = 0


def cached_generate(model, prompts, params, eos_token_id: int | None = None, dtype=torch.float32,
                    return_logits: bool = False, on_token=None) -> list[CachedCompletion]:
    """Same contract and same tokens as naive_generate, through the engine: all prompts are admitted at once."""
    cfg = model.config
    prompts, params = validate_requests(prompts, params, cfg.vocab_size, cfg.max_position_embeddings)
    model = in_dtype(model, dtype)
    need = sum(len(p) + sp.max_tokens for p, sp in zip(prompts, params))
    engine = LLMEngine(EngineConfig(model=model, dtype=DTYPE_NAMES[dtype], device=str(model.device),
                                    max_num_seqs=len(prompts), kv_cache_tokens=need, kv_layout="contiguous",
                                    max_num_batched_tokens=max(need, 1)), keep_logits=return_logits)
    if eos_token_id is not None:
        engine.scheduler.eos_token_id = eos_token_id
    seqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    index = {s.request_id: i for i, s in enumerate(seqs)}
    while engine.has_unfinished_requests():
        for s in engine.step():
            if on_token is not None:
                on_token(index[s.request_id], s.token_ids[-1])
    per_token = cfg.kv_bytes_per_token(model.lm_head.weight.element_size())
    return [CachedCompletion(s.prompt_token_ids, s.output_token_ids, s.finish_reason, s.tokens_processed,
                             s.logits if return_logits else None, s.num_cached_tokens * per_token, s.max_len * per_token)
            for s in seqs]
