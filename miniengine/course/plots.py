"""Matplotlib helpers that more than one notebook draws: the roofline and the points placed on it.

A roofline is the most a chip can do at a given arithmetic intensity I (FLOPs per
byte moved): ``min(peak, bandwidth * I)``.  Left of the ridge point
(peak / bandwidth) the sloped roof is memory bandwidth; right of it the flat roof
is arithmetic.  Both axes are logarithmic, so the slope is always 1.

The helpers take a ``roofline.GPU`` and draw on an axes you give them, so a
lecture, a lab or a widget can combine several GPUs, discounted roofs and
measured points on one chart.  The y axis is in TFLOP/s.
"""
from __future__ import annotations

import numpy as np

TERA = 1e12


def attainable_flops(gpu, intensity, compute_eff: float = 1.0, bandwidth_eff: float = 1.0):
    """FLOP/s a kernel of this intensity can reach on ``gpu``: min(peak, bandwidth * I), each discounted."""
    intensity = np.asarray(intensity, dtype=float)
    return np.minimum(compute_eff * gpu.peak_flops, bandwidth_eff * gpu.bandwidth * intensity)


def plot_roofline(ax, gpu, *, compute_eff: float = 1.0, bandwidth_eff: float = 1.0, intensity=(0.1, 1e4),
                  label: str | None = None, ridge: bool = True, **line_kw):
    """Draws ``gpu``'s roofline on ``ax`` (log-log, y in TFLOP/s) and returns the line.

    With efficiencies below 1 it draws the roof a real kernel can reach instead of the
    data sheet's.  ``ridge=True`` marks the ridge point with a dot and a dotted drop line.
    """
    lo, hi = intensity
    xs = np.geomspace(lo, hi, 400)
    ridge_x = compute_eff * gpu.peak_flops / (bandwidth_eff * gpu.bandwidth)
    if lo < ridge_x < hi:  # put a sample exactly on the corner so the kink is sharp
        xs = np.sort(np.append(xs, ridge_x))
    if label is None:
        label = f"{gpu.name}: ridge {ridge_x:.0f} FLOP/byte"
    (line,) = ax.plot(xs, attainable_flops(gpu, xs, compute_eff, bandwidth_eff) / TERA, label=label, **line_kw)
    if ridge and lo < ridge_x < hi:
        top = compute_eff * gpu.peak_flops / TERA
        ax.plot([ridge_x], [top], "o", color=line.get_color(), ms=5)
        bottom = float(attainable_flops(gpu, lo, compute_eff, bandwidth_eff)) / TERA  # the lowest point of the roof
        ax.vlines(ridge_x, bottom, top, colors=line.get_color(), linestyles=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    return line


def mark_point(ax, intensity: float, flops_per_s: float, text: str, *, offset=(8, -4), **marker_kw):
    """A labelled marker at (intensity, FLOP/s), e.g. a forward pass priced by the cost model or measured."""
    kw = {"marker": "o", "color": "k", "ms": 6, "ls": "none"} | marker_kw
    ax.plot([intensity], [flops_per_s / TERA], **kw)
    if text:
        ax.annotate(text, (intensity, flops_per_s / TERA), textcoords="offset points", xytext=offset, fontsize=8,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85})
