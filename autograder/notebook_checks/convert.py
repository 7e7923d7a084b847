"""Strict conversions of a student's outputs to plain Python values, before anything is compared.

An object whose ``__eq__`` always returns True cannot pass: it is turned into an int, a bool or a list first,
or refused with a message that names what was expected.
"""
from __future__ import annotations

import numbers
import operator

import numpy as np
import torch


def as_token(x, what: str) -> int:
    """A token id as a plain int: ints, numpy integers and 0-d integer tensors qualify; floats and bools do not."""
    if isinstance(x, (bool, np.bool_)):
        raise AssertionError(f"{what}: expected a token id (an integer), got the bool {x!r}")
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_floating_point():
        x = x.item()
    try:
        value = operator.index(x)
    except TypeError:
        raise AssertionError(f"{what}: expected a token id (an integer), got {type(x).__name__} {x!r:.60}") from None
    return int(value)


def as_tokens(xs, what: str) -> list[int]:
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__"):
        raise AssertionError(f"{what}: expected a list of token ids, got {type(xs).__name__}")
    return [as_token(x, f"{what}[{i}]") for i, x in enumerate(list(xs))]


def as_mask(x, n: int, what: str) -> list[bool]:
    """A keep-mask as a list of n plain bools; numpy and torch boolean arrays qualify."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype != np.bool_:
        raise AssertionError(f"{what}: expected a boolean array (True = keep), got dtype {arr.dtype}")
    if arr.shape != (n,):
        raise AssertionError(f"{what}: expected shape ({n},), one entry per logit, got {arr.shape}")
    return [bool(v) for v in arr.tolist()]


def as_count(x, what: str) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Integral, np.integer, torch.Tensor)):
        raise AssertionError(f"{what}: expected an integer, got {type(x).__name__} {x!r:.60}")
    return as_token(x, what)


def show(tok, token_id) -> str:
    """A token id with its text, for messages: 1234 (' return')."""
    try:
        return f"{token_id} ({tok.decode([int(token_id)], skip_special_tokens=False)!r})"  # shows <|endoftext|> too
    except Exception:  # an out-of-range id from a buggy submission: the number alone will do
        return str(token_id)
