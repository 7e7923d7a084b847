"""KV designs and weight formats on the paper GPU, and the widgets that explore them.

:class:`KVDesign` describes GQA/MQA, MLA, cross-layer sharing and local attention; :func:`kv_bytes_per_token`
counts their cache, :func:`priced` puts any cache size into the course's
:class:`~miniengine.cost.roofline.CostModel`, and :func:`design_point` prices a choice of KV heads, weight format
and KV format. :func:`explorer` wires that to ipywidgets (``interactive_output``, no ``Output``/``clear_output``);
ipywidgets is imported only when the explorer is built.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from miniengine.cost.roofline import GPUS, CostModel, llama3_8b, weight_bytes
from miniengine.course.quant_viz.formats import bytes_per_weight


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
