"""Turn a multi-head (MHA) model into a grouped-query (GQA) one by mean-pooling K/V heads.

The brief uptraining after it, and the ``convert-gqa`` command, are course tooling:
:mod:`miniengine.course.gqa_uptrain`.

Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints"
(EMNLP 2023, https://arxiv.org/abs/2305.13245): query head h of a GQA model with K KV heads reads KV head
h // (H / K).  A checkpoint converts by averaging the K and V projections of each group of H / K heads
(mean pooling beat keeping one head of each group), and recovers most of the quality with about 5% of
the original training steps.  The KV cache shrinks by H / K: every token stores K heads, not H.
"""
from __future__ import annotations

import copy
import dataclasses

import torch

from miniengine.model import Llama
from miniengine.plugs.conformance import check
from miniengine.plugs import KVHeadPool


def mean_pool_kv(weight: torch.Tensor, num_heads: int, kv_heads: int) -> torch.Tensor:
    """[num_heads * head_dim, hidden] K or V projection -> [kv_heads * head_dim, hidden]: each group's mean."""
    if kv_heads < 1 or num_heads % kv_heads:
        raise ValueError(f"kv_heads must divide the {num_heads} KV heads of the model, got {kv_heads}")
    head_dim = weight.shape[0] // num_heads
    groups = weight.reshape(kv_heads, num_heads // kv_heads, head_dim, weight.shape[1])
    return groups.mean(dim=1).reshape(kv_heads * head_dim, weight.shape[1])


def convert(model: Llama, kv_heads: int, pool=mean_pool_kv) -> Llama:
    """A GQA copy of an MHA model (``pool`` is the plug point, ``plugs.KVHeadPool``: Lab 07 writes it)."""
    check("pool", pool, KVHeadPool)
    c = model.config
    if c.num_key_value_heads != c.num_attention_heads:
        raise ValueError(f"the model already has {c.num_key_value_heads} KV heads for {c.num_attention_heads} query "
                         f"heads: convert an MHA model")
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or c.num_attention_heads % kv_heads:
        raise ValueError(f"kv_heads must be a divisor of num_attention_heads={c.num_attention_heads}, got {kv_heads!r}")
    out = Llama(dataclasses.replace(c, num_key_value_heads=kv_heads)).to(device=model.device, dtype=model.dtype)
    state = copy.deepcopy(model.state_dict())
    for i in range(c.num_hidden_layers):
        for proj in ("k_proj", "v_proj"):
            key = f"model.layers.{i}.self_attn.{proj}.weight"
            state[key] = pool(state[key], c.num_attention_heads, kv_heads)
    out.load_state_dict(state, strict=True)
    return out.eval()
