"""A CPU stand-in for ``torch.cuda.CUDAGraph``: the captured step's Python runs once, replay runs only its ops.

A CUDA graph records the kernels a step launches and replays them on the same memory; the Python that
launched them never runs again.  A step that keeps a value in a Python variable (a length, a position, a
branch taken at capture) replays with that value frozen, and one that reads a tensor on the host during
capture (``.item()``, ``bool(t)``, a boolean index, ``torch.tensor(list)``) cannot be captured at all.

``ReplayGraph`` reproduces both on the CPU.  Under a ``TorchDispatchMode`` it records every aten op of the
captured function with its arguments, refusing the host reads above.  ``replay()`` re-runs that op list alone:
tensors made inside the capture come from the replayed ops, tensors from outside (weights, the KV pool, the
static input buffers) are the same objects, read afresh.  Tensors the caller kept from the capture (the
static output) receive the replayed values, as a real graph's output memory would.

``emulate_cuda_graphs(monkeypatch)`` puts it, with no-op streams, where ``engine/cuda_graphs.py`` looks for
``torch.cuda``, so that ``DecodeGraphs(..., capture=True)`` runs its own capture code on the CPU.
"""
from __future__ import annotations

import contextlib
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten

# Ops that read a tensor's values on the host: inside a real capture they fail (a sync or a pageable copy).
HOST_READS = {
    aten.item.default: ".item(), int(), float() or bool() of a tensor (an `if` on its value)",
    aten._local_scalar_dense.default: ".item(), int(), float() or bool() of a tensor (an `if` on its value)",
    aten.is_nonzero.default: ".item(), int(), float() or bool() of a tensor (an `if` on its value)",
    aten.resolve_conj.default: ".tolist() or .numpy()",
    aten.resolve_neg.default: ".tolist() or .numpy()",
    aten.lift_fresh.default: "torch.tensor(...) of host data",
    aten.nonzero.default: "nonzero(): an output shape that depends on the data",
    aten.masked_select.default: "masked_select: an output shape that depends on the data",
}


class CaptureError(RuntimeError):
    pass


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: "ReplayGraph"):
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise CaptureError(f"a captured step may not use {HOST_READS[func]} ({func})")
        if func is aten.index.Tensor and any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            raise CaptureError("a captured step may not index with a boolean mask: its shape depends on the data")
        out = func(*args, **kwargs)
        self.graph._record(func, args, kwargs, out)
        return out


class _Slot(int):
    """An argument made inside the capture: the index of the replayed op output that stands for it."""


class ReplayGraph:
    """Records the ops of ``with emulated_graph(g): ...``; ``g.replay()`` re-runs them, no Python in between."""

    def __init__(self):
        self.ops = []       # (func, args, kwargs, output slots): tensors in args are a _Slot or the tensor itself
        self.refs = []      # slot -> weakref to the tensor the capture made
        self._slot = {}     # id(tensor) -> slot, checked against refs (ids are reused after a tensor dies)
        self.replays = 0

    def _encode(self, x):
        if isinstance(x, torch.Tensor):
            slot = self._slot.get(id(x))
            if slot is not None and self.refs[slot]() is x:
                return _Slot(slot)
        return x  # from outside the capture: the same object at every replay

    def _record(self, func, args, kwargs, out):
        args, kwargs = tree_map(self._encode, (args, kwargs))
        slots = []
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._slot[id(t)] = len(self.refs)
                slots.append(len(self.refs))
                self.refs.append(weakref.ref(t))
        self.ops.append((func, args, kwargs, slots))

    def replay(self) -> None:
        values = [None] * len(self.refs)

        def decode(x):
            return values[x] if isinstance(x, _Slot) else x

        with torch.inference_mode():
            for func, args, kwargs, slots in self.ops:
                a, k = tree_map(decode, (args, kwargs))
                outs = [t for t in tree_flatten(func(*a, **k))[0] if isinstance(t, torch.Tensor)]
                for slot, t in zip(slots, outs):
                    values[slot] = t
            for ref, new in zip(self.refs, values):  # the capture's tensors still held: the graph's static outputs
                old = ref()
                if old is not None and new is not old:
                    old.copy_(new)
        self.replays += 1

    def pool(self):
        return ("pool", id(self))


@contextlib.contextmanager
def emulated_graph(graph: ReplayGraph, pool=None, stream=None):
    with _Recorder(graph):
        yield


class _Stream:
    def wait_stream(self, other):
        pass


def emulate_cuda_graphs(monkeypatch) -> None:
    """Patch what ``engine/cuda_graphs.py`` uses of ``torch.cuda`` with the stand-ins above."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", ReplayGraph)
    monkeypatch.setattr(torch.cuda, "graph", emulated_graph)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
