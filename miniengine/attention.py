"""The one sequence-mixing op: causal attention with GQA, RoPE, and the ragged-batch layout.

Every backend (no cache, KV cache, paged, speculative) gathers the keys and
values each query may see and then calls :func:`attention`.  No attention math
lives anywhere else, so an optimisation can only change *which* history a query
sees, never *how* it attends to it (miniengine/README.md, "The seam").

A step's tokens arrive flattened: ``T`` rows, sequence after sequence, each
sequence bringing a different number of new tokens (a whole prompt in prefill,
one token in decode).  :class:`RaggedBatch` lays them out as a padded
``[B, Tq]`` grid so that one batched attention call serves the whole step,
with a mask hiding the padding.  No Python loop over sequences runs per layer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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


def attention(q, k, v, visible):
    """softmax(q k^T / sqrt(d) + mask) v for a batch of sequences: the course's only attention math.

    q: [B, Tq, n_heads, d]; k, v: [B, Tk, n_kv_heads, d]; visible: [B, Tq, Tk] bool,
    True where a query may see a key.  Returns [B, Tq, n_heads, d].
    GQA: query head h uses KV head h // (n_heads // n_kv_heads), HF's repeat_kv layout.
    The G query heads of a group are stacked along the query axis, so that each KV
    head is read once for all of them (no repeated copy of K and V; SDPA's own
    ``enable_gqa`` is avoided because, with a mask, it sends CUDA to the slow math kernel).
    """
    B, Tq, H, d = q.shape
    kv_heads = k.shape[2]
    G = H // kv_heads
    qg = q.transpose(1, 2).reshape(B, kv_heads, G * Tq, d)  # head h = kv * G + g; rows (g, t)
    mask = visible[:, None] if G == 1 else visible[:, None, None].expand(B, 1, G, Tq, visible.shape[-1]).reshape(
        B, 1, G * Tq, visible.shape[-1])
    out = F.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)  # heads second
    return out.reshape(B, H, Tq, d).transpose(1, 2)


def causal_attention(q, k, v, q_positions, k_positions):
    """Attention of one sequence's queries over the keys it may see.

    q: [Tq, n_heads, d]; k, v: [Tk, n_kv_heads, d]; positions are absolute token
    positions.  A query attends to every key whose position is <= its own.
    """
    visible = k_positions[None, :] <= q_positions[:, None]  # [Tq, Tk]
    return attention(q[None], k[None], v[None], visible[None])[0]


class RaggedBatch:
    """Where each of a step's T flattened tokens sits in a padded [B, Tq] grid.

    ``new_tokens[b]`` tokens belong to sequence b, laid end to end.  ``pad`` turns
    a [T, ...] tensor into [B, Tq, ...] (padding rows are zero), ``unpad`` turns
    it back.  ``query_index[b, i]`` is query i's offset within its sequence's new
    tokens, and ``valid`` says which grid cells hold a real token.
    """

    def __init__(self, new_tokens, device):
        self.new_tokens = [int(n) for n in new_tokens]
        n = torch.tensor(self.new_tokens, device=device)
        self.B, self.Tq, self.T = len(self.new_tokens), max(self.new_tokens), sum(self.new_tokens)
        self.n = n
        self.query_index = torch.arange(self.Tq, device=device)[None, :].expand(self.B, self.Tq)
        self.valid = self.query_index < n[:, None]  # [B, Tq]
        if self.Tq > 1:  # decode-only steps (Tq == 1) need no gather at all
            starts = n.cumsum(0) - n
            self._rows = torch.where(self.valid, starts[:, None] + self.query_index, self.T)  # T: the zero pad row
            self._keep = self.valid.flatten().nonzero().squeeze(1)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        if self.Tq == 1:
            return x[:, None]
        return torch.cat([x, x.new_zeros((1,) + x.shape[1:])])[self._rows]

    def unpad(self, y: torch.Tensor) -> torch.Tensor:
        if self.Tq == 1:
            return y[:, 0]
        return y.flatten(0, 1)[self._keep]

    def causal_visible(self, history: torch.Tensor, num_keys: int) -> torch.Tensor:
        """[B, Tq, num_keys] mask: query i of sequence b, at position history[b] + i, sees keys 0 .. its position.

        Padding queries see key 0 only, so that no softmax row is empty (their output is dropped anyway).
        """
        q_pos = history[:, None] + self.query_index  # [B, Tq]
        keys = torch.arange(num_keys, device=history.device)
        visible = keys[None, None, :] <= q_pos[:, :, None]
        return torch.where(self.valid[:, :, None], visible, keys[None, None, :] == 0)


class NoCacheBackend:
    """Full causal attention with no cache: every step recomputes every sequence from token 0.

    The step's flattened tokens are whole sequences laid end to end (a ragged
    batch); ``seq_lens`` says where each one ends.  This is naive decode's backend.
    """

    def __init__(self, seq_lens):
        self.seq_lens = [int(n) for n in seq_lens]
        self._layout = None

    def attend(self, layer, q, k, v):
        if self._layout is None:  # built once, on the first layer, on the tensors' device
            self._layout = RaggedBatch(self.seq_lens, q.device)
            zero = torch.zeros(len(self.seq_lens), dtype=torch.long, device=q.device)
            self._visible = self._layout.causal_visible(zero, self._layout.Tq)
        L = self._layout
        return L.unpad(attention(L.pad(q), L.pad(k), L.pad(v), self._visible))
