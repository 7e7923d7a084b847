"""Weight-only quantization: int8 per output channel, int4 per group packed two to a byte.

A weight matrix W [out, in] is stored as small integers q and float scales s, with W ≈ q · s:

* **int8, per output channel (symmetric).**  One scale per row, s = max|W_row| / 127, q = round(W / s)
  in [-127, 127].  1 byte per weight, plus 4 bytes per row.
* **int4, group-wise (symmetric).**  Each row is cut into groups of ``group_size`` inputs with a scale
  each, s = max|W_group| / 7, q = round(W / s) in [-7, 7], and two 4-bit values share a byte (the even
  input in the low nibble, the odd one in the high nibble).  Half a byte per weight, plus 4 bytes per
  group: 0.5625 bytes per weight at group size 64.

Rounding to the nearest step makes every weight's error at most half a step (s / 2).  A row or group of
zeros gets the scale 1, never 0, so dequantizing never divides by zero or produces NaN.

:class:`QuantLinear` and :class:`QuantEmbedding` keep only q and s and dequantize on the fly in every
forward (weight-only quantization: activations stay float).  ``quantize_model`` swaps them into a model,
embedding and LM head included (they share one quantized matrix when tied).
``LLM(quantization="int8" | "int4")`` does that at load time; a scheme object with ``quantize`` and
``dequantize`` (Lab 07's; ``plugs.QuantScheme``) plugs in the same way.
"""
from __future__ import annotations

import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F

from miniengine.plugs.conformance import check
from miniengine.plugs import QuantScheme


def _scales(absmax: torch.Tensor, qmax: int) -> torch.Tensor:
    scale = absmax.to(torch.float32) / qmax
    return torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row or group: any scale is exact


class Int8PerChannel:
    """Symmetric int8, one scale per output channel (row)."""

    name = "int8"

    def quantize(self, w: torch.Tensor) -> dict:
        w = w.detach().to(torch.float32)
        scale = _scales(w.abs().amax(dim=1), 127)
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        return {"q": q, "scale": scale}

    def dequantize(self, state: dict, rows=None) -> torch.Tensor:
        q, scale = state["q"], state["scale"]
        if rows is not None:
            q, scale = q[rows], scale[rows]
        return q.to(scale.dtype) * scale[..., None]


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[.., 2n] integers in [-8, 7] -> [.., n] uint8: element 2i in the low nibble, 2i+1 in the high one."""
    if q.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even number of values per row, got {q.shape[-1]}")
    nibbles = (q.to(torch.int16) & 0xF).to(torch.uint8)
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4`: uint8 [.., n] -> int8 [.., 2n], sign-extended from 4 bits.

    Read as int8, a byte's high nibble is sign-extended by an arithmetic right shift (>> 4), and the low one by
    shifting it to the top first ((b << 4) >> 4): two cheap integer ops, no widening, no table."""
    signed = packed.view(torch.int8)
    return torch.stack([(signed << 4) >> 4, signed >> 4], dim=-1).flatten(-2)


class Int4GroupWise:
    """Symmetric int4 with one scale per ``group_size`` inputs of a row, packed two values to a byte."""

    name = "int4"

    def __init__(self, group_size: int = 64):
        if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or group_size < 2 \
                or group_size % 2:
            raise ValueError(f"group_size must be an even integer >= 2 (64 or 128 are usual), got {group_size!r}")
        self.group_size = int(group_size)

    def quantize(self, w: torch.Tensor) -> dict:
        w = w.detach().to(torch.float32)
        out_f, in_f = w.shape
        if in_f % self.group_size:
            raise ValueError(f"group_size must divide the layer's {in_f} input features, got {self.group_size}")
        groups = w.view(out_f, in_f // self.group_size, self.group_size)
        scale = _scales(groups.abs().amax(dim=2), 7)
        q = torch.round(groups / scale[..., None]).clamp_(-7, 7).view(out_f, in_f)
        return {"packed": pack_int4(q), "scale": scale}

    def dequantize(self, state: dict, rows=None) -> torch.Tensor:
        packed, scale = state["packed"], state["scale"]
        if rows is not None:
            packed, scale = packed[rows], scale[rows]
        q = unpack_int4(packed).to(scale.dtype)
        groups = q.view(*q.shape[:-1], scale.shape[-1], self.group_size) * scale[..., None]
        return groups.flatten(-2)


SCHEMES = {"int8": Int8PerChannel, "int4": Int4GroupWise}


def get_scheme(quantization, group_size: int = 64):
    """"int8", "int4" (with ``group_size``), or a scheme object (plugs.QuantScheme: quantize, dequantize)."""
    if isinstance(quantization, str):
        if quantization not in SCHEMES:
            raise ValueError(f"quantization must be one of {sorted(SCHEMES)} or a scheme object, got {quantization!r}")
        return Int4GroupWise(group_size) if quantization == "int4" else Int8PerChannel()
    return check("quantization", quantization, QuantScheme)


def state_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class QuantLinear(nn.Module):
    """``y = x W^T`` with W kept quantized and dequantized on the fly, in the activations' dtype."""

    def __init__(self, scheme, state: dict, out_features: int, in_features: int):
        super().__init__()
        self.scheme, self.out_features, self.in_features = scheme, out_features, in_features
        self._names = list(state)
        for name, t in state.items():  # buffers, not parameters: .to(device) moves them, nothing trains them
            self.register_buffer(name, t)

    @property
    def state(self) -> dict:
        return {n: getattr(self, n) for n in self._names}

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme) -> "QuantLinear":
        return cls(scheme, scheme.quantize(linear.weight), linear.out_features, linear.in_features)

    def weight_bytes(self) -> int:
        return state_bytes(self.state)

    def forward(self, x):
        return F.linear(x, self.scheme.dequantize(self.state).to(x.dtype))


class QuantEmbedding(nn.Module):
    """Embedding rows dequantized as they are looked up (the same quantized matrix as a tied LM head)."""

    def __init__(self, head: QuantLinear):
        super().__init__()
        self.head = [head]  # a list, so the head is not registered twice as a submodule

    def forward(self, ids):
        h = self.head[0]
        return h.scheme.dequantize(h.state, rows=ids)


def quantize_model(model, quantization, group_size: int = 64):
    """Swap every linear layer (and a tied embedding) for its quantized version, in place; returns the model."""
    scheme = get_scheme(quantization, group_size)
    dtype = model.dtype  # scales follow the model's float dtype, so dequantizing happens in it
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, QuantLinear.from_linear(child, scheme))
    head = QuantLinear.from_linear(model.lm_head, scheme)
    model.lm_head = head
    if model.config.tie_word_embeddings:
        model.model.embed_tokens = QuantEmbedding(head)
    model.quantization = scheme
    return model.to(dtype)


def dequantized_copy(model, quantization, group_size: int = 64):
    """A plain model whose weights are exactly what the quantized one computes with: the reference runs it."""
    import copy

    scheme = get_scheme(quantization, group_size)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for m in [l for layer in out.model.layers for l in (*layer.self_attn.children(), *layer.mlp.children())
                  if isinstance(l, nn.Linear)] + [out.lm_head]:
            m.weight.copy_(scheme.dequantize(scheme.quantize(m.weight)).to(m.weight.dtype))
    return out


def model_weight_bytes(model) -> int:
    """Bytes of all weights as stored: quantized states, and float parameters (norms, untied embeddings)."""
    quant = sum(m.weight_bytes() for m in model.modules() if isinstance(m, QuantLinear))
    return quant + sum(p.numel() * p.element_size() for p in model.parameters())
