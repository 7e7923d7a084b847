"""Calculations and pictures for lecture 07 (GQA, smaller KV caches and weight-only quantization).

The engine's own pieces (:mod:`miniengine.layers.quant`, :mod:`miniengine.gqa`, :mod:`miniengine.cost.roofline`)
do the work; this package adds what a lecture needs to look at them from the side, one module per concept
(every name is importable from the package itself, as ``qv.fake_quant``):

* **Number formats** (:mod:`.formats`): :func:`float_format` and :func:`int_format` (bits, range, step, read
  from ``torch.finfo`` rather than typed in), and :func:`float8_grid`, every finite value of an fp8 format.
* **Scale granularity** (:mod:`.formats`): :func:`fake_quant`, symmetric round-to-nearest with one scale per
  tensor, per output channel or per group of inputs. The engine's ``Int8PerChannel`` and ``Int4GroupWise`` are
  two of its cases, bit for bit; :func:`bytes_per_weight` counts the scales too.
* **Activations** (:mod:`.activations`): :func:`linear_layers` names a model's decoder linears,
  :func:`capture_inputs` records what flows into them on real text (forward hooks).
* **Quality** (:mod:`.quality`): :func:`val_loss` and :func:`top1_agreement` give the numbers of
  ``train.evaluate`` and ``modelcard.top1_agreement`` (same windows), with tensors on the model's own device.
* **GQA without copies** (:mod:`.grouped`): :func:`grouped_attention` computes the engine's attention for grouped
  KV heads by packing each group's query heads together, so that every K/V value is read once.
* **AWQ** (Lin et al., 2024; :mod:`.awq`): :func:`awq_scales`, :func:`awq_quantize`, :func:`awq_search` (the grid
  search over the exponent alpha, on calibration inputs) and :func:`awq_copy` (a plain model whose weights are
  what an AWQ-quantized one computes with). A demonstration only: the engine does not use it.
* **KV designs on the paper GPU** (:mod:`.kv_designs`): :class:`KVDesign` describes GQA/MQA, MLA, cross-layer
  sharing and local attention; :func:`kv_bytes_per_token` counts their cache, :func:`priced` puts any cache size
  into the course's :class:`~miniengine.cost.roofline.CostModel`, and :func:`design_point` prices a choice of KV
  heads, weight format and KV format. :func:`explorer` wires that to ipywidgets (``interactive_output``,
  no ``Output``/``clear_output``); ipywidgets is imported only when the explorer is built.
"""
from __future__ import annotations

from miniengine.course.quant_viz.activations import capture_inputs, linear_layers, output_error
from miniengine.course.quant_viz.awq import awq_copy, awq_quantize, awq_scales, awq_search
from miniengine.course.quant_viz.formats import (FLOAT_DTYPES, bytes_per_weight, fake_quant, float8_grid, float_format,
                                                 int_format)
from miniengine.course.quant_viz.grouped import grouped_attention
from miniengine.course.quant_viz.kv_designs import (KV_FORMATS, SCALE_BYTES, WEIGHT_FORMATS, KVDesign, describe,
                                                    design_point, draw_designs, explorer, kv_bytes_per_sequence,
                                                    kv_bytes_per_token, kv_bytes_per_value, priced, step_curve,
                                                    weight_bytes_per_param)
from miniengine.course.quant_viz.quality import top1_agreement, val_loss, window_starts

__all__ = [
    "FLOAT_DTYPES", "float_format", "int_format", "float8_grid", "fake_quant", "bytes_per_weight",
    "linear_layers", "capture_inputs", "output_error",
    "window_starts", "val_loss", "top1_agreement",
    "grouped_attention",
    "awq_scales", "awq_quantize", "awq_search", "awq_copy",
    "KVDesign", "kv_bytes_per_sequence", "kv_bytes_per_token", "priced", "SCALE_BYTES", "WEIGHT_FORMATS",
    "KV_FORMATS", "weight_bytes_per_param", "kv_bytes_per_value", "design_point", "step_curve", "draw_designs",
    "describe", "explorer",
]
