"""GQA without copies: the engine's attention for grouped KV heads, each group's query heads packed together."""
from __future__ import annotations

import torch


def grouped_attention(q, k, v, visible):
    """The engine's ``attention`` for GQA, computed without repeating K/V: each KV head serves its group.

    The G = n_heads / n_kv_heads query heads of a group become G x Tq query rows of one head (FlashAttention's
    "query head packing"), so every K/V value is read once, not G times. Same shapes and result as
    ``miniengine.attention.attention``: q [B, Tq, H, d], k, v [B, Tk, K, d], visible [B, Tq, Tk].
    """
    B, Tq, H, d = q.shape
    K = k.shape[2]
    G = H // K
    qp = q.view(B, Tq, K, G, d).permute(0, 2, 3, 1, 4).reshape(B, K, G * Tq, d)
    mask = visible[:, None].expand(B, G, Tq, visible.shape[-1]).reshape(B, 1, G * Tq, visible.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(qp, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return out.view(B, K, G, Tq, d).permute(0, 3, 1, 2, 4).reshape(B, Tq, H, d)
