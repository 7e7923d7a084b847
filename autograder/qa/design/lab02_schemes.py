"""Lab 02's family of low-bit KV caches, for instructors: the table of autograder/qa/design/lab02.py measures each scheme
(bytes ratio and perplexity increase), and FloatCache is the float32 yardstick.

``SchemeCache``: integer codes of ``bits`` bits packed into bytes (bit planes, so any width from 2 to 8), one scale per
``granularity`` ("tensor": one per write of a layer's K or V; "token_head": one per token and head; an int: one per
that many values along head_dim) stored in ``scale_dtype``; symmetric codes around zero, or, with
``symmetric=False``, codes from the group's minimum up with a scale and an offset each.  ``v`` (a dict of the same
choices) gives the values a scheme of their own, so that keys and values may differ (a mixed scheme).
``SchemeAttention`` writes each sequence's new K/V, then attends over its whole dequantized history with the one
attention op.
"""
from __future__ import annotations

import torch

from miniengine.attention import causal_attention
from miniengine.kv.contiguous import KVCache


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., n] codes below 2**bits -> [..., n * bits / 8] bytes, least significant bit first."""
    planes = (codes.to(torch.uint8)[..., None] >> torch.arange(bits, dtype=torch.uint8)) & 1
    planes = planes.flatten(-2).unflatten(-1, (-1, 8))
    return (planes << torch.arange(8, dtype=torch.uint8)).sum(-1).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    planes = (packed[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1
    planes = planes.flatten(-2).unflatten(-1, (n, bits))
    return (planes.to(torch.int32) << torch.arange(bits, dtype=torch.int32)).sum(-1)


class Part:
    """Either K or V of one sequence, every layer: packed codes, and a scale (and an offset) per group."""

    def __init__(self, config, max_len, device, bits=4, granularity=16, scale_dtype=torch.float16, symmetric=True):
        if not isinstance(bits, int) or not 2 <= bits <= 8:
            raise ValueError(f"bits must be an integer from 2 to 8, got {bits!r}")
        d = config.head_dim
        per = {"tensor": None, "token_head": d}.get(granularity, granularity)
        if per is not None and d % per:
            raise ValueError(f"granularity {granularity!r} must divide head_dim={d}")
        shape = (config.num_hidden_layers, max_len)
        self.codes = torch.zeros(shape + (config.num_key_value_heads, d * bits // 8), dtype=torch.uint8, device=device)
        groups = (1,) if per is None else (config.num_key_value_heads, d // per)
        self.scales = torch.ones(shape + groups, dtype=scale_dtype, device=device)
        self.offsets = None if symmetric else torch.zeros_like(self.scales)  # asymmetric: x = offset + code * scale
        self.bits, self.per, self.head_dim = bits, per, d

    def _grouped(self, x):  # [n, H, d] -> [n, groups..., values]: the last axis shares a scale
        return x.reshape(1, -1) if self.per is None else x.unflatten(-1, (-1, self.per))

    def write(self, layer, start, x):
        end = start + x.shape[0]
        qmax, big = 2 ** (self.bits - 1) - 1, torch.finfo(self.scales.dtype).max
        g = self._grouped(x.float())
        if self.offsets is None:  # codes -qmax..qmax, stored shifted by qmax
            scale, offset = g.abs().amax(-1) / qmax, None
        else:  # codes 0..2**bits - 1 from the group's minimum up
            offset = g.amin(-1).clamp(-big, big).to(self.scales.dtype)
            scale = (g.amax(-1) - offset.float()) / (2 ** self.bits - 1)
        scale = scale.clamp(max=big).to(self.scales.dtype)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        if offset is None:
            codes = torch.round(g / scale.float()[..., None]).clamp(-qmax, qmax) + qmax
        else:
            codes = torch.round((g - offset.float()[..., None]) / scale.float()[..., None]).clamp(0, 2 ** self.bits - 1)
        self.codes[layer, start:end] = pack(codes.reshape(x.shape), self.bits)
        for store, value in ((self.scales, scale), (self.offsets, offset)):
            if store is not None:
                store[layer, start:end] = value if self.per is not None else value.reshape(1).expand(end - start, 1)

    def read(self, layer, end, dtype):
        qmax = 2 ** (self.bits - 1) - 1
        codes = unpack(self.codes[layer, :end], self.bits, self.head_dim).float()
        scale = self.scales[layer, :end].float()
        offset = None if self.offsets is None else self.offsets[layer, :end].float()
        codes = codes - qmax if offset is None else codes
        if self.per is None:
            x = codes * scale.reshape(end, 1, 1) + (0 if offset is None else offset.reshape(end, 1, 1))
        else:
            x = codes.unflatten(-1, (-1, self.per)) * scale[..., None] + (0 if offset is None else offset[..., None])
            x = x.flatten(-2)
        return x.to(dtype)


class SchemeCache:
    """One sequence's K and V, each a Part: K with these choices, V with `v`'s (the same when None)."""

    def __init__(self, config, max_len, dtype=torch.float32, device="cpu", v=None, **choices):
        self.parts = [Part(config, max_len, device, **choices), Part(config, max_len, device, **(v or choices))]
        self.dtype, self.max_len, self.length = dtype, max_len, 0

    def write(self, layer, start, k, v):
        end = start + k.shape[0]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: positions {start}..{end - 1} do not fit in max_len={self.max_len}")
        for part, x in zip(self.parts, (k, v)):
            part.write(layer, start, x)

    def read(self, layer, end):
        return [part.read(layer, end, self.dtype) for part in self.parts]


class SchemeAttention:
    """Each sequence's new K/V written (quantized), then its queries attend over its whole dequantized history."""

    def __init__(self, caches, new_tokens):
        self.caches, self.new_tokens = list(caches), [int(n) for n in new_tokens]

    def positions(self, device="cpu"):
        return torch.cat([torch.arange(c.length, c.length + n, device=device) for c, n in zip(self.caches, self.new_tokens)])

    def attend(self, layer, q, k, v):
        out, start = torch.empty_like(q), 0
        for cache, n in zip(self.caches, self.new_tokens):
            rows, total = slice(start, start + n), cache.length + n
            cache.write(layer, cache.length, k[rows], v[rows])
            keys, values = cache.read(layer, total)
            pos = torch.arange(total, device=q.device)
            out[rows] = causal_attention(q[rows], keys, values, pos[cache.length:], pos)
            start += n
        return out

    def advance(self):
        for cache, n in zip(self.caches, self.new_tokens):
            cache.length += n


def scheme(**choices):
    """A cache_class for kv.PerSequenceKV with these SchemeCache choices."""
    return lambda config, max_len, dtype=torch.float32, device="cpu": SchemeCache(config, max_len, dtype, device, **choices)


F32, F16 = torch.float32, torch.float16
ASYM4 = dict(bits=4, granularity="token_head", symmetric=False)  # int4 from each token and head's minimum
SCHEMES = {  # the baseline first; then the naive design; then the honest designs the thresholds are set from
    "int8, scale per token and head (float32): the baseline": dict(bits=8, granularity="token_head", scale_dtype=F32),
    "int8, scale per token and head (float16)": dict(bits=8, granularity="token_head"),
    "int4, one scale per tensor (float32)": dict(bits=4, granularity="tensor", scale_dtype=F32),
    "int4, symmetric, scale per token and head (float32)": dict(bits=4, granularity="token_head", scale_dtype=F32),
    "int4, symmetric, scale per token and head (float16)": dict(bits=4, granularity="token_head"),
    "int4, symmetric, groups of 16 (float16 scales)": dict(bits=4, granularity=16),
    "int4, from the minimum, per token and head (float16 scale, minimum)": ASYM4,
    "int4, from the minimum, groups of 16 (float16 scale, minimum)": dict(ASYM4, granularity=16),
    "K int8 symmetric, V int4 from the minimum (float16, per token and head)": dict(
        bits=8, granularity="token_head", v=ASYM4),
    "K int4 from the minimum in groups of 16, V int4 per token and head": dict(ASYM4, granularity=16, v=ASYM4),
    "int3, from the minimum, groups of 16 (float16 scale, minimum)": dict(bits=3, granularity=16, symmetric=False),
    "int3, symmetric, groups of 16 (float16 scales)": dict(bits=3, granularity=16),
    "int2, from the minimum, groups of 16 (float16 scale, minimum)": dict(bits=2, granularity=16, symmetric=False),
}


class FloatCache(KVCache):
    """The course's float32 cache (kv.contiguous.KVCache, each in an arena of its own), read as SchemeAttention reads."""

    def read(self, layer, end):
        return self.k[layer, :end], self.v[layer, :end]
