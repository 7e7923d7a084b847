"""AWQ (Lin et al., 2024): activation-aware scales, the search over their exponent, and a model quantized with them.

:func:`awq_scales`, :func:`awq_quantize`, :func:`awq_search` (the grid search over the exponent alpha, on
calibration inputs) and :func:`awq_copy` (a plain model whose weights are what an AWQ-quantized one computes
with). A demonstration only: the engine does not use it.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from miniengine.course.quant_viz.activations import linear_layers


def awq_scales(magnitude: torch.Tensor, alpha: float) -> torch.Tensor:
    """Per-input-channel scales s = mean|x|^alpha, normalised so that max(s) * min(s) = 1 (as AWQ's code does)."""
    s = magnitude.detach().float().clamp(min=1e-8) ** float(alpha)
    return s / (s.max() * s.min()).sqrt()


def awq_quantize(w: torch.Tensor, s: torch.Tensor, quant) -> torch.Tensor:
    """The weights an AWQ layer computes with: quantize W diag(s), then undo s.

    At run time the 1/s goes into the input (folded into the previous RMSNorm or linear layer), so the
    layer computes (x / s) Q(W s)^T, which equals x (Q(W s) / s)^T.  ``quant(w) -> w_hat`` is any
    quantize-then-dequantize function.
    """
    w = w.detach().float()
    return quant(w * s[None, :]) / s[None, :]


def awq_search(w: torch.Tensor, x: torch.Tensor, quant, grid: int = 20) -> dict:
    """AWQ's search: alpha in {0, 1/grid, ..., 1}; keep the one with the smallest output error on ``x``.

    alpha = 0 gives s = 1, plain round-to-nearest, so the search never does worse on ``x`` itself. The
    errors are :func:`output_error`'s, computed through the Gram matrix x^T x: ||x D^T||^2 = sum((D G) * D).
    """
    x = x.detach().float()
    w = w.detach().float().to(x.device)
    magnitude = x.abs().mean(dim=0)
    gram = (x.T @ x).double()

    def error(w_hat):
        d = (w - w_hat).double()
        return float(((d @ gram) * d).sum().clamp(min=0).sqrt() / norm)

    norm = ((w.double() @ gram) * w.double()).sum().sqrt()
    alphas = np.linspace(0, 1, grid + 1)
    errors = np.array([error(awq_quantize(w, awq_scales(magnitude, a), quant)) for a in alphas])
    best = int(np.argmin(errors))
    return {"alphas": alphas, "errors": errors, "alpha": float(alphas[best]), "error": float(errors[best]),
            "rtn_error": float(errors[0]), "scales": awq_scales(magnitude, alphas[best]), "magnitude": magnitude}


@torch.no_grad()
def awq_copy(model, calibration: dict, quant, grid: int = 20):
    """A plain copy of ``model`` with the weights an AWQ-quantized model computes with; returns (copy, searches).

    Every decoder linear and the LM head (with a tied embedding, the embedding too) are quantized with
    ``quant``, as ``dequantized_copy`` does; the linears named in ``calibration`` (their inputs, from
    :func:`capture_inputs`) are AWQ-scaled first, with the alpha :func:`awq_search` picks on those inputs.
    With an empty ``calibration`` the copy is plain round-to-nearest. ``searches`` maps each AWQ-scaled
    linear's name to what :func:`awq_search` found for it (alpha, scales, errors on the calibration inputs).
    """
    out = copy.deepcopy(model)
    searches = {}
    for name, linear in linear_layers(out).items():
        if name in calibration:
            found = awq_search(linear.weight, calibration[name], quant, grid)
            w_hat = awq_quantize(linear.weight.detach().float().to(found["scales"].device), found["scales"], quant)
            searches[name] = found
        else:
            w_hat = quant(linear.weight.detach().float())
        linear.weight.copy_(w_hat.to(linear.weight.dtype))
    out.lm_head.weight.copy_(quant(out.lm_head.weight.detach().float()).to(out.lm_head.weight.dtype))
    return out, searches
