"""Calculations and pictures for lecture 07 (GQA, smaller KV caches and weight-only quantization).

The engine's own pieces (:mod:`miniengine.layers.quant`, :mod:`miniengine.gqa`, :mod:`miniengine.cost.roofline`)
do the work; this module adds what a lecture needs to look at them from the side:

* **Number formats**: :func:`float_format` and :func:`int_format` (bits, range, step, read from
  ``torch.finfo`` rather than typed in), and :func:`float8_grid`, every finite value of an fp8 format.
* **Scale granularity**: :func:`fake_quant`, symmetric round-to-nearest with one scale per tensor, per
  output channel or per group of inputs. The engine's ``Int8PerChannel`` and ``Int4GroupWise`` are two of
  its cases, bit for bit; :func:`bytes_per_weight` counts the scales too.
* **Activations**: :func:`linear_layers` names a model's decoder linears, :func:`capture_inputs` records
  what flows into them on real text (forward hooks).
* **Quality**: :func:`val_loss` and :func:`top1_agreement` give the numbers of ``train.evaluate`` and
  ``modelcard.top1_agreement`` (same windows), with tensors on the model's own device.
* **GQA without copies**: :func:`grouped_attention` computes the engine's attention for grouped KV heads
  by packing each group's query heads together, so that every K/V value is read once.
* **AWQ** (Lin et al., 2024): :func:`awq_scales`, :func:`awq_quantize`, :func:`awq_search` (the grid search
  over the exponent alpha, on calibration inputs) and :func:`awq_copy` (a plain model whose weights are
  what an AWQ-quantized one computes with). A demonstration only: the engine does not use it.
* **KV designs on the paper GPU**: :class:`KVDesign` describes GQA/MQA, MLA, cross-layer sharing and
  local attention; :func:`kv_bytes_per_token` counts their cache, :func:`priced` puts any cache size into
  the course's :class:`~miniengine.cost.roofline.CostModel`, and :func:`design_point` prices a choice of KV
  heads, weight format and KV format. :func:`explorer` wires that to ipywidgets (``interactive_output``,
  no ``Output``/``clear_output``); ipywidgets is imported only when the explorer is built.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import numbers

import numpy as np
import torch
import torch.nn as nn

from miniengine.attention import NoCacheBackend
from miniengine.cost.roofline import GPUS, CostModel, llama3_8b, weight_bytes

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


# ---------------------------------------------------------------- activations


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


# ---------------------------------------------------------------- quality on validation windows


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


# ---------------------------------------------------------------- GQA without copies


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


# ---------------------------------------------------------------- AWQ


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


# ---------------------------------------------------------------- KV designs on the paper GPU


@dataclasses.dataclass(frozen=True)
class KVDesign:
    """What a model caches per token. Fields left at their defaults keep the base config's choice.

    kv_heads         GQA with this many KV heads (1 is MQA; the query heads' number is MHA)
    latent           MLA: values cached per layer and token (the compressed KV plus the decoupled RoPE key),
                     shared by all heads, instead of 2 x kv_heads x head_dim
    share            cross-layer attention: this many adjacent layers use one layer's K/V (1: no sharing)
    window           local attention: layers that cache at most this many recent positions
    global_every     with a window, every global_every-th caching layer stays global (full context);
                     None makes every layer local
    """

    name: str
    kv_heads: int | None = None
    latent: int | None = None
    share: int = 1
    window: int | None = None
    global_every: int | None = None

    def layers(self, cfg) -> tuple[int, int]:
        """(global layers, local layers) among the layers that own a cache."""
        owning = math.ceil(cfg.num_hidden_layers / self.share)
        if self.window is None:
            return owning, 0
        glob = 0 if self.global_every is None else owning // self.global_every
        return glob, owning - glob

    def values_per_layer(self, cfg) -> int:
        if self.latent is not None:
            return self.latent
        heads = cfg.num_key_value_heads if self.kv_heads is None else self.kv_heads
        return 2 * heads * cfg.head_dim


def kv_bytes_per_sequence(cfg, design: KVDesign, context: int, bytes_per_value: float = 2) -> float:
    """Bytes of cache one sequence of ``context`` positions holds."""
    glob, local = design.layers(cfg)
    held = glob * context + local * min(context, design.window or context)
    return held * design.values_per_layer(cfg) * bytes_per_value


def kv_bytes_per_token(cfg, design: KVDesign, context: int, bytes_per_value: float = 2) -> float:
    """Cache bytes per position, averaged over a sequence of ``context`` positions (local layers cap it)."""
    return kv_bytes_per_sequence(cfg, design, context, bytes_per_value) / context


def priced(cfg, gpu, kv_bytes: float, bytes_per_param: float = 2, **cost_model_args) -> CostModel:
    """A CostModel of ``cfg`` whose cache holds ``kv_bytes`` per position.

    The cost model counts 2 x layers x kv_heads x head_dim values per position; any other cache size
    enters as the matching ``bytes_per_value``. Everything else (weights, FLOPs) is ``cfg``'s.
    """
    return CostModel(cfg, gpu, bytes_per_param=bytes_per_param,
                     bytes_per_value=kv_bytes / cfg.kv_bytes_per_token(1), **cost_model_args)


SCALE_BYTES = 2  # a scale is stored in the model's dtype: bf16 for Llama-3-8B (quantize_model does the same)
WEIGHT_FORMATS = {  # name -> (bits, granularity) of every matrix (embedding and LM head included)
    "bf16": (16, None),
    "int8 / fp8, per channel": (8, "channel"),
    "int4, groups of 128": (4, 128),
    "int4, groups of 64": (4, 64),
}
KV_FORMATS = {"bf16": 16, "int8 / fp8": 8, "int4": 4}  # a quantized cache: one bf16 scale per head and position


def weight_bytes_per_param(fmt: str, cfg=None) -> float:
    bits, granularity = WEIGHT_FORMATS[fmt]
    cfg = cfg or llama3_8b()
    return bytes_per_weight(bits, granularity, in_features=cfg.hidden_size, scale_bytes=SCALE_BYTES)


def kv_bytes_per_value(fmt: str, cfg=None) -> float:
    bits = KV_FORMATS[fmt]
    cfg = cfg or llama3_8b()
    return bits / 8 if bits >= 16 else bits / 8 + SCALE_BYTES / cfg.head_dim


def design_point(kv_heads: int = 8, weights: str = "bf16", kv: str = "bf16", context: int = 4096, batch: int = 1,
                 gpu: str = "H100", base=None) -> dict:
    """Llama-3-8B (or ``base``) with ``kv_heads`` KV heads and the given formats, priced on the paper GPU.

    Returns the bytes (per weight, all weights, KV per position), the KV capacity, the largest batch of
    ``context``-position sequences that fits, and the decode step at ``batch`` (capped at that largest batch).
    """
    cfg = dataclasses.replace(base or llama3_8b(), num_key_value_heads=kv_heads)
    model = CostModel(cfg, GPUS[gpu], bytes_per_param=weight_bytes_per_param(weights, cfg),
                      bytes_per_value=kv_bytes_per_value(kv, cfg))
    biggest = model.max_batch(context)
    row = {"kv heads": kv_heads, "weights": weights, "kv": kv, "context": context, "gpu": model.gpu.name,
           "bytes per weight": model.bytes_per_param, "weight bytes": weight_bytes(cfg, model.bytes_per_param),
           "kv bytes per token": model.kv_bytes_per_token, "kv capacity tokens": model.kv_capacity_tokens,
           "max batch": biggest, "model": model}
    b = min(batch, biggest)
    if b >= 1:
        est = model.decode(b, context)
        row.update(batch=b, step_s=est.step_time_s, bound=est.bound, tokens_per_s=b / est.step_time_s)
    else:
        row.update(batch=0, step_s=float("nan"), bound="does not fit", tokens_per_s=0.0)
    return row


def step_curve(row: dict, points: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Decode step time (s) against batch, from 1 to the design's largest batch (log-spaced)."""
    if row["max batch"] < 1:
        return np.array([]), np.array([])
    batches = np.unique(np.geomspace(1, row["max batch"], points).astype(int))
    return batches, np.array([row["model"].decode(int(b), row["context"]).step_time_s for b in batches])


def draw_designs(ax, rows, labels=None):
    """Decode step time against batch for several design points; each line ends at its largest batch."""
    for i, row in enumerate(rows):
        b, t = step_curve(row)
        label = labels[i] if labels else f"{row['kv heads']} KV heads, {row['weights']} weights, {row['kv']} KV"
        if len(b):
            line, = ax.plot(b, t * 1e3, lw=1.8, label=f"{label} (max batch {row['max batch']:,})")
            ax.plot(b[-1], t[-1] * 1e3, "o", color=line.get_color())
        else:
            ax.plot([], [], label=f"{label}: the weights leave no room for KV")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (sequences decoding together)")
    ax.set_ylabel("decode step (ms, paper GPU)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def describe(row: dict) -> str:
    """The numbers of one design point, as a few lines of text."""
    lines = [f"{row['kv heads']} KV head{'s' if row['kv heads'] > 1 else ''}, {row['weights']} weights, {row['kv']} KV, context {row['context']:,}, "
             f"on the paper {row['gpu']}",
             f"  weights: {row['bytes per weight']:.4f} bytes each, {row['weight bytes'] / 1e9:.2f} GB",
             f"  KV: {row['kv bytes per token'] / 1024:.1f} KiB per position; room for "
             f"{row['kv capacity tokens']:,} positions; largest batch at this context: {row['max batch']:,}"]
    if row["batch"]:
        lines.append(f"  decode step at batch {row['batch']:,}: {row['step_s'] * 1e3:.2f} ms ({row['bound']}-bound), "
                     f"{row['tokens_per_s']:,.0f} tokens/s")
    return "\n".join(lines)


def explorer(context: int = 4096, batch: int = 64):
    """Widgets for KV heads, weight format, KV format, context, batch and GPU; the chart and numbers follow."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    controls = {
        "kv_heads": widgets.Dropdown(options=[32, 16, 8, 4, 2, 1], value=8, description="KV heads"),
        "weights": widgets.Dropdown(options=list(WEIGHT_FORMATS), value="bf16", description="weights"),
        "kv": widgets.Dropdown(options=list(KV_FORMATS), value="bf16", description="KV cache"),
        "context": widgets.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384, 32768], value=context,
                                           description="context", continuous_update=False),
        "batch": widgets.SelectionSlider(options=[1, 4, 16, 64, 256, 1024], value=batch, description="batch",
                                         continuous_update=False),
        "gpu": widgets.Dropdown(options=list(GPUS), value="H100", description="GPU"),
    }

    def show(kv_heads, weights, kv, context, batch, gpu):
        row = design_point(kv_heads, weights, kv, context, batch, gpu)
        ref = design_point(8, "bf16", "bf16", context, batch, gpu)
        print(describe(row))
        fig, ax = plt.subplots(figsize=(8, 3.4))
        draw_designs(ax, [ref, row], ["Llama-3-8B as released (8 KV heads, bf16)", "your choice"])
        ax.set_title(f"decode step against batch, context {context:,}: a line ends where memory runs out",
                     fontsize=9)
        plt.tight_layout()
        plt.show()

    out = widgets.interactive_output(show, controls)
    names = list(controls.values())
    return widgets.VBox([widgets.HBox(names[:3]), widgets.HBox(names[3:]), out])
