"""Lab 02's design part, for instructors: the texts its low-bit KV cache is graded on, a family of low-bit caches that
measures the trade-off (the reference design among them), and the baseline that must fail the bytes threshold.

**The texts.**  The course commits no third-party text, and the model's training corpus (the standard library) is
not the same file on every Python, so the texts are the target model's own writing: each window starts with a short
header written for this course and goes on with 256 tokens in all, sampled at temperature 1 (the distribution the
model itself assigns, so its perplexity is the model's own uncertainty).  The visible windows ship in
``data/golden/kv_text.json``; the hidden ones, on other headers and seeds, live in ``autograder/hidden/kv_text.json``
(its windows are inputs: the grader shows them to the sandbox while the hidden cell runs, hidden_outputs.SPECS).

    python -m autograder.qa.design.lab02            # the table: bytes ratio and perplexity increase of each scheme
    python -m autograder.qa.design.lab02 --texts    # rewrite both text files (and print the float32 perplexities)

**The schemes** (lab02_schemes.py) are the designs the targets are set from.  The reference design is the lab's
solution cell: int4 codes from each token and head's minimum, with a float16 scale and a float16 minimum per token and
head: 4 + 32/32 bits a value, 0.156x float32.  The baseline is int8 with a float32 scale per token and head:
8 + 32/32 = 9 bits, 0.281x.

**The targets** (lab02/lowbit.py): bytes, full points at 0.20x float32 or less (6.4 bits a value), none at the
baseline's 0.281x, linear between; perplexity, full points at +1.0% or less over the float32 cache's, none from
+1.5% (the naive int4 cache, one scale per tensor), linear between.  Both texts hold 128 windows: one window's
increase varies by about 0.5% (sd over windows, 0.35% to 0.8% for the int4 and int3 designs), so a text's mean moves
by about 0.05%, and every int4 and mixed design below lands within a fifth of its margin from one text to the other.

Measured here (``python -m autograder.qa.design.lab02``; bytes of a full cache of the target model's shape, perplexity
increase over the float32 cache on the visible and the hidden 128 windows):

    scheme                                                          bytes   visible   hidden   spread   margin
    int8, scale per token and head (float32): the baseline          0.281   -0.002%   -0.002%           bytes: none
    int8, scale per token and head (float16)                        0.266   -0.001%   -0.001%           bytes: 19%
    int4, one scale per tensor (float32): the naive design          0.129   +1.416%   +1.489%  0.07%    ppl: 17%, 2%
    int4, symmetric, scale per token and head (float32)             0.156   +0.547%   +0.492%  0.06%    0.45%
    int4, symmetric, scale per token and head (float16)             0.141   +0.532%   +0.499%  0.03%    0.47%
    int4, symmetric, groups of 16 (float16 scales)                  0.156   +0.355%   +0.372%  0.02%    0.63%
    int4, from the minimum, per token and head (the solution)       0.156   +0.242%   +0.332%  0.09%    0.67%
    int4, from the minimum, groups of 16                            0.188   +0.186%   +0.176%  0.01%    0.81%
    K int8 symmetric, V int4 from the minimum, per token and head   0.211   +0.030%   +0.077%  0.05%    bytes: 87%
    K int4 from the minimum in groups of 16, V int4 per head        0.172   +0.184%   +0.186%  0.00%    0.81%
    int3, from the minimum, groups of 16                            0.156   +0.774%   +0.935%  0.16%    0.07%
    int3, symmetric, groups of 16 (float16 scales)                  0.125   +1.592%   +1.766%           ppl: none
    int2, from the minimum, groups of 16                            0.125   +4.277%   +4.532%           ppl: none

(margin: to the +1.0% target on the worse text; for a design that misses a target, the share of its points.)  The
one design near a target is int3 from the minimum in groups of 16, inside it on both texts with a spread twice its
margin: partial credit makes its score continuous there (at +1.16% it would keep two thirds of the perplexity
points), and the lab's reflection asks students to rule such a design out or keep it with its numbers.  The old
targets (0.16x, +0.5%, 32 and 64 windows) put every passing design at 0.156x, and int4 symmetric per token and head
failed the visible text (+0.548%) and passed the hidden one (+0.406%).
"""
from __future__ import annotations

import functools
import json
import sys

import torch

from autograder.hidden_outputs import HIDDEN_DIR
from autograder.labs.lab02 import lowbit as lab02_lowbit, ppl as lab02_ppl
from autograder.qa.design.lab02_schemes import SCHEMES, FloatCache, SchemeAttention, scheme
from miniengine.attention import causal_attention

VISIBLE_FILE, HIDDEN_FILE = lab02_lowbit.VISIBLE_TEXT, HIDDEN_DIR / "kv_text.json"
WINDOW = 256  # tokens a window holds: the length the model was trained on
# Windows in each text: enough that a design's increase moves by less than a fifth of its margin from the visible
# text to the hidden one (one window's increase varies by about 0.5%, so the mean of 128 by about 0.05%).
WINDOWS = 128
VISIBLE_HEADERS = ["import os\nimport sys\n\n", "class Reader:\n    def __init__(self, stream):\n",
                   "def _split(path):\n", "try:\n    import _thread\nexcept ImportError:\n",
                   "def read_config(filename):\n", "class Error(Exception):\n    pass\n\n\n",
                   "    def close(self):\n", "def format_line(fields, width=80):\n",
                   "def split_lines(text, keepends=False):\n", "    if not isinstance(name, str):\n",
                   "def run(cmd, timeout=None):\n", "class Table:\n    def __init__(self, rows):\n",
                   "import functools\n\n\n", "def quote(s):\n", "    def __eq__(self, other):\n",
                   "def normalize(path):\n"]
HIDDEN_HEADERS = ["import re\n\n_pattern = re.compile(", "if __name__ == '__main__':\n", "class Queue:\n    \"\"\"",
                  "def encode(data, errors='strict'):\n", "    for key, value in items:\n",
                  "from collections import namedtuple\n\n", "def walk(top, topdown=True):\n", "class Timer:\n",
                  "    def __repr__(self):\n", "def main(args=None):\n", "import struct\n\n\ndef unpack_header(",
                  "class Node:\n    def __init__(self, name, children=None):\n",
                  "def parse(source, filename='<unknown>'):\n", "    @property\n    def name(self):\n", "__all__ = [",
                  "def copyfile(src, dst):\n", "class Cache(dict):\n", "    def write(self, data):\n",
                  "import logging\n\nlogger = ", "def _check_type(value, expected):\n", "class Event:\n",
                  "def load(fp, encoding=None):\n", "    while True:\n        line = ", "def escape(text):\n",
                  "class Buffer:\n    def __init__(self, size=1024):\n", "def _convert(value):\n", "    raise ValueError(",
                  "def find_all(pattern, string, flags=0):\n", "class Token:\n", "def dump(obj, fp, indent=None):\n",
                  "\"\"\"Utilities for working with", "class Protocol:\n    \"\"\""]
VISIBLE_SEED, HIDDEN_SEED = 2_000, 7_000


# ---------------------------------------------------------------- the baseline, plugged in where the student's part goes

BASELINE_NAME = "an int8 KV cache, one float32 scale per token and head (0.281x float32)"
BASELINE = {"design-lowbit-kv": '''\
class LowBitKVCache:
    """The course's baseline: int8 codes, one float32 scale per token and head: 8 + 32/32 bits a value."""

    def __init__(self, config, max_len, dtype=torch.float32, device="cpu", bits=8):
        if bits != 8:
            raise ValueError(f"bits: this baseline stores int8 only, got {bits!r}")
        shape = (2, config.num_hidden_layers, max_len, config.num_key_value_heads)
        self.codes = torch.zeros(shape + (config.head_dim,), dtype=torch.int8, device=device)
        self.scales = torch.ones(shape + (1,), dtype=torch.float32, device=device)
        self.dtype, self.max_len, self.length = dtype, max_len, 0

    def write(self, layer, start, k, v):
        end = start + k.shape[0]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: positions {start}..{end - 1} do not fit in max_len={self.max_len}")
        for i, x in enumerate((k, v)):
            scale = (x.float().abs().amax(-1, keepdim=True) / 127).clamp(min=1e-12)
            self.codes[i, layer, start:end] = torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8)
            self.scales[i, layer, start:end] = scale

    def read(self, layer, end):
        return [(self.codes[i, layer, :end].float() * self.scales[i, layer, :end]).to(self.dtype) for i in (0, 1)]


class LowBitAttention(CachedAttention):
    def attend(self, layer, q, k, v):
        out, start = torch.empty_like(q), 0
        for cache, n in zip(self.caches, self.new_tokens):
            rows, total = slice(start, start + n), cache.length + n
            cache.write(layer, cache.length, k[rows], v[rows])
            keys, values = cache.read(layer, total)
            pos = torch.arange(total, device=q.device)
            out[rows] = causal_attention(q[rows], keys, values, pos[cache.length:], pos)
            start += n
        return out
'''}
MUST_FAIL = ["design-kv-bytes-visible", "design-kv-bytes-hidden"]


# ---------------------------------------------------------------- the texts

@functools.lru_cache(maxsize=1)
def model_and_tokenizer():
    from autograder import notebook_checks as checks

    return checks.load_model(), checks.load_tokenizer()


def write_windows(headers, seed0, prefix, per_header=2):
    """`per_header` windows per header, each on its own seed: the header, then the model's own tokens at temperature 1
    up to WINDOW tokens."""
    from miniengine import LLM
    from miniengine.sampling import SamplingParams

    model, tok = model_and_tokenizer()
    llm = LLM(model=model, max_num_seqs=8)
    ids = [tok.encode(h).ids for h in headers] * per_header
    params = [SamplingParams(temperature=1.0, max_tokens=WINDOW - len(i), seed=seed0 + n, ignore_eos=True)
              for n, i in enumerate(ids)]
    cases = []
    for n, (i, p, out) in enumerate(zip(ids, params, llm.generate(ids, params))):
        window = i + list(out.token_ids)
        cases.append({"name": f"{prefix}-{n:02d}", "prompt": tok.decode(window), "prompt_token_ids": window,
                      "params": {"temperature": p.temperature, "max_tokens": p.max_tokens, "seed": p.seed,
                                 "ignore_eos": True}})
    return cases


def float32_nlls(windows) -> list[float]:
    """The float32 cache through the tests' own path, window by window: the yardstick of every perplexity increase."""
    model, _ = model_and_tokenizer()
    return lab02_ppl.window_nlls(FloatCache, SchemeAttention, model, windows, "the float32 cache")


def write_texts() -> None:
    about = ("Windows of {n} tokens for lab 02's low-bit KV cache: each a header written for the course, then the "
             "target model's own tokens at temperature 1 (autograder/qa/design/lab02.py). {what}")
    for path, headers, seed, prefix, what in (
            (VISIBLE_FILE, VISIBLE_HEADERS, VISIBLE_SEED, "visible", "Visible: ships with the student edition."),
            (HIDDEN_FILE, HIDDEN_HEADERS, HIDDEN_SEED, "hidden", "Hidden: instructors only, never released.")):
        cases = write_windows(headers, seed, prefix, per_header=WINDOWS // len(headers))
        nlls = float32_nlls([c["prompt_token_ids"] for c in cases])
        ppl = lab02_ppl.perplexity(nlls)
        data = {"about": about.format(n=WINDOW, what=what), "model": "target", "window": WINDOW,
                "chunk": lab02_lowbit.CHUNK, "float32_perplexity": ppl, "float32_window_nlls": nlls, "cases": cases}
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"{path}: {len(cases)} windows, float32 perplexity {ppl!r}")


def windows_of(path) -> list[list[int]]:
    return [c["prompt_token_ids"] for c in json.loads(path.read_text())["cases"]]


# ---------------------------------------------------------------- the table

def measure(cache_class, backend_class, windows, float32_ppl) -> tuple[float, float]:
    """(bytes ratio of a full cache of WINDOW positions of the target model, perplexity increase on windows)."""
    model, _ = model_and_tokenizer()
    kv, seqs = lab02_lowbit.fill(backend_class, cache_class, model.config, [WINDOW], "measure", tolerance=10.0)
    ratio = lab02_lowbit.held_bytes(seqs[0].kv) / lab02_lowbit.float32_bytes(model.config, WINDOW)
    ppl = lab02_ppl.perplexity(lab02_ppl.window_nlls(cache_class, backend_class, model, windows, "measure"))
    return ratio, ppl / float32_ppl - 1


def solution_classes(source=None):
    """(LowBitKVCache, LowBitAttention) of the lab's solution cells, run as the notebook runs them (for the table)."""
    from autograder import course_paths

    cells = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"]) for c in json.loads(
        course_paths.find_labs(["lab02"])[0].source.read_text())["cells"]}
    scope = {"__name__": "__main__", "torch": torch, "causal_attention": causal_attention}
    for gid in ("CachedAttention", "design-lowbit-kv"):
        exec(compile(source if gid == "design-lowbit-kv" and source else cells[gid], f"<lab02 {gid}>", "exec"), scope)
    return scope["LowBitKVCache"], scope["LowBitAttention"]


def table() -> None:
    texts = {name: (windows_of(path), json.loads(path.read_text())["float32_perplexity"])
             for name, path in (("visible", VISIBLE_FILE), ("hidden", HIDDEN_FILE))}
    print(f"{'scheme':68s} {'bytes':>6s} " + " ".join(f"{n + ' (' + str(len(w)) + ')':>14s}" for n, (w, _) in texts.items()))
    rows = [(name, scheme(**choices), SchemeAttention) for name, choices in SCHEMES.items()]
    rows.append(("the lab's solution cell (the same design, its own code)", *solution_classes()))
    for name, cache_class, backend_class in rows:
        cells = [measure(cache_class, backend_class, w, f) for w, f in texts.values()]
        print(f"{name:68s} {cells[0][0]:6.3f} " + " ".join(f"{100 * d:+13.3f}%" for _, d in cells), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    write_texts() if "--texts" in sys.argv[1:] else table()
