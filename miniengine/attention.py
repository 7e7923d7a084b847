"""The one sequence-mixing op: causal attention with GQA, and RoPE.

Every backend (no cache, KV cache, paged, speculative) gathers the keys and
values a query may see and then calls :func:`causal_attention`.  No attention
math lives anywhere else, so an optimisation can only change *which* history a
query sees, never *how* it attends to it.
"""
from __future__ import annotations

import math

import torch


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables for the given absolute positions, HF Llama's rotate-half layout.

    Computed in float64 and rounded once, so the float32 and float64 models see
    the same angles up to their own precision.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)  # [T, head_dim]: first half and second half share a frequency
    return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, 1, head_dim]."""
    return x * cos + rotate_half(x) * sin


def causal_attention(q, k, v, q_positions, k_positions):
    """Attention of one sequence's queries over the keys it may see.

    q: [Tq, n_heads, d]; k, v: [Tk, n_kv_heads, d]; positions are absolute token
    positions.  A query attends to every key whose position is <= its own.
    GQA: query head h uses KV head h // (n_heads // n_kv_heads), so a group of
    consecutive query heads shares one K/V head (HF's repeat_kv layout).
    """
    visible = k_positions[None, :] <= q_positions[:, None]  # [Tq, Tk]
    # torch's fused kernel does softmax(q k^T / sqrt(d) + mask) v in one call; heads go first for it.
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=visible,
        enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(0, 1)  # [Tq, n_heads, d]


class NoCacheBackend:
    """Full causal attention with no cache: every step recomputes every sequence from token 0.

    The step's flattened tokens are whole sequences laid end to end (a ragged
    batch); ``seq_lens`` says where each one ends.  This is naive decode's backend.
    """

    def __init__(self, seq_lens):
        self.seq_lens = [int(n) for n in seq_lens]

    def attend(self, layer, q, k, v):
        out = torch.empty_like(q)
        start = 0
        for n in self.seq_lens:
            pos = torch.arange(n, device=q.device)
            sl = slice(start, start + n)
            out[sl] = causal_attention(q[sl], k[sl], v[sl], pos, pos)
            start += n
        return out
