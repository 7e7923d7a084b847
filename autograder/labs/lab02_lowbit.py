"""Lab 02's tests of the design part, a low-bit KV cache (LowBitKVCache, LowBitAttention): its bytes. Part of the
lab02 harness: lab02.py says what every test checks.

This is the measuring code, not an answer: how many bits, which scales and where they go are the student's design.

* **Bytes** (``held_bytes``): every tensor that the cache object holds, found through its attributes and the lists,
  tuples, dicts and plain objects inside them, each storage counted once and whole (a view of a larger tensor costs
  the larger tensor), scales and codes alike, over the cache's reserved positions, measured when it is made and
  again when it is full; against float32 K and V for the same positions (2 x layers x kv_heads x head_dim x 4
  bytes a position).  Nothing the cache says about itself is read.
* **Perplexity** (lab02_ppl.py, ``window_nlls``): each window of a text is one sequence, reserved as the engine
  reserves one (``kv.PerSequenceKV``: ``cache_class(config, len(window), dtype, device)``) and fed in chunks of
  ``CHUNK`` tokens through ``backend_class``, ``BATCH`` windows a pass, the model scoring every next token (teacher
  forcing).  From the second chunk on, a token attends to the stored low-bit K/V of the tokens before it, so the
  quantization error reaches the logits the way it would in decode.  ppl = exp(mean negative log-likelihood over
  every predicted token); the same path and the same arithmetic give the float32 cache's perplexity, which the test
  cells hold as literals.

A message names the shape or the text, the pass and the layer.  A hidden case's message says what the student's
code raised, never its text (which could carry what the hidden case fed it).
"""
from __future__ import annotations

import types
from types import SimpleNamespace

import numpy as np
import torch

from autograder import notebook_checks as checks
from autograder.labs.lab02_common import ANSWER_KEY, require_own_class
from miniengine import paths
from miniengine.attention import causal_attention
from miniengine.kv import PerSequenceKV

BYTES_LIMIT = 0.16      # KV bytes per reserved position, at most this fraction of float32's
PPL_LIMIT = 0.005       # perplexity at most +0.5% over the float32 cache's, on the same text through the same path
CHUNK = 32              # tokens a pass feeds of each window while a text is scored
BATCH = 16              # windows scored together, one sequence each
VISIBLE_TEXT = paths.GOLDEN / "kv_text.json"
# The design's answer key: the course's own caches and backends (ANSWER_KEY), and Lab 07's weight quantizers, whose
# packing and scales are Lab 07's to write.  While a design test runs, a call to any of them fails it.
DESIGN_KEY = dict(ANSWER_KEY, **{
    "miniengine.layers.quant": ["pack_int4", "unpack_int4", "_scales", "Int8PerChannel.quantize",
                                "Int8PerChannel.dequantize", "Int4GroupWise.quantize", "Int4GroupWise.dequantize"],
    "miniengine.course.quant_viz.formats": ["fake_quant"]})


def yours(fn, where, hidden, *args, **kwargs):
    """Call the student's code; an exception in it fails the test with where it happened."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise AssertionError(f"{where} raised {type(e).__name__}" + ("" if hidden else f": {e}")) from e


# ---------------------------------------------------------------- what a cache holds

def _parts(obj):
    """What obj holds: a container's items, or an object's attributes (__dict__ and __slots__); nothing for code."""
    if isinstance(obj, dict):
        return list(obj.keys()) + list(obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                        torch.dtype, torch.device, str)):
        return []
    found = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if hasattr(obj, name):
                found.append(getattr(obj, name))
    return found


def held_tensors(cache) -> list:
    """Every tensor (and numpy array, bytes object) reachable from the cache through _parts, each object once."""
    seen, found, todo, numbers = set(), [], [cache], 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, np.ndarray, bytes, bytearray)):
            found.append(obj)
            continue
        parts = _parts(obj)
        if isinstance(obj, (dict, list, tuple, set, frozenset)):
            numbers += sum(isinstance(x, (int, float, complex)) for x in parts)
        todo += parts
    # A store of Python numbers would escape the count: K/V and scales must live in tensors, which are counted.
    assert numbers <= 1024, (f"the cache holds {numbers:,} Python numbers in lists or dicts: keep K, V and their "
                             f"scales in tensors (the tests count every tensor's bytes)")
    return found


def held_bytes(cache) -> int:
    """Bytes of everything held_tensors finds, each storage counted once and whole."""
    storages, total = set(), 0
    for x in held_tensors(cache):
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            key, size = ("torch", x.device.type, storage.data_ptr()), storage.nbytes()
        elif isinstance(x, np.ndarray):
            while isinstance(x.base, np.ndarray):
                x = x.base
            key, size = ("numpy", id(x)), x.nbytes
        else:
            key, size = ("bytes", id(x)), len(x)
        if size and key not in storages:
            storages.add(key)
            total += size
    return total


def float32_bytes(config, positions: int) -> int:
    """What float32 K and V take for `positions` positions: the yardstick of the bytes ratio."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4 * positions


def check_bits_rejected(LowBitKVCache, config, what, hidden) -> None:
    """bits=0 and bits=99 are no design: the constructor must raise ValueError naming `bits`."""
    for bits in (0, 99):
        call = f"{what}: LowBitKVCache(config, 8, bits={bits})"
        try:
            LowBitKVCache(config, 8, torch.float32, "cpu", bits=bits)
        except ValueError as e:
            assert "bits" in str(e), f"{call} raised ValueError, but its message does not name `bits`"
        except TypeError as e:
            raise AssertionError(f"{call} raised TypeError{'' if hidden else f' ({e})'}: the constructor takes a "
                                 f"keyword argument bits, whose default is your design") from None
        except Exception as e:
            raise AssertionError(f"{call} raised {type(e).__name__}; expected ValueError naming `bits`") from None
        else:
            raise AssertionError(f"{call} should raise ValueError saying which bits your cache supports; it made a cache")


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


# ---------------------------------------------------------------- bytes, and attention close to exact

def fill(LowBitAttention, LowBitKVCache, config, max_lens, what, tolerance=0.25, hidden=False):
    """Fill caches of max_lens through the backend with random K/V in ragged passes (a prefill joining decodes), each
    layer's output within `tolerance` (relative) of exact attention over float K/V. Returns (the KV plug, the
    sequences, their caches full)."""
    kv = PerSequenceKV(LowBitKVCache, LowBitAttention, config, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(sum(max_lens))
    seqs = [allocated(kv, m, what, hidden) for m in max_lens]
    history = [[(torch.zeros(0, config.num_key_value_heads, config.head_dim),) * 2] * config.num_hidden_layers
               for _ in max_lens]  # each sequence's float K/V, layer by layer, for exact attention
    p = 0
    while any(s.kv.length < s.max_len for s in seqs):
        live = [i for i, s in enumerate(seqs) if s.kv.length < s.max_len and (i == 0 or p > 0)]  # 1 joins at pass 1
        before = [seqs[i].kv.length for i in live]
        feeds = [min(seqs[i].max_len - n, (1 if n else 9) if p < 3 else 32) for i, n in zip(live, before)]
        where = f"{what}, pass {p} (new tokens {feeds} at cache lengths {before})"
        backend, positions = new_pass(kv, [seqs[i] for i in live], feeds, where, hidden)
        checked = Checked(backend, where, hidden)
        for layer in range(config.num_hidden_layers):
            q = torch.randn(sum(feeds), config.num_attention_heads, config.head_dim, generator=gen)
            k, v = (torch.randn(sum(feeds), config.num_key_value_heads, config.head_dim, generator=gen) for _ in "kv")
            out, start = checked.attend(layer, q, k, v), 0
            for i, n in zip(live, feeds):
                rows = slice(start, start + n)
                keys, values = (torch.cat([old, new[rows]]) for old, new in zip(history[i][layer], (k, v)))
                history[i][layer] = (keys, values)
                exact = causal_attention(q[rows], keys, values, positions[rows], torch.arange(keys.shape[0]))
                error = float((out[rows] - exact).norm() / exact.norm())
                assert error <= tolerance, (
                    f"{where}, layer {layer}, sequence {i}: attend()'s output is {error:.0%} away from exact attention "
                    f"over the float K/V (relative error; at most {tolerance:.0%} for any sensible low-bit cache): "
                    f"check that each query sees all of its sequence's history, dequantized with the right scales")
                start += n
        advanced(backend, [seqs[i] for i in live], before, feeds, where, hidden)
        p += 1
    return kv, seqs


def expect_overflow(kv, seq, what) -> None:
    """One more token into a full cache must raise ValueError, as Task 2's write does."""
    c = kv.config
    try:
        backend = kv.backend([seq], [1])
        backend.positions("cpu")
        for layer in range(c.num_hidden_layers):
            kv_shape = (1, c.num_key_value_heads, c.head_dim)
            backend.attend(layer, torch.zeros(1, c.num_attention_heads, c.head_dim), torch.zeros(kv_shape),
                           torch.zeros(kv_shape))
    except ValueError:
        return
    except Exception as e:
        raise AssertionError(f"{what}: a token past max_len={seq.max_len} should raise ValueError, got "
                             f"{type(e).__name__}") from None
    raise AssertionError(f"{what}: a token past max_len={seq.max_len} should raise ValueError (it does not fit), "
                         f"but the pass went through")


def check_lowbit_bytes(LowBitKVCache, LowBitAttention, config, max_lens, what, hidden=False) -> float:
    """Caches of max_lens for `config`: bits=0/99 rejected; filled through the backend in ragged passes, attention
    close to exact; a token past max_len rejected; bytes held at most BYTES_LIMIT of float32's. Returns the ratio."""
    require_own_class(LowBitKVCache, "LowBitKVCache")
    require_own_class(LowBitAttention, "LowBitAttention")
    label = f"hidden case {what}" if hidden else what
    with checks.reference_forbidden("your low-bit cache", forbidden=DESIGN_KEY):
        check_bits_rejected(LowBitKVCache, config, label, hidden)
        kv = PerSequenceKV(LowBitKVCache, LowBitAttention, config, torch.float32, "cpu")
        empty = [held_bytes(allocated(kv, m, label, hidden).kv) for m in max_lens]
        kv, seqs = fill(LowBitAttention, LowBitKVCache, config, max_lens, label, hidden=hidden)
        expect_overflow(kv, seqs[0], label)
        worst = 0.0
        for m, before, seq in zip(max_lens, empty, seqs):
            held = max(before, held_bytes(seq.kv))
            ratio = held / float32_bytes(config, m)
            assert ratio <= BYTES_LIMIT, (
                f"{label}, max_len={m}: the cache holds {held:,} bytes, {ratio:.3f}x float32 K/V "
                f"({float32_bytes(config, m):,} bytes); the limit is {BYTES_LIMIT}x. Every tensor it holds counts, "
                f"scales included: {32 * ratio:.2f} bits a value, its code and its share of the scales")
            worst = max(worst, ratio)
    return worst
