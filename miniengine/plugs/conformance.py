"""Holding a plugged object to its plug point's Protocol (miniengine/plugs/), with a message that says what to fix.

``check(field, obj, protocol)`` returns ``obj``, or raises a :class:`PlugError` that names the field, the class,
the missing method with its signature and the lab, e.g.
``scheduling_policy: StudentPolicy has no admit(waiting, running, budget) (Lab 04)``.  A Protocol only says
which methods exist; a method, or a function plug, that cannot take the arguments the engine passes
(required ones by position, optional ones by name) is refused too, since that is cheap to see.
"""
from __future__ import annotations

import inspect
from typing import Protocol

from miniengine.plugs import LookaheadKV, PLUG_POINTS, RollbackBlockAllocator, SpeculativeKV


class PlugError(TypeError, ValueError):
    """A plugged object does not fit its plug point (a TypeError, and a ValueError as config errors are)."""


def members(protocol) -> list[tuple[str, object]]:
    """(name, the declared method, or None for an attribute) of every member: bases first, each class's methods in
    declaration order, then its attributes."""
    out = {}
    for cls in reversed(protocol.__mro__):
        if cls.__dict__.get("_is_protocol") and cls is not Protocol:
            for n, f in cls.__dict__.items():
                if inspect.isfunction(f) and (n == "__call__" or not n.startswith("_")):
                    out[n] = f
            for n in cls.__dict__.get("__annotations__", {}):
                out.setdefault(n, None)
    return list(out.items())


def _call_shape(fn) -> tuple[list, list]:
    params = list(inspect.signature(fn).parameters.values())[1:]  # without self
    return [p.name for p in params if p.default is p.empty], [p.name for p in params if p.default is not p.empty]


def _shown(fn) -> str:
    need, opt = _call_shape(fn)
    return ", ".join(need + [f"{n}=None" for n in opt])


def _misfit(fn, declared) -> str | None:
    """None if ``fn`` can be called as the engine calls ``declared`` (required arguments by position, optional ones by
    name), else fn's own parameters, as text."""
    need, opt = _call_shape(declared)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check cheaply
        return None
    try:
        sig.bind(*need, **{n: None for n in opt})
        return None
    except TypeError:
        return ", ".join(map(str, sig.parameters.values()))


def check(field: str, obj, protocol, name: str | None = None):
    """``obj`` if it fits ``protocol``; else a PlugError naming the field, the class, the missing method and the lab."""
    point = PLUG_POINTS[protocol]
    lab = point.lab
    cls = obj.__name__ if inspect.isroutine(obj) or isinstance(obj, type) else type(obj).__name__
    declared = members(protocol)
    if [n for n, _ in declared] == ["__call__"]:
        shape = f"{name or point.name or field.rsplit('.', 1)[-1]}({_shown(protocol.__call__)})"
        if not callable(obj):
            raise PlugError(f"{field}: {cls} is not callable as {shape} ({lab})")
        bad = _misfit(obj, protocol.__call__)
        if bad is not None:
            raise PlugError(f"{field}: {cls} takes ({bad}), but the engine calls {shape} ({lab})")
        return obj
    if isinstance(obj, type):
        raise PlugError(f"{field}: {cls} is a class; plug in an instance, {cls}(...) ({lab})")
    for member, fn in declared:
        if fn is None:  # an attribute
            if not hasattr(obj, member):
                raise PlugError(f"{field}: {cls} has no attribute {member} ({lab})")
            continue
        shape = f"{member}({_shown(fn)})"
        method = getattr(obj, member, None)
        if not callable(method):
            raise PlugError(f"{field}: {cls} has no {shape} ({lab})")
        bad = _misfit(method, fn)
        if bad is not None:
            raise PlugError(f"{field}: {cls}.{member} takes ({bad}), but the engine calls {shape} ({lab})")
    return obj


def check_speculative_kv(kv, field: str = "kv"):
    """What the speculative step needs of a KV layout (and of PagedKV's block manager): the rollback."""
    check(field, kv, SpeculativeKV)
    if hasattr(kv, "can_append"):
        check(field, kv, LookaheadKV)
    manager = getattr(kv, "block_manager", None)
    if manager is not None:
        check(f"{field}.block_manager", manager, RollbackBlockAllocator)
    return kv
