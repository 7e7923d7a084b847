"""The course's parts under a graded task: earlier tasks lent by name, so that one mistake costs one task.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect

import numpy as np
import torch

from autograder.notebook_checks.guard import forbidden_call

# ---------------------------------------------------------------- the course's parts under a graded task
#
# A later task calls the functions of earlier tasks by name: ``sample`` calls ``top_k_mask``, ``naive_decode``
# calls ``sample``, ``cached_decode`` builds a ``ContiguousKVCache``.  So that one mistake costs only its own task,
# a test binds those names to the course's versions while it runs (``course_parts_under``).  The function under
# test is never substituted: a test names only the parts below it.
#
# The course's versions are private copies, made when the test enters ``course_parts_under`` (before
# ``reference_forbidden`` swaps the originals' code): each copied function gets the original's code object and a
# namespace of its own that holds only the module globals it uses.  So the copies run while the originals are
# forbidden, and a mask lent to ``sample``'s test does not lead to the course's whole sampler.  A copy works only
# while the ``course_parts_under`` that made it is active, and making one while the originals are forbidden (from
# inside the code under test) counts as calling the reference.

# notebook name -> (module, name) of the course object lent in its place, or a function defined below
COURSE_PARTS = {
    "greedy": None,  # course_greedy below: the temperature-0 branch of miniengine.sampling.sample_token
    "top_k_mask": ("miniengine.sampling", "top_k_mask"),
    "top_p_mask": ("miniengine.sampling", "top_p_mask"),
    "sample": ("miniengine.sampling", "sample_token"),
    "ContiguousKVCache": ("miniengine.kv.contiguous", "KVCache"),
    "CachedAttention": ("miniengine.kv.contiguous", "CachedBackend"),
    "fits": ("miniengine.engine.policy", "fits"),
    "gather_history": ("miniengine.kv.paged", "gather_history"),
    # Lab 06: the draft model's own cache keeps the course's block manager, whose truncate the lab forbids
    "DraftBlockManager": ("miniengine.kv.block_manager", "BlockManager"),
    # Lab 07: Int4GroupWise's tests run it on the course's packing
    "pack_int4": ("miniengine.layers.quant", "pack_int4"),
    "unpack_int4": ("miniengine.layers.quant", "unpack_int4"),
}
_TAKES_LOGITS = {"greedy", "top_k_mask", "top_p_mask", "sample"}  # lent with their first argument made numpy float64

_live: set = set()  # tokens of the course_parts_under contexts now active; a fresh set whenever this module is reloaded


def _require_live(token, name: str):
    if token not in _live:
        forbidden_call(f"the course's {name} (lent to a test, used outside it)")


def _names_used(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):  # comprehensions, lambdas and nested functions
            names |= _names_used(const)
    return names


def _private_copy(module_name: str, name: str):
    """A copy of a course function or class that runs the original code in namespaces of its own.

    Every course function or class it uses (anything defined in ``miniengine``) is copied too, on demand, into a
    namespace per source module that holds only the names the copies use; numpy, torch and the like are shared.
    """
    import types

    namespaces: dict[int, dict] = {}  # id(a module's globals) -> the namespace of the copies made from that module
    done: dict[int, object] = {}  # id(original) -> its copy

    def namespace(src: dict) -> dict:
        if id(src) not in namespaces:
            namespaces[id(src)] = {"__builtins__": src.get("__builtins__", __builtins__),
                                   "__name__": src.get("__name__"), "__package__": src.get("__package__")}
        return namespaces[id(src)]

    def copied(obj):
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            return obj
        if str(getattr(obj, "__module__", "")).split(".")[0] != "miniengine":
            return obj  # numpy, torch, the standard library: shared, as the original shares them
        if id(obj) not in done:
            (function if inspect.isfunction(obj) else klass)(obj)
        return done[id(obj)]

    def function(fn):
        if fn.__code__.co_filename.startswith("<forbidden"):  # asked for from inside the code under test
            forbidden_call(f"{fn.__module__}.{fn.__qualname__}")
        if hasattr(fn, "__wrapped__") or "__class__" in fn.__code__.co_freevars:
            raise NotImplementedError(f"cannot copy {fn.__module__}.{fn.__qualname__} (a decorated function or super())")
        src = fn.__globals__
        ns = namespace(src)
        copy = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__kwdefaults__, copy.__qualname__, copy.__doc__ = fn.__kwdefaults__, fn.__qualname__, fn.__doc__
        done[id(fn)] = copy
        for used in sorted(_names_used(fn.__code__)):
            if used not in ns and used in src:
                ns[used] = copied(src[used])
        return copy

    def klass(cls):
        copy = type(cls)(cls.__name__, tuple(copied(b) for b in cls.__bases__),
                         {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
        done[id(cls)] = copy  # before its methods, which may name the class
        for key, value in vars(cls).items():
            if key in ("__dict__", "__weakref__", "__module__", "__qualname__", "__doc__"):
                continue
            if inspect.isfunction(value):
                value = function(value)
            elif isinstance(value, property):
                value = property(*(f and function(f) for f in (value.fget, value.fset, value.fdel)), value.__doc__)
            elif isinstance(value, (staticmethod, classmethod)):
                value = type(value)(function(value.__func__))
            setattr(copy, key, value)
        return copy

    return copied(getattr(importlib.import_module(module_name), name))


def course_greedy(logits):
    """The course's greedy: the id of the largest raw logit, the first on a tie (sample_token at temperature 0)."""
    if isinstance(logits, torch.Tensor):
        logits = logits.detach().cpu().double().numpy()
    return int(np.argmax(np.asarray(logits, dtype=np.float64)))


def _lent_function(fn, name: str, token):
    """fn as the notebook calls it, live only in its test; a sampling part gets numpy float64 logits first
    (a tensor or a list is converted)."""
    def course_part(*args, **kwargs):
        _require_live(token, name)
        if name in _TAKES_LOGITS:
            logits = args[0].detach().cpu().double().numpy() if isinstance(args[0], torch.Tensor) else args[0]
            args = (np.asarray(logits, dtype=np.float64),) + args[1:]
        return fn(*args, **kwargs)

    course_part.__name__ = course_part.__qualname__ = name
    course_part.__doc__ = f"The course's {name}, lent to this test."
    return course_part


def _lent_class(cls, name: str, token):
    """A subclass of the copied class that only constructs while its test runs."""
    def __new__(klass, *args, **kwargs):
        _require_live(token, name)
        return object.__new__(klass)

    return type(cls)(name, (cls,), {"__new__": __new__, "__doc__": f"The course's {name}, lent to this test.",
                                    "__module__": cls.__module__})


def _course_part(name: str, token):
    if name not in COURSE_PARTS:
        raise KeyError(f"no course version of {name!r}; known parts: {', '.join(COURSE_PARTS)}")
    if COURSE_PARTS[name] is None:
        return _lent_function(course_greedy, name, token)
    original = _private_copy(*COURSE_PARTS[name])
    if inspect.isclass(original):
        return _lent_class(original, name, token)
    return _lent_function(original, name, token)


@contextlib.contextmanager
def course_parts_under(namespace: dict, *names: str):
    """While inside, ``namespace[name]`` is the course's version of each named part; the old values come back after.

    Enter it before ``reference_forbidden``:
    ``with checks.course_parts_under(globals(), "top_k_mask"), checks.reference_forbidden("sample"): ...``
    """
    token = object()
    parts = {name: _course_part(name, token) for name in names}
    missing = object()
    saved = {name: namespace.get(name, missing) for name in names}
    _live.add(token)
    namespace.update(parts)
    try:
        yield parts
    finally:
        _live.discard(token)
        for name, old in saved.items():
            if old is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = old
