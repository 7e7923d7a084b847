"""Number formats and scale granularity: what a low-bit weight can hold, and what its scales cost.

:func:`float_format` and :func:`int_format` give bits, range and step (read from ``torch.finfo`` rather than typed
in); :func:`float8_grid` lists every finite value of an fp8 format.  :func:`fake_quant` is symmetric
round-to-nearest with one scale per tensor, per output channel or per group of inputs (the engine's
``Int8PerChannel`` and ``Int4GroupWise`` are two of its cases, bit for bit); :func:`bytes_per_weight` counts the
scales too.
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

# ---------------------------------------------------------------- number formats

FLOAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "fp8 E4M3": torch.float8_e4m3fn, "fp8 E5M2": torch.float8_e5m2}


def float_format(name: str) -> dict:
    """Bits, exponent and mantissa bits, largest value, smallest normal, and relative step (the gap above 1)."""
    dtype = FLOAT_DTYPES[name]
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps))
    return {"format": name, "bits": fi.bits, "exponent bits": fi.bits - 1 - mantissa, "mantissa bits": mantissa,
            "max": float(fi.max), "smallest normal": float(fi.smallest_normal), "relative step": float(fi.eps)}


def int_format(bits: int) -> dict:
    """Symmetric integers as the engine uses them: codes -qmax..qmax, value = code x scale."""
    qmax = 2 ** (bits - 1) - 1
    return {"format": f"int{bits}", "bits": bits, "levels": 2 * qmax + 1, "qmax": qmax,
            "relative step at the largest value": 1 / qmax}


def float8_grid(dtype=torch.float8_e4m3fn) -> np.ndarray:
    """Every finite value of an 8-bit float format, sorted (the 256 bit patterns, read as that format)."""
    values = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(dtype).to(torch.float64)
    values = values[torch.isfinite(values)]
    return np.unique(values.numpy())


# ---------------------------------------------------------------- scale granularity


def _check_bits(bits) -> int:
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or not 2 <= bits <= 16:
        raise ValueError(f"bits must be an integer from 2 to 16, got {bits!r}")
    return int(bits)


def fake_quant(w: torch.Tensor, bits: int, granularity="channel") -> torch.Tensor:
    """Quantize-then-dequantize a [out, in] matrix: symmetric, round to nearest, codes in [-qmax, qmax].

    ``granularity`` is "tensor" (one scale), "channel" (one per output row) or an integer g (one per g
    consecutive inputs of a row). A scale is absmax / qmax; an all-zero tensor, row or group gets scale 1,
    as in the engine. With bits=8, "channel" is the engine's Int8PerChannel; with bits=4 and g, its
    Int4GroupWise(g).
    """
    qmax = 2 ** (_check_bits(bits) - 1) - 1
    w = w.detach().to(torch.float32)
    if w.dim() != 2:
        raise ValueError(f"w must be a [out, in] matrix, got shape {tuple(w.shape)}")
    out_f, in_f = w.shape
    if granularity == "tensor":
        view = w.reshape(1, 1, -1)
    elif granularity == "channel":
        view = w.reshape(out_f, 1, in_f)
    elif isinstance(granularity, numbers.Integral) and not isinstance(granularity, bool) and granularity >= 1:
        if in_f % granularity:
            raise ValueError(f"a group size must divide the {in_f} inputs, got {granularity}")
        view = w.reshape(out_f, in_f // granularity, granularity)
    else:
        raise ValueError(f"granularity must be 'tensor', 'channel' or a group size, got {granularity!r}")
    scale = view.abs().amax(dim=-1, keepdim=True) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (torch.round(view / scale).clamp(-qmax, qmax) * scale).reshape(out_f, in_f)


def bytes_per_weight(bits: int, granularity="channel", in_features: int = 4096, scale_bytes: float = 2,
                     out_features: int = 4096) -> float:
    """Bytes one weight costs, its share of the scales included (16 bits and more: no scales)."""
    bits = _check_bits(bits)
    if bits >= 16:
        return bits / 8
    per = {"tensor": in_features * out_features, "channel": in_features}.get(granularity, granularity)
    return bits / 8 + scale_bytes / per
