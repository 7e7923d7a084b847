"""The float64 oracle's own loop on tensor-parallel shards: what ``bench tp`` and the tests compare the engine with.

Tensor parallelism itself (:mod:`miniengine.distributed`) runs only the engine.  To show that sharding alone
changes nothing but the order of a sum, this runs naive decode (:func:`miniengine.reference.naive_generate`, no
cache, logits in the model's dtype: float64 for a float64 run) on each rank's shard, and returns rank 0's
completions after checking that the ranks agree.
"""
from __future__ import annotations

import cloudpickle
import torch
from torch import nn

from miniengine.distributed import Plan, check_world_size, launch, shard_model


def _reference_rank(rank, world_size, model, prompts, params, dtype, return_logits, plan_blob):
    from miniengine.config import DTYPES
    from miniengine.model import load_model
    from miniengine.reference import naive_generate

    if not isinstance(model, nn.Module):
        model = load_model(model)
    plan = cloudpickle.loads(plan_blob) if plan_blob else None
    shard = shard_model(model.to(DTYPES[dtype]), rank, world_size, plan=plan)
    outs = naive_generate(shard, prompts, params, dtype=DTYPES[dtype], return_logits=return_logits)
    return [dict(token_ids=c.token_ids, finish_reason=c.finish_reason, tokens_processed=c.tokens_processed,
                 logits=c.logits if rank == 0 else None) for c in outs]


def tp_reference_generate(model, prompts, params, world_size: int = 2, dtype=torch.float64,
                          return_logits: bool = False, timeout_s: float = 120.0, plan: Plan | None = None):
    """Naive decode on ``world_size`` shards of ``model`` (a directory or a loaded Llama); rank 0's completions."""
    from miniengine.config import DTYPES
    from miniengine.model import load_config
    from miniengine.paths import resolve_model_dir
    from miniengine.reference import Completion
    from miniengine.request import validate_requests

    if not isinstance(model, nn.Module):
        model = str(resolve_model_dir(model))
    cfg = model.config if isinstance(model, nn.Module) else load_config(model)
    check_world_size(cfg, world_size)
    names = {v: k for k, v in DTYPES.items()}
    prompts, params = validate_requests(prompts, params, cfg.vocab_size, cfg.max_position_embeddings)
    blob = cloudpickle.dumps(plan) if plan is not None else None
    ranks = launch(_reference_rank, world_size, (model, prompts, params, names[dtype], return_logits, blob), timeout_s)
    if any([r["token_ids"] for r in rank] != [r["token_ids"] for r in ranks[0]] for rank in ranks):
        raise RuntimeError("tensor-parallel ranks chose different tokens: their logits should be identical")
    return [Completion(p, r["token_ids"], r["finish_reason"], r["tokens_processed"], r["logits"])
            for p, r in zip(prompts, ranks[0])]
