"""Lab 02's tests (the KV cache): what each test cell checks, task by task.

Every test first turns your results into plain ints and lists (so an object that claims to equal anything cannot
pass), fails if your code calls the course's own KV cache, backend or decoders (ANSWER_KEY below), and compares
with the golden runs stored in data/golden/visible.json or with values derived from the formula the task states.
The hidden tests run the same checks on configs and prompts you have not seen; where they need the reference's
tokens, they only report yours, and the grader compares them outside your notebook.

Task 1, kv_bytes_per_token (kv-bytes-visible, kv-bytes-hidden): the bytes one token adds to the cache, for bare
  configs (only LlamaConfig's shape fields): the tiny target model, Llama-3-8B, and others with grouped-query and
  multi-query attention, at several bytes per value. A wrong answer gets a guess at the mistake. The hidden cell
  holds its configs only: the grader compares your answers with the right ones outside your notebook.
Task 2, ContiguousKVCache (cache-visible, cache-hidden): the shapes and dtype of k and v; bytes_used and
  bytes_reserved as properties; each write lands at [layer, start:start+n] and changes nothing else, not even
  length; a write that does not fit raises ValueError before it writes anything.
Task 3, CachedAttention (backend-visible, backend-hidden): positions() and advance(); then forward passes, fed the
  golden tokens, of one sequence and of a batch mixing decodes and a prefill: the logits must match the golden
  runs' within 1e-4. ContiguousKVCache is the course's while it runs. Hidden: a larger batch, each sequence on
  its own tokens, until every one ends.
Task 4, cached_decode (decode-visible, decode-steps-visible, decode-hidden): one visible run of each kind, token
  for token, with the chosen tokens' logits and tokens processed = Lp + Lo - 1; the prompt fed once, then exactly
  one token per step at its position; stopping right after the end-of-text token; max_tokens. Both classes are
  the course's while it runs.
Task 5, your engine (engine-visible, engine-hidden): LLM on your ContiguousKVCache and CachedAttention serves every
  golden case, four requests at a time, token for token, feeding Lp + Lo - 1 tokens for each.
Task 6, the design part, a low-bit KV cache (design-kv-bytes-visible/-hidden, design-kv-ppl-visible/-hidden):
  bytes: bits=0 and bits=99 rejected with a ValueError naming bits; caches made with the engine's own LlamaConfig,
  filled through LowBitAttention in ragged passes of random K/V (a prefill joining decodes), each layer's output
  within 25% of exact attention; a token past max_len rejected; for the tiny model, the caches that score visible
  windows through the model as the perplexity test does; everything each cache holds, and everything the caches
  reach together through their classes and their code's globals, counted by the tests, against float32 K/V: full
  points at 0.20x or less, none at the int8 baseline's 0.281x, a linear share between. Perplexity: a text fed
  through the KV plug in chunks (every next token scored), against the float32 cache's on the same text through
  the same path (measured by the tests where the cell does not give it): full points at +1.0% or less, none from
  +1.5%, a linear share between; the attention must read what the cache holds (zeroing it must change the logits).
  A missed target is printed with its share, not raised: the grader gives the share. The tiny model's shape and
  visible text; hidden: other shapes, a hidden text of the same kind.
The numbers (numbers-visible, numbers-hidden): each answer of the numbers cell defined and a plain number of the
  right kind; the hidden cell holds only each answer's tolerance: the grader compares the values.

Every check observes what it measured (checks.observe): your outputs, and each design measure with its bound; the
grader judges them against the answer sheet, outside your notebook's kernel.

Tasks 3-5 live in lab02/backend.py and lab02/decode.py, Task 6 in lab02/lowbit.py (how bytes and perplexity are
measured), lab02/held.py (what a cache holds), lab02/passes.py (one pass, and a text scored) and lab02/ppl.py, and
what they all share (the answer key among it) in lab02/common.py: this file reloads them, and the test cells call
every check from here, as lab.check_...
"""
from __future__ import annotations

import importlib
import json
import math
import numbers
from types import SimpleNamespace

import torch

from autograder import notebook_checks as checks
from autograder.labs.lab02 import (backend as lab02_backend, common as lab02_common, decode as lab02_decode,  # noqa: E402
                                   held as lab02_held, lowbit as lab02_lowbit, passes as lab02_passes, ppl as lab02_ppl)

# pristine reloads only this module: the parts are reloaded here, shared part first, each time this one is.
lab02_common = importlib.reload(lab02_common)
lab02_backend, lab02_decode = importlib.reload(lab02_backend), importlib.reload(lab02_decode)
lab02_held, lab02_passes = importlib.reload(lab02_held), importlib.reload(lab02_passes)
lab02_lowbit = importlib.reload(lab02_lowbit)
lab02_ppl = importlib.reload(lab02_ppl)
from autograder.labs.lab02.backend import check_backend, report_backend  # noqa: E402, F401
from autograder.labs.lab02.common import ANSWER_KEY, ENGINE_KEY, require_own_class  # noqa: E402, F401
from autograder.labs.lab02.decode import check_decode, check_decode_steps, check_engine, report_decode, report_engine
from autograder.labs.lab02.lowbit import (BYTES_BASELINE, BYTES_LIMIT, PPL_BASELINE, PPL_LIMIT, check_lowbit_bytes,  # noqa: E402
                                          engine_config, float32_bytes, held_bytes, reachable_bytes)
from autograder.labs.lab02.ppl import check_lowbit_ppl, golden_agreement, measure_lowbit, visible_text, window_nlls

# ---------------------------------------------------------------- Task 1: kv_bytes_per_token

def bare_config(layers, heads, kv_heads, head_dim):
    """Only the shape fields of a config (LlamaConfig's names): no methods to lean on."""
    return SimpleNamespace(num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                           head_dim=head_dim, hidden_size=heads * head_dim)


def target_config():
    """The tiny target model's shape, read from its config.json, as a bare config."""
    with open(checks.TARGET / "config.json") as f:
        tiny = json.load(f)
    return bare_config(tiny["num_hidden_layers"], tiny["num_attention_heads"], tiny["num_key_value_heads"],
                       tiny["hidden_size"] // tiny["num_attention_heads"])


def kv_hint(got, c, bpv):
    """A guess at the mistake behind a wrong answer, for the message."""
    right = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * bpv
    guesses = {right // bpv: " (multiply by bytes_per_value)",
               right // c.num_key_value_heads * c.num_attention_heads: " (only the KV heads are stored: num_key_value_heads)",
               right // 2: " (did you forget the factor 2: a key AND a value?)"}
    return guesses.get(got, "") if got != right else ""


def check_kv_bytes(kv_bytes_per_token, cases, hidden=False) -> None:
    """cases: (what the config is, the config, bytes per value, the expected bytes per token); a hidden case is (what,
    the config, bytes per value) alone: its answer stays with the grader, which compares yours outside the kernel."""
    checks.require_own(kv_bytes_per_token, "kv_bytes_per_token")
    with checks.reference_forbidden("kv_bytes_per_token", forbidden=ANSWER_KEY):
        for what, c, bpv, *want in cases:
            call = f"{'hidden case: ' if hidden else ''}kv_bytes_per_token({what}, {bpv})"
            got = checks.as_count(kv_bytes_per_token(c, bpv), call)
            if want:
                assert got == want[0], (f"kv_bytes_per_token for {what} at {bpv} bytes per value: expected "
                                        f"{want[0]:,} bytes per token, got {got:,}{kv_hint(got, c, bpv)}")
            checks.observe(call, got, **({"expect": want[0]} if want else {}))


# ---------------------------------------------------------------- Task 2: ContiguousKVCache

def byte_count(cache, name):
    value = getattr(cache, name)
    assert not callable(value), f"cache.{name} should be a number: put @property above `def {name}(self)`"
    return checks.as_count(value, f"cache.{name}")


def expect_overflow(cache, layer, start, n, what):
    """write() of n tokens at start must raise ValueError and leave the cache as it was."""
    shape = (n,) + tuple(cache.k.shape[2:])
    before_k, before_v = cache.k.clone(), cache.v.clone()
    try:
        cache.write(layer, start, torch.ones(shape, dtype=cache.k.dtype), torch.ones(shape, dtype=cache.v.dtype))
    except ValueError:
        pass
    except Exception as e:
        raise AssertionError(f"{what}: expected ValueError, got {type(e).__name__}: {e}") from None
    else:
        raise AssertionError(f"{what}: expected ValueError (the positions do not fit), but write() returned")
    assert torch.equal(cache.k, before_k) and torch.equal(cache.v, before_v), (
        f"{what}: raised ValueError, but only after writing part of the data; check before you write")
    checks.observe(f"{what}: raises ValueError and writes nothing", True, expect=True)


def check_write(cache, layer, start, n, what):
    """Write random K/V for n tokens; they must land at [layer, start:start+n], and nothing else may change."""
    shape = (n,) + tuple(cache.k.shape[2:])
    k_new, v_new = torch.randn(shape).to(cache.k.dtype), torch.randn(shape).to(cache.v.dtype)
    before_k, before_v, before_len = cache.k.clone(), cache.v.clone(), cache.length
    cache.write(layer, start, k_new, v_new)
    assert torch.equal(cache.k[layer, start:start + n], k_new) and torch.equal(cache.v[layer, start:start + n], v_new), (
        f"{what}: after write({layer}, {start}, k, v) with {n} tokens, cache.k[{layer}, {start}:{start + n}] and "
        f"cache.v[{layer}, {start}:{start + n}] should hold k and v")
    before_k[layer, start:start + n], before_v[layer, start:start + n] = k_new, v_new
    assert torch.equal(cache.k, before_k) and torch.equal(cache.v, before_v), (
        f"{what}: write({layer}, {start}, ...) of {n} tokens changed entries outside layer {layer}, "
        f"positions {start}..{start + n - 1}")
    assert cache.length == before_len, (
        f"{what}: write() changed cache.length from {before_len} to {cache.length}; only the backend's advance() may")
    checks.observe(f"{what}: write({layer}, {start}, k, v) of {n} tokens lands there alone, length unchanged", True,
                   expect=True)


def check_cache_on_target(ContiguousKVCache) -> int:
    """The target model's config, max_len=10, float32 by default: shapes, an empty cache, bytes_reserved; a prefill of
    3 tokens into layer 2, one decode token after them, 3 tokens that exactly fill the last slots of the last layer;
    bytes at length 4; two writes that do not fit. Then bf16 at max_len=6. Returns the bytes per position."""
    require_own_class(ContiguousKVCache, "ContiguousKVCache")
    with checks.reference_forbidden("ContiguousKVCache", forbidden=ANSWER_KEY):
        c = checks.load_model().config
        layers, kv_heads, head_dim = c.num_hidden_layers, c.num_key_value_heads, c.head_dim
        per_token = 2 * layers * kv_heads * head_dim * 4
        cache = ContiguousKVCache(c, 10)
        shape = [layers, 10, kv_heads, head_dim]
        for name in ("k", "v"):
            t = getattr(cache, name)
            assert isinstance(t, torch.Tensor), f"cache.{name} should be a torch.Tensor, got {type(t).__name__}"
            assert list(t.shape) == shape, (
                f"ContiguousKVCache(config, max_len=10).{name} should have shape [layers, max_len, kv_heads, head_dim] = "
                f"{tuple(shape)}, got {tuple(t.shape)}")
            assert t.dtype == torch.float32, f"the default dtype should be torch.float32, got {t.dtype}"
        checks.observe("ContiguousKVCache(config, 10): k's and v's shapes and dtypes",
                       [[list(t.shape), str(t.dtype)] for t in (cache.k, cache.v)], expect=[[shape, "torch.float32"]] * 2)
        new = [checks.as_count(cache.max_len, "cache.max_len"), checks.as_count(cache.length, "cache.length"),
               byte_count(cache, "bytes_used")]
        assert new[0] == 10
        assert new[1] == 0, f"a new cache should have length 0, got {cache.length}"
        assert new[2] == 0, f"an empty cache uses 0 bytes, got {cache.bytes_used}"
        got = byte_count(cache, "bytes_reserved")
        assert got == 10 * per_token, (f"bytes_reserved of a float32 cache of 10 positions: expected 10 x {per_token:,} "
                                       f"= {10 * per_token:,} (K and V, all layers), got {got:,}")
        checks.observe("ContiguousKVCache(config, 10): max_len, length, bytes_used, bytes_reserved", new + [got],
                       expect=[10, 0, 0, 10 * per_token])
        for layer, start, n in ((2, 0, 3), (2, 3, 1), (layers - 1, 7, 3)):
            check_write(cache, layer, start, n, "a float32 cache of max_len=10")
        cache.length = 4
        got = [byte_count(cache, "bytes_used"), byte_count(cache, "bytes_reserved")]
        assert got[0] == 4 * per_token, f"bytes_used with length=4: expected 4 x {per_token:,} = {4 * per_token:,}, got {got[0]:,}"
        assert got[1] == 10 * per_token, "bytes_reserved must not depend on length"
        checks.observe("ContiguousKVCache(config, 10) at length 4: bytes_used, bytes_reserved", got,
                       expect=[4 * per_token, 10 * per_token])
        expect_overflow(cache, 0, 8, 3, "write(layer=0, start=8, 3 tokens) into max_len=10 (positions 8, 9, 10)")
        expect_overflow(cache, 0, 10, 1, "write(layer=0, start=10, 1 token) into max_len=10")
        half = ContiguousKVCache(c, 6, dtype=torch.bfloat16)
        assert half.k.dtype == half.v.dtype == torch.bfloat16, f"dtype=torch.bfloat16 should give bf16 tensors, got {half.k.dtype}"
        got = byte_count(half, "bytes_reserved")
        assert got == 6 * per_token // 2, (f"a bf16 cache stores 2 bytes per value: bytes_reserved for 6 positions should be "
                                           f"{6 * per_token // 2:,}, got {got:,}")
        checks.observe("ContiguousKVCache(config, 6, dtype=torch.bfloat16): k's and v's dtypes, bytes_reserved",
                       [str(half.k.dtype), str(half.v.dtype), got], expect=["torch.bfloat16", "torch.bfloat16",
                                                                            6 * per_token // 2])
    return per_token


def check_cache(ContiguousKVCache, config, max_len, dtype, bytes_per_value, writes, overflows, lengths, what,
                hidden=False) -> None:
    """A cache of `max_len` positions in `dtype` for a bare config: shapes, bytes_reserved, each write
    (layer, start, n tokens), each overflow (a write that does not fit), bytes_used at each length."""
    require_own_class(ContiguousKVCache, "ContiguousKVCache")
    with checks.reference_forbidden("ContiguousKVCache", forbidden=ANSWER_KEY):
        cache = ContiguousKVCache(config, max_len, dtype=dtype)
        shape = (config.num_hidden_layers, max_len, config.num_key_value_heads, config.head_dim)
        assert tuple(cache.k.shape) == tuple(cache.v.shape) == shape and cache.k.dtype == dtype, (
            f"{what}: expected k and v of shape {shape} and dtype {dtype}, got {tuple(cache.k.shape)} {cache.k.dtype}")
        per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * bytes_per_value
        reserved = byte_count(cache, "bytes_reserved")
        assert reserved == max_len * per_token, (f"{what}: bytes_reserved is wrong (got {reserved})" if hidden else
                                                 f"{what}: bytes_reserved should be {max_len * per_token}")
        expect = (lambda value: {}) if hidden else (lambda value: {"expect": value})  # hidden: the sheet's values
        checks.observe(f"{what}: k's and v's shapes, dtype, bytes_reserved",
                       [list(cache.k.shape), list(cache.v.shape), str(cache.k.dtype), reserved],
                       **expect([list(shape), list(shape), str(dtype), max_len * per_token]))
        for layer, start, n in writes:
            check_write(cache, layer, start, n, what)
        for layer, start, n in overflows:
            expect_overflow(cache, layer, start, n, f"{what}: write {f'of {n} tokens ' if n > 1 else ''}at start={start}")
        used = []
        for length in lengths:
            cache.length = length
            used.append(byte_count(cache, "bytes_used"))
            assert used[-1] == length * per_token, (f"{what}: bytes_used at length={length} is wrong (got {used[-1]})"
                                                    if hidden else f"{what}: bytes_used at length={length} should be "
                                                    f"{length * per_token}")
        checks.observe(f"{what}: bytes_used at lengths {list(lengths)}", used, **expect([n * per_token for n in lengths]))


# ---------------------------------------------------------------- the numbers

def as_number(value, name):
    assert isinstance(value, numbers.Real) and not isinstance(value, bool), (
        f"{name} should be a plain number (int or float), got {type(value).__name__}: set it in the numbers cell")
    value = float(value)
    assert math.isfinite(value), f"{name} should be a finite number, got {value}"
    return value


def check_numbers(ns, kinds) -> None:
    """kinds: {name: (int or float, low, high)}: each answer defined, a plain number of that kind within a range
    that any sensible answer lies in. Whether it is right is checked when the notebook is graded (numbers-hidden)."""
    for name, (kind, low, high) in kinds.items():
        assert name in ns, f"{name} is not defined: give it a value in the numbers cell"
        value = as_number(ns[name], name)
        assert kind is float or value.is_integer(), f"{name} counts something: expected a whole number, got {value}"
        assert low <= value <= high, f"{name} = {value:g} is not a sensible answer (it should lie in [{low:g}, {high:g}])"
        checks.observe(f"{name} is a plain {kind.__name__} in [{low:g}, {high:g}]", True, expect=True)


def report_numbers(ns, tolerances) -> None:
    """Hidden: each answer's value, {name: relative tolerance} (0: a count, exact). The grader compares it with the
    right value, which never enters the notebook; the message names the answers that are not numbers."""
    values, wrong = {}, []
    for name in tolerances:
        try:
            values[name] = as_number(ns.get(name), name)
        except AssertionError:
            wrong.append(f"{name} (not a number)")
    assert not wrong, f"hidden case the numbers: {len(wrong)} of {len(tolerances)} answers are off: {', '.join(wrong)}"
    for name, tolerance in tolerances.items():
        checks.observe(f"{name} ({'exact' if tolerance == 0 else f'within {100 * tolerance:g}%'})", values[name],
                       rel=tolerance)
