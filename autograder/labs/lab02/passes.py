"""Lab 02's design tests, one pass at a time: the engine's calls into the student's LowBitAttention, each checked,
and a text scored through the model in chunks (``window_nlls``). Part of the lab02 harness: lab02/__init__.py says what every
test checks, lab02/lowbit.py how the bytes and the perplexity are measured.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from autograder import notebook_checks as checks
from miniengine.kv import PerSequenceKV

CHUNK = 32              # tokens a pass feeds of each window while a text is scored
BATCH = 16              # windows scored together, one sequence each


def yours(fn, where, hidden, *args, **kwargs):
    """Call the student's code; an exception in it fails the test with where it happened."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise AssertionError(f"{where} raised {type(e).__name__}" + ("" if hidden else f": {e}")) from e


# ---------------------------------------------------------------- one pass through the student's backend

class Checked:
    """The student's backend, every attend() checked (what it raises, its shape, dtype, finiteness), naming the pass
    and the layer."""

    def __init__(self, backend, where, hidden=False):
        self.backend, self.where, self.hidden = backend, where, hidden

    def positions(self, device="cpu"):
        return self.backend.positions(device)

    def attend(self, layer, q, k, v):
        where = f"{self.where}, layer {layer}"
        out = yours(self.backend.attend, f"{where}: attend()", self.hidden, layer, q, k, v)
        assert isinstance(out, torch.Tensor), f"{where}: attend() returned {type(out).__name__}, expected a tensor"
        assert tuple(out.shape) == tuple(q.shape), (
            f"{where}: attend() returned shape {list(out.shape)}, expected {list(q.shape)} (q's shape: this pass's "
            f"tokens, query heads, head_dim)")
        assert out.dtype == q.dtype, f"{where}: attend() returned {out.dtype}, expected q's dtype {q.dtype}"
        assert bool(torch.isfinite(out).all()), f"{where}: attend() returned NaN or inf"
        return out

    def advance(self):
        self.backend.advance()


def new_pass(kv, seqs, feeds, where, hidden=False):
    """The engine's calls before a forward pass: backend_class(caches, new_tokens), then positions()."""
    backend = yours(kv.backend, f"{where}: LowBitAttention(caches, {feeds})", hidden, seqs, feeds)
    got = checks.as_tokens(yours(backend.positions, f"{where}: positions()", hidden, "cpu"), f"{where}: positions()")
    want = [p for s, n in zip(seqs, feeds) for p in range(s.kv.length, s.kv.length + n)]
    assert got == want, f"{where}: positions() should be {want[:8]}{'...' if len(want) > 8 else ''}, got {got[:8]}"
    return backend, torch.tensor(want)


def advanced(backend, seqs, before, feeds, where, hidden=False):
    yours(backend.advance, f"{where}: advance()", hidden)
    after = [checks.as_count(s.kv.length, f"{where}: cache.length") for s in seqs]
    want = [b + n for b, n in zip(before, feeds)]
    assert after == want, f"{where}: after advance() the caches' lengths should be {want}, got {after}"


def allocated(kv, max_len, what, hidden):
    """A sequence of max_len positions with its cache, made as the engine makes it when it admits a request."""
    seq = SimpleNamespace(max_len=max_len, kv=None)
    yours(kv.allocate, f"{what}: LowBitKVCache(config, max_len={max_len}, dtype, device)", hidden, seq)
    return seq



@torch.no_grad()
def window_nlls(cache_class, backend_class, model, windows, what, chunk=CHUNK, batch=BATCH, hidden=False,
                watch=None) -> list[float]:
    """Each window's mean negative log-likelihood of its next tokens, fed in chunks through the KV plug (module doc):
    `batch` windows at a time, one sequence each, as the engine batches the sequences it runs. `watch(seqs,
    moment)` is called when a batch's caches are made and when they are full."""
    for name, value in (("chunk", chunk), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not windows or any(len(w) < 2 for w in windows):
        raise ValueError("windows: give at least one window of at least 2 token ids")
    kv = PerSequenceKV(cache_class, backend_class, model.config, model.dtype, model.device)
    nlls = []
    for first in range(0, len(windows), batch):
        group = [torch.tensor(ids, device=model.device) for ids in windows[first:first + batch]]
        where = f"{what}, windows {first}..{first + len(group) - 1}"
        seqs = [allocated(kv, len(ids), where, hidden) for ids in group]
        if watch:
            watch(seqs, "made")
        totals = [0.0] * len(group)
        for p, start in enumerate(range(0, max(len(ids) for ids in group), chunk)):
            live = [i for i, ids in enumerate(group) if start < len(ids)]
            feeds = [min(chunk, len(group[i]) - start) for i in live]
            at = f"{where}, pass {p} (positions {start}..{start + max(feeds) - 1})"
            backend, positions = new_pass(kv, [seqs[i] for i in live], feeds, at, hidden)
            tokens = torch.cat([group[i][start:start + n] for i, n in zip(live, feeds)])
            logits = model(tokens, positions.to(model.device), Checked(backend, at, hidden))
            advanced(backend, [seqs[i] for i in live], [start] * len(live), feeds, at, hidden)
            row = 0
            for i, n in zip(live, feeds):
                targets = group[i][start + 1:start + n + 1]
                logp = torch.log_softmax(logits[row:row + len(targets)].double(), dim=-1)
                totals[i] -= float(logp[torch.arange(len(targets)), targets].sum())
                row += n
        if watch:
            watch(seqs, "full")
        nlls += [total / (len(ids) - 1) for total, ids in zip(totals, group)]
    return nlls
