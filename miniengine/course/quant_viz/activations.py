"""What flows into a model's decoder linears: their names, their inputs on real text, a layer's output error."""
from __future__ import annotations

import torch
import torch.nn as nn

from miniengine.attention import NoCacheBackend


def linear_layers(model) -> dict:
    """``{"layers.3.mlp.down_proj": nn.Linear, ...}``: every linear of every decoder layer, in order."""
    found = {}
    for i, layer in enumerate(model.model.layers):
        for part, parent in (("self_attn", layer.self_attn), ("mlp", layer.mlp)):
            for name, child in parent.named_children():
                if isinstance(child, nn.Linear):
                    found[f"layers.{i}.{part}.{name}"] = child
    return found


@torch.no_grad()  # not inference_mode: the recorded tensors must mix with ordinary ones later
def capture_inputs(model, windows, names=None) -> dict:
    """The inputs of the named decoder linears (all by default) on token windows: ``{name: [tokens, in]}``.

    Each window runs alone through the model without a cache; the rows of all windows are concatenated,
    in float32 on the CPU.
    """
    layers = linear_layers(model)
    names = list(layers) if names is None else list(names)
    unknown = [n for n in names if n not in layers]
    if unknown:
        raise ValueError(f"no decoder linear named {unknown[0]!r}; the names look like {next(iter(layers))!r}")
    rows = {n: [] for n in names}
    hooks = [layers[n].register_forward_hook(lambda mod, inp, out, n=n: rows[n].append(
        inp[0].detach().reshape(-1, inp[0].shape[-1]).float().cpu())) for n in names]
    device = model.device
    try:
        for ids in windows:
            n = len(ids)
            model(torch.as_tensor(list(ids), device=device), torch.arange(n, device=device), NoCacheBackend([n]))
    finally:
        for h in hooks:
            h.remove()
    return {n: torch.cat(r) for n, r in rows.items()}


def output_error(w: torch.Tensor, w_hat: torch.Tensor, x: torch.Tensor) -> float:
    """Relative error of the layer's output: ||x W^T - x W_hat^T|| / ||x W^T|| (Frobenius norms), on x's device."""
    x = x.detach().float()
    w, w_hat = w.detach().float().to(x.device), w_hat.detach().float().to(x.device)
    y = x @ w.T
    return float((y - x @ w_hat.T).norm() / y.norm())
