"""Quality on validation windows: the numbers of ``train.evaluate`` and ``modelcard.top1_agreement`` (same windows),
with tensors on the model's own device."""
from __future__ import annotations

import numpy as np
import torch

from miniengine.attention import NoCacheBackend


def window_starts(stream_len: int, n_windows: int, seq_len: int = 256) -> np.ndarray:
    """The evenly spaced window starts that ``train.evaluate`` and ``modelcard.top1_agreement`` use."""
    return np.linspace(0, stream_len - seq_len - 1, n_windows).astype(np.int64)


@torch.inference_mode()
def val_loss(model, stream: np.ndarray, n_windows: int = 32, seq_len: int = 256) -> float:
    """``train.evaluate``'s number (mean next-token loss over the same windows), on the model's own device."""
    device, losses = model.device, []
    for s in window_starts(len(stream), n_windows, seq_len):
        x = torch.from_numpy(stream[s: s + seq_len + 1].astype(np.int64)).to(device)
        logits = model(x[:-1], torch.arange(seq_len, device=device), NoCacheBackend([seq_len]))
        losses.append(torch.nn.functional.cross_entropy(logits.float(), x[1:]).item())
    return float(np.mean(losses))


@torch.inference_mode()
def top1_agreement(model, reference, stream: np.ndarray, n_windows: int = 32, seq_len: int = 256) -> float:
    """``modelcard.top1_agreement``'s number (share of positions where the argmaxes agree), on the models' devices."""
    agree = 0
    for s in window_starts(len(stream), n_windows, seq_len):
        ids = torch.from_numpy(stream[s: s + seq_len].astype(np.int64))
        a, b = (m(ids.to(m.device), torch.arange(seq_len, device=m.device), NoCacheBackend([seq_len])).argmax(-1).cpu()
                for m in (model, reference))
        agree += int((a == b).sum())
    return agree / (n_windows * seq_len)
