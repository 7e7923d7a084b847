"""What a low-bit KV cache holds, in bytes: lab 02's design tests count it here. Part of the lab02 harness: lab02/__init__.py
says what every test checks, lab02/lowbit.py how the bytes are judged.

Nothing the cache says about itself is read: the count walks the objects themselves, and whatever it reaches counts.

* **What one cache holds** (``held_bytes``, ``held_tensors``): its attributes (``__dict__`` and ``__slots__``), the
  lists, tuples, sets, dicts and plain objects inside them, the attributes hung on its tensors themselves (a tensor's
  own ``__dict__``), the functions it holds (their closures, defaults, and the globals their code reads), numpy
  arrays (an object array's items too), bytes and arrays of the standard library.
* **What caches hold together** (``reachable_bytes``): all that, for every cache of a group made together, plus their
  classes' attributes and what the code of their classes (and of the backend's class) reads: each name of the code
  found among its module's globals, its closure cells, and the attributes of a module or class the code names
  (``POOL`` in ``self.rows`` -> ``POOL[rows]``, ``torch._pool``).  A store kept beside the cache, in the notebook's
  namespace or on a class, counts there.
* Each tensor storage counts once and whole (a view of a larger tensor costs the larger tensor), by its untyped
  storage's data pointer.  The walk stops at modules, classes and functions themselves (it reads only what the code
  names in them), at the course's own code, and at the target model's parameters and RoPE tables.
"""
from __future__ import annotations

import array
import dis
import functools
import types
import warnings

import numpy as np
import torch

CODE = (types.FunctionType, types.MethodType, functools.partial, property, staticmethod, classmethod)
OPAQUE = (str, bytes, bytearray, memoryview, array.array, int, float, complex, bool, type(None), torch.dtype,
          torch.device, torch.Size, types.ModuleType, types.BuiltinFunctionType, type)
GLOBAL_OPS = {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"}
ATTRIBUTE_OPS = {"LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR"}
MAX_NUMBERS = 1024  # Python numbers a cache may keep in lists and dicts (a store of K/V in them would escape the count)


def _notebook(obj) -> bool:
    """A function or class of the student's notebook (or made there), as opposed to the course's, torch's or Python's
    own code, whose globals are a module's."""
    if isinstance(obj, types.FunctionType):
        return obj.__globals__.get("__name__") in ("__main__", None)
    return getattr(obj, "__module__", None) in ("__main__", None)


def _code_names(code) -> tuple[set[str], set[str]]:
    """(the global names code reads or writes, the attribute names it reads or writes), nested code included."""
    names, attributes = set(), set()
    for ins in dis.get_instructions(code):
        if ins.opname in GLOBAL_OPS:
            names.add(ins.argval)
        elif ins.opname in ATTRIBUTE_OPS:
            attributes.add(ins.argval)
        elif isinstance(ins.argval, types.CodeType):  # comprehensions, lambdas and nested functions
            inner = _code_names(ins.argval)
            names, attributes = names | inner[0], attributes | inner[1]
    return names, attributes


def _code_parts(fn) -> list:
    """What running fn reads beyond its arguments: the globals its code names, the attributes it names of a module or
    class found there (``torch._pool``), its closure cells and defaults. Nothing for the course's, torch's or Python's
    own code."""
    if isinstance(fn, (staticmethod, classmethod)):
        return [fn.__func__]
    if isinstance(fn, property):
        return [f for f in (fn.fget, fn.fset, fn.fdel) if f is not None]
    if isinstance(fn, types.MethodType):
        return [fn.__func__, fn.__self__]
    if isinstance(fn, functools.partial):
        return [fn.func, *fn.args, *fn.keywords.values()]
    if not _notebook(fn):
        return []
    names, attributes = _code_names(fn.__code__)
    found = [fn.__globals__[n] for n in names if n in fn.__globals__]
    found += [c.cell_contents for c in fn.__closure__ or () if _has_contents(c)]
    found += list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    namespaces, seen = [x for x in found if isinstance(x, (types.ModuleType, type))], set()
    while namespaces:  # torch._pool, torch.nn._pool, Pool.store: what the code names, read from the namespace itself
        space = namespaces.pop()
        if id(space) in seen:
            continue
        seen.add(id(space))
        for n in attributes & set(vars(space)):
            value = vars(space)[n]
            (namespaces if isinstance(value, (types.ModuleType, type)) else found).append(value)
    return found


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _model_parameters(module: torch.nn.Module) -> set[int]:
    """The storages of the target model's own state, when the walk meets the model (not counted): its parameters and
    the RoPE tables it builds for itself on the first forward pass (``Llama._rope``, keyed by dtype and device)."""
    from miniengine.model import Llama

    if not isinstance(module, Llama):
        return set()
    with torch.device("meta"):
        names = {name for name, _ in Llama(module.config).named_parameters()}
    own = {p.untyped_storage().data_ptr() for name, p in module.named_parameters() if name in names}
    for key, tables in getattr(module, "_rope", {}).items():
        if (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], torch.dtype) and isinstance(tables, tuple)
                and all(isinstance(t, torch.Tensor) for t in tables)):
            own |= {t.untyped_storage().data_ptr() for t in tables}
    return own


def _attributes(obj) -> list:
    """An object's attributes: __dict__ and __slots__."""
    found = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                found.append(getattr(obj, name))
    return found


def _class_parts(klass) -> list:
    """A class's attributes (its code among them), for every class of its MRO but object."""
    return [value for k in klass.__mro__ if k is not object
            for name, value in vars(k).items() if name not in ("__dict__", "__weakref__", "__doc__", "__module__")]


class Walk:
    """Everything reachable from some roots, each object visited once: the tensors (and other buffers) found, and the
    Python numbers kept in containers."""

    def __init__(self, with_code: bool, max_numbers: int = MAX_NUMBERS):
        self.with_code, self.max_numbers = with_code, max_numbers
        self.seen, self.found, self.numbers, self.skip = set(), [], 0, set()

    def run(self, roots) -> "Walk":
        todo = list(roots)
        while todo:
            obj = todo.pop()
            if id(obj) in self.seen:
                continue
            self.seen.add(id(obj))
            todo += self.parts(obj)
        return self

    def parts(self, obj) -> list:
        if isinstance(obj, torch.Tensor):
            self.found.append(obj)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                grad = obj.grad if obj.is_leaf else None
            return list(vars(obj).values()) + ([grad] if grad is not None else [])
        if isinstance(obj, (np.ndarray, bytes, bytearray, memoryview, array.array, torch.UntypedStorage)):
            self.found.append(obj)
            return list(obj.ravel()) if isinstance(obj, np.ndarray) and obj.dtype == object else []
        if isinstance(obj, dict):
            self.numbers += sum(isinstance(x, (int, float, complex)) for x in obj.values())
            return list(obj.keys()) + list(obj.values())
        if isinstance(obj, (list, tuple, set, frozenset)):
            self.numbers += sum(isinstance(x, (int, float, complex)) for x in obj)
            return list(obj)
        if isinstance(obj, type):
            return _class_parts(obj) if self.with_code and _notebook(obj) else []
        if isinstance(obj, CODE):
            return _code_parts(obj)
        if isinstance(obj, OPAQUE):
            return []
        if isinstance(obj, torch.nn.Module):
            self.skip |= _model_parameters(obj)
        return _attributes(obj) + ([type(obj)] if self.with_code else [])

    def tensors(self) -> list:
        assert self.numbers <= self.max_numbers, (
            f"the cache holds {self.numbers:,} Python numbers in lists or dicts: keep K, V and their scales in tensors "
            f"(the tests count every tensor's bytes)")
        return self.found

    def bytes(self) -> int:
        storages, total = set(), 0
        for x in self.tensors():
            if isinstance(x, torch.Tensor):
                try:
                    storage = x.untyped_storage()
                except (RuntimeError, NotImplementedError):  # a sparse or nested tensor: its values, as laid out
                    key, size = ("tensor", id(x)), x.element_size() * x.numel()
                else:
                    key, size = ("torch", x.device.type, storage.data_ptr()), storage.nbytes()
                    if storage.data_ptr() in self.skip:
                        continue
            elif isinstance(x, torch.UntypedStorage):
                key, size = ("torch", x.device.type, x.data_ptr()), x.nbytes()
            elif isinstance(x, np.ndarray):
                while isinstance(x.base, np.ndarray):
                    x = x.base
                key, size = ("numpy", id(x)), x.nbytes
            elif isinstance(x, array.array):
                key, size = ("array", id(x)), x.itemsize * len(x)
            else:
                key, size = ("bytes", id(x)), memoryview(x).nbytes
            if size and key not in storages:
                storages.add(key)
                total += size
        return total


def held_tensors(cache) -> list:
    """Every tensor (and numpy array, bytes object) one cache holds (see the module's doc), each object once."""
    return Walk(with_code=False).run([cache]).tensors()


def held_bytes(cache) -> int:
    """Bytes of everything one cache holds, each storage counted once and whole."""
    return Walk(with_code=False).run([cache]).bytes()


def reachable_bytes(caches, backend_class=None) -> int:
    """Bytes of everything the caches hold together, with what their classes (and the backend's class) hold and their
    code reads: each storage counted once and whole, however many caches reach it."""
    roots = list(caches) + [type(c) for c in caches] + ([backend_class] if backend_class is not None else [])
    return Walk(with_code=True, max_numbers=MAX_NUMBERS * max(1, len(caches))).run(roots).bytes()
