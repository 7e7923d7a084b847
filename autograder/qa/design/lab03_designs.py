"""Lab 03's honest designs: the cost models the calibration threshold is set from (autograder/qa/design/lab03.py).

Each is a ``rows -> cost_model`` a student could write from the lab's text, from the least effort (the paper roofline
with its constants fitted) to the course's reference.  ``python -m autograder.qa.design.lab03`` prints their MAPE on
the training rows, on design-mape-visible's slices (fitted without them) and on the held-out points.
"""
from __future__ import annotations

import numpy as np

from miniengine.cost import counting
from miniengine.course import step_times


def _cost(cfg, new_tokens, context):
    return counting.forward_cost(cfg, list(new_tokens), list(context), bytes_per_param=4, bytes_per_value=4)


def roofline_terms(cfg, new_tokens, context) -> list[float]:
    """A fixed overhead, the FLOPs and the bytes of Tasks 3 and 4, added rather than maxed."""
    c = _cost(cfg, new_tokens, context)
    return [1.0, c.flops, c.bytes]


def per_layer_terms(cfg, new_tokens, context) -> list[float]:
    """The roofline's terms and a cost per layer (a Python engine's dozen calls per layer)."""
    return roofline_terms(cfg, new_tokens, context) + [cfg.num_hidden_layers]


def batched_layer_terms(cfg, new_tokens, context) -> list[float]:
    """... and a second cost per layer once a step holds more than one sequence (padding and masks)."""
    return per_layer_terms(cfg, new_tokens, context) + [cfg.num_hidden_layers * (len(new_tokens) > 1)]


def superlinear_kv_terms(cfg, new_tokens, context) -> list[float]:
    """... or the KV history's square per layer instead (the history outgrows the caches)."""
    kv = _cost(cfg, new_tokens, context).kv_read_bytes
    return per_layer_terms(cfg, new_tokens, context) + [kv * kv / cfg.num_hidden_layers]


def split_terms(cfg, new_tokens, context) -> list[float]:
    """Overhead, per layer, the weights, the layers' matmuls, attention's FLOPs, the KV read: each its own rate."""
    c, L = _cost(cfg, new_tokens, context), cfg.num_hidden_layers
    pairs = sum(t * s + t * (t + 1) // 2 for t, s in zip(new_tokens, context))
    attention = 4 * L * cfg.num_attention_heads * cfg.head_dim * pairs
    return [1.0, L, 4 * counting.param_count(cfg), c.flops - attention, attention, c.kv_read_bytes]


class _Step:
    def __init__(self, seconds):
        self.step_time_s = seconds


def fitted_roofline(rows):
    """The paper model's form, max(FLOPs / a, bytes / b) + c, with a, b (the achieved FLOP/s and bytes/s) searched
    on a grid and c fitted, to the relative error: the least a calibration can be."""
    data = [(_cost(step_times.row_config(r), *step_times.row_batch(r)), r["step_ms"] / 1e3) for r in rows]
    F, B = np.array([c.flops for c, _ in data]), np.array([c.bytes for c, _ in data])
    y = np.array([t for _, t in data])
    best = None
    for flops_s in np.geomspace(1e9, 2e11, 60):
        for bytes_s in np.geomspace(1e9, 2e11, 60):
            roof = np.maximum(F / flops_s, B / bytes_s)
            c = max(0.0, float(np.sum((y - roof) / y**2) / np.sum(1 / y**2)))  # least relative squares
            err = float(np.mean(np.abs(roof + c - y) / y))
            if best is None or err < best[0]:
                best = (err, flops_s, bytes_s, c)
    _, flops_s, bytes_s, c = best

    def cost_model(cfg):
        class Roofline:
            def forward(self, new_tokens, context):
                k = _cost(cfg, new_tokens, context)
                return _Step(max(k.flops / flops_s, k.bytes / bytes_s) + c)
        return Roofline()
    return cost_model


def designs(fit, three_terms, features) -> dict:
    """name -> rows -> cost_model, weakest first (``fit``, ``three_terms``, ``features``: lab03.py's)."""
    return {
        "fitted roofline: max(FLOPs/a, bytes/b) + c": fitted_roofline,
        "overhead + FLOPs + bytes, linear": lambda rows: fit(rows, roofline_terms),
        "three-term linear fit (overhead, matmuls per token, KV read)": lambda rows: fit(rows, three_terms),
        "overhead + FLOPs + bytes + per layer": lambda rows: fit(rows, per_layer_terms),
        "... + per layer when batched": lambda rows: fit(rows, batched_layer_terms),
        "... + KV history squared per layer": lambda rows: fit(rows, superlinear_kv_terms),
        "split rates (overhead, layer, weights, matmuls, attention, KV)": lambda rows: fit(rows, split_terms),
        "reference fit (the lab's solution's terms)": lambda rows: fit(rows, features),
    }
