"""Lab 02's tests of the design part, a low-bit KV cache (LowBitKVCache, LowBitAttention): its bytes. Part of the
lab02 harness: lab02/__init__.py says what every test checks.

This is the measuring code, not an answer: how many bits, which scales and where they go are the student's design.

* **The caches measured** are made as the engine makes them (``kv.PerSequenceKV``: ``cache_class(config, max_len,
  dtype, device)``) with the engine's own config class (miniengine's ``LlamaConfig``: the target model's as
  ``load_model`` reads it, or one of another shape), and used: filled through ``backend_class`` in ragged passes of
  random K/V (``fill``), and, for the target model, fed a text through the model exactly as the perplexity test
  feeds it (``window_nlls``).  So the caches whose bytes count are made and used as the ones that give the
  perplexity.
* **Bytes** (lab02/held.py): everything each cache holds (its attributes, containers, tensors and what hangs on
  them), and everything the caches made together reach with their classes and the globals their code reads (a
  store kept beside the caches counts there), each storage counted once and whole, scales and codes alike, when
  the caches are made and again when they are full; against float32 K and V for the same positions
  (2 x layers x kv_heads x head_dim x 4 bytes a position).  Nothing the cache says about itself is read.
* **Perplexity** (``window_nlls``, lab02/passes.py; the check in lab02/ppl.py): each window of a text is one
  sequence, reserved as the engine reserves one and fed in chunks of ``CHUNK`` tokens through ``backend_class``,
  ``BATCH`` windows a pass, the model scoring every next token (teacher forcing).  From the second chunk on, a token
  attends to the stored low-bit K/V of the tokens before it, so the quantization error reaches the logits the way it
  would in decode.  ppl = exp(mean negative log-likelihood over every predicted token); the same path and the same
  arithmetic give the float32 cache's perplexity (lab02/ppl.py).

Each measure is observed with its bound (``checks.observe``), and the grader judges it outside the kernel.  A
message names the shape or the text, the pass and the layer.  A hidden case's message says what the student's code
raised, never its text (which could carry what the hidden case fed it).
"""
from __future__ import annotations

import torch

from autograder import notebook_checks as checks
from autograder.labs.lab02.common import ANSWER_KEY, require_own_class
from autograder.labs.lab02.held import held_bytes, held_tensors, reachable_bytes  # noqa: F401
from autograder.labs.lab02.passes import BATCH, CHUNK, Checked, advanced, allocated, new_pass, window_nlls, yours
from miniengine import paths
from miniengine.attention import causal_attention
from miniengine.kv import PerSequenceKV

# The design targets, set from the honest designs measured in autograder/qa/design/lab02.py (its table), and the
# values at which a target earns nothing (partial credit between: notebook_checks/ledger.py, credit).
BYTES_LIMIT = 0.20      # KV bytes per reserved position, at most this fraction of float32's: 6.4 bits a value
BYTES_BASELINE = 0.28125  # the course's baseline, int8 with a float32 scale per token and head: 9 bits a value
PPL_LIMIT = 0.01        # perplexity at most +1% over the float32 cache's, on the same text through the same path
PPL_BASELINE = 0.015    # +1.5%: no perplexity points from here on, where the naive int4 cache (one scale per
                        # tensor) lands; int3 and int2 caches land beyond it
ATTENTION_TOLERANCE = 0.25  # attend()'s output on random K/V, relative to exact attention: any sensible low-bit cache
VISIBLE_TEXT = paths.GOLDEN / "kv_text.json"
# The design's answer key: the course's own caches and backends (ANSWER_KEY), and Lab 07's weight quantizers, whose
# packing and scales are Lab 07's to write.  While a design test runs, a call to any of them fails it.
DESIGN_KEY = dict(ANSWER_KEY, **{
    "miniengine.layers.quant": ["pack_int4", "unpack_int4", "_scales", "Int8PerChannel.quantize",
                                "Int8PerChannel.dequantize", "Int4GroupWise.quantize", "Int4GroupWise.dequantize"],
    "miniengine.course.quant_viz.formats": ["fake_quant"]})


# ---------------------------------------------------------------- the caches measured

def engine_config(layers=None, heads=None, kv_heads=None, head_dim=None):
    """The engine's own config class: the target model's LlamaConfig, read as load_model reads it (no arguments),
    or a LlamaConfig of the given shape (its other fields the class's defaults)."""
    from miniengine.model import LlamaConfig, load_config

    if layers is None:
        return load_config(checks.TARGET)
    return LlamaConfig(hidden_size=heads * head_dim, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads)


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
            checks.observe(f"{call}: raises ValueError naming bits", True, expect=True)
        except TypeError as e:
            raise AssertionError(f"{call} raised TypeError{'' if hidden else f' ({e})'}: the constructor takes a "
                                 f"keyword argument bits, whose default is your design") from None
        except Exception as e:
            raise AssertionError(f"{call} raised {type(e).__name__}; expected ValueError naming `bits`") from None
        else:
            raise AssertionError(f"{call} should raise ValueError saying which bits your cache supports; it made a cache")


# ---------------------------------------------------------------- bytes, and attention close to exact

def fill(LowBitAttention, LowBitKVCache, config, max_lens, what, tolerance=ATTENTION_TOLERANCE, hidden=False, watch=None, record=None):
    """Fill caches of max_lens through the backend with random K/V in ragged passes (a prefill joining decodes), each
    layer's output within `tolerance` (relative) of exact attention over float K/V. Returns (the KV plug, the
    sequences, their caches full). `watch(seqs, moment)` is called when the caches are made and when they are full;
    `record` (a dict) gets what was measured: the caches' lengths after each pass, the largest relative error."""
    kv = PerSequenceKV(LowBitKVCache, LowBitAttention, config, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(sum(max_lens))
    seqs = [allocated(kv, m, what, hidden) for m in max_lens]
    if watch:
        watch(seqs, "made")
    history = [[(torch.zeros(0, config.num_key_value_heads, config.head_dim),) * 2] * config.num_hidden_layers
               for _ in max_lens]  # each sequence's float K/V, layer by layer, for exact attention
    p, measured = 0, record if record is not None else {}
    measured.update(lengths=[], error=0.0)
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
                measured["error"] = max(measured["error"], error)
                start += n
        advanced(backend, [seqs[i] for i in live], before, feeds, where, hidden)
        measured["lengths"].append([checks.as_count(s.kv.length, f"{where}: cache.length") for s in seqs])
        p += 1
    if watch:
        watch(seqs, "full")
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
        checks.observe(f"{what}: a token past max_len={seq.max_len} raises ValueError", True, expect=True)
        return
    except Exception as e:
        raise AssertionError(f"{what}: a token past max_len={seq.max_len} should raise ValueError, got "
                             f"{type(e).__name__}") from None
    raise AssertionError(f"{what}: a token past max_len={seq.max_len} should raise ValueError (it does not fit), "
                         f"but the pass went through")


class Bytes:
    """A watch: the largest bytes ratio of each cache alone (what it holds), and of the caches made together (with
    what their classes and code reach), over the moments watched."""

    def __init__(self, config, backend_class):
        self.config, self.backend_class, self.alone, self.together = config, backend_class, {}, 0.0

    def __call__(self, seqs, moment):
        for s in seqs:
            held = held_bytes(s.kv)
            ratio = held / float32_bytes(self.config, s.max_len)
            if ratio >= self.alone.get(id(s), (-1.0,))[0]:
                self.alone[id(s)] = (ratio, s.max_len, held)
        total = sum(float32_bytes(self.config, s.max_len) for s in seqs)
        self.together = max(self.together, reachable_bytes([s.kv for s in seqs], self.backend_class) / total)

    def check(self, what) -> float:
        """Each cache, and the caches together, against BYTES_LIMIT of float32's, each observed with its target and the
        baseline's ratio: a miss is not raised here, the grader gives the share (ledger.credit). Returns the largest."""
        sizes = sorted({m for _, m, _ in self.alone.values()}, reverse=True)
        for m in sizes:
            checks.observe(f"{what}, max_len={m}: bytes a cache holds / float32 K/V bytes",
                           max(r for r, size, _ in self.alone.values() if size == m), at_most=BYTES_LIMIT,
                           baseline=BYTES_BASELINE)
        checks.observe(f"{what}: bytes the caches reach together (their classes and code's globals too) / float32 "
                       f"K/V bytes", self.together, at_most=BYTES_LIMIT, baseline=BYTES_BASELINE)
        ratio, m, held = max(self.alone.values())
        if self.together > max(ratio, BYTES_LIMIT):
            print(f"{what}: the caches made together reach {self.together:.3f}x the bytes of their float32 K/V with "
                  f"their classes and what their code reads, more than any cache holds alone ({ratio:.3f}x): K/V kept "
                  f"beside the cache (in a global, on a class) counts too")
        elif ratio > BYTES_LIMIT:
            print(f"{what}, max_len={m}: the cache holds {held:,} bytes, {ratio:.3f}x float32 K/V "
                  f"({float32_bytes(self.config, m):,} bytes). Every tensor it holds counts, scales included: "
                  f"{32 * ratio:.2f} bits a value, its code and its share of the scales")
        return max(ratio, self.together)


def share_words(value: float, target: float, baseline: float, unit: str) -> str:
    """What a design measure earns (ledger.credit: full at the target, none at the baseline, linear between)."""
    from autograder.notebook_checks.ledger import credit

    share = credit(value, at_most=target, baseline=baseline)
    fmt = (lambda x: f"{x:.3f}x") if unit == "x" else (lambda x: f"{x:+.3%}")
    verdict = "target met: full points" if share == 1 else f"{share:.0%} of the points"
    return f"{fmt(value)} (target at most {fmt(target)}, none from {fmt(baseline)}): {verdict}"


def check_lowbit_bytes(LowBitKVCache, LowBitAttention, config, max_lens, what, hidden=False, text=None) -> float:
    """Caches of max_lens for `config` (a LlamaConfig: engine_config()): bits=0/99 rejected; filled through the
    backend in ragged passes, attention close to exact; a token past max_len rejected; bytes at most BYTES_LIMIT of
    float32's for full points, a share of them down to the baseline's (BYTES_BASELINE). With `text` (windows of token
    ids; the target model's config), the caches that score it through the model, as the perplexity test scores a text,
    are measured too. Prints what the bytes earn; returns the largest ratio."""
    require_own_class(LowBitKVCache, "LowBitKVCache")
    require_own_class(LowBitAttention, "LowBitAttention")
    from miniengine.model import LlamaConfig

    assert isinstance(config, LlamaConfig), "the harness measures caches made with the engine's own LlamaConfig"
    label = f"hidden case {what}" if hidden else what
    with checks.reference_forbidden("your low-bit cache", forbidden=DESIGN_KEY):
        check_bits_rejected(LowBitKVCache, config, label, hidden)
        measured, passes = Bytes(config, LowBitAttention), {}
        kv, seqs = fill(LowBitAttention, LowBitKVCache, config, max_lens, label, hidden=hidden, watch=measured,
                        record=passes)
        checks.observe(f"{label}: the caches' lengths after each pass", passes["lengths"],
                       **({} if hidden else {"expect": expected_lengths(max_lens)}))
        checks.observe(f"{label}: attend()'s largest relative error from exact attention", passes["error"],
                       at_most=ATTENTION_TOLERANCE)
        expect_overflow(kv, seqs[0], label)
        worst = measured.check(label)
        if text is not None:
            model = checks.load_model()
            assert config == model.config, "the text is scored by the target model: give its config, engine_config()"
            scored = Bytes(model.config, LowBitAttention)
            window_nlls(LowBitKVCache, LowBitAttention, model, text, f"{label}, scoring a text", hidden=hidden,
                        watch=scored)
            worst = max(worst, scored.check(f"{label}, the caches that score {len(text)} windows of text"))
    print(f"{label}: bytes / float32 K/V bytes {share_words(worst, BYTES_LIMIT, BYTES_BASELINE, 'x')}")
    return worst


def expected_lengths(max_lens) -> list[list[int]]:
    """The caches' lengths after each pass of fill: what its feeds add, computed apart from the student's code."""
    lengths, out, p = [0] * len(max_lens), [], 0
    while any(n < m for n, m in zip(lengths, max_lens)):
        for i, (n, m) in enumerate(zip(lengths, max_lens)):
            if n < m and (i == 0 or p > 0):
                lengths[i] = n + min(m - n, (1 if n else 9) if p < 3 else 32)
        out.append(list(lengths))
        p += 1
    return out
