"""Lab 07's shared checks: the answer key, the lab's formats written out as formulas, and the small helpers that
every task's tests use. Reloaded by ``autograder.labs.lab07`` before its other parts (see that module)."""
from __future__ import annotations

import importlib.util

import numpy as np
import torch

import autograder.notebook_checks as checks

# This lab's answer key: any call into it while a test runs fails the test (checks.reference_forbidden).
ANSWER_KEY = {
    "miniengine.layers.quant": ["pack_int4", "unpack_int4", "_scales", "Int4GroupWise.__init__",
                                "Int4GroupWise.quantize", "Int4GroupWise.dequantize"],
    "miniengine.gqa": ["mean_pool_kv"]}
if importlib.util.find_spec("miniengine.course.quant_viz") is not None:  # lecture 07's helpers: its fake_quant is int4 too
    ANSWER_KEY["miniengine.course.quant_viz"] = ["fake_quant"]


def call(fn, what, *args, **kwargs):
    """Call your code; an exception in it becomes a failure that says which call raised what."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}") from e


def as_tensor(x, what):
    assert isinstance(x, torch.Tensor), f"{what}: expected a torch tensor, got {type(x).__name__}"
    return x


def first(mask):
    """The index of the first True entry, as a tuple of ints."""
    return tuple(int(i) for i in np.argwhere(mask)[0])


def want_codes(packed):
    """The lab's unpacking, by the formula: the low nibble of byte i is code 2i, the high nibble code 2i+1, each a
    4-bit two's complement number (a nibble of 8..15 stands for nibble - 16)."""
    b = np.asarray(packed, dtype=np.int64)
    nibbles = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])
    return np.where(nibbles >= 8, nibbles - 16, nibbles)


def own_scheme(cls):
    """Int4GroupWise must be your class, with your own __init__, quantize and dequantize (not inherited from the
    course's scheme, whose methods the answer key forbids anyway)."""
    assert isinstance(cls, type) and cls.__module__ == "__main__", (
        "Int4GroupWise must be a class written with `class Int4GroupWise:` in this notebook, not imported")
    for name in ("__init__", "quantize", "dequantize"):
        assert name in vars(cls), f"Int4GroupWise must define its own {name}"
        checks.require_own(vars(cls)[name], f"Int4GroupWise.{name}")


def head_rows(w, H):
    """A [H * d, hidden] projection as [H, d, hidden]: head h is rows h*d .. h*d+d-1."""
    w = np.asarray(w, dtype=np.float64)
    return w.reshape(H, w.shape[0] // H, w.shape[1])


def want_pool(w, H, K):
    """The lab's pooling, by the formula: KV head g is the mean of query heads g*G .. g*G+G-1 (G = H / K), and
    head h is rows h*d .. h*d+d-1 of the projection."""
    heads, G = head_rows(w, H), H // K
    return np.concatenate([heads[g * G:(g + 1) * G].mean(axis=0) for g in range(K)])
