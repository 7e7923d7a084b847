"""Measured step times of the engine on this CPU: the data Lab 03 calibrates its cost model to.

One row per (phase, model shape, batch, context): the median wall time of the engine's ``step()`` for that
batch, measured on one thread (``torch.set_num_threads(1)``) after a warm-up, with the model's weights random
(a step's time does not depend on their values).  A decode row times steps in which every one of ``batch``
sequences feeds one token on top of ``context`` cached ones (the context of the median step); a prefill row
times the one step that feeds ``batch`` prompts of ``context`` tokens each, on an empty cache.

    python -m miniengine.course.step_times --out data/step_times/cpu.csv          # the full grid (minutes)
    python -m miniengine.course.step_times --fast                                 # a few points, to compare

It is the whole engine that is timed, scheduler and Python included, not one matmul: that is what a serving
simulator has to predict, and why the data is not a clean roofline.

The shipped file (``STEP_TIMES``) is the grid measured once, on an idle machine, less the slices that grade Lab 03's
calibration (held out of it, instructors only).  ``row_config`` and ``row_batch`` turn a row back into the model
shape and the forward pass it timed, as a cost model is asked about them: ``cost_model(config).forward(new_tokens,
context)``.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import platform
import statistics
import sys
import time

import torch

from miniengine.model import Llama, LlamaConfig
from miniengine.paths import DATA
from miniengine.sampling import SamplingParams

STEP_TIMES = DATA / "step_times" / "cpu.csv"  # the training file Lab 03 calibrates to

# Three shapes around the course's tiny target (d=256, 6 layers): the same, wider and shallower, narrower and deeper.
SHAPES = {
    "tiny": LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=6,
                        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512),
    "wide": LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512),
    "deep": LlamaConfig(vocab_size=4096, hidden_size=192, intermediate_size=512, num_hidden_layers=12,
                        num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=512),
}
DECODE_BATCHES = (1, 2, 4, 8, 16, 24, 32)
DECODE_CONTEXTS = (16, 64, 128, 256, 384)
PREFILL_BATCHES = (1, 2, 4, 8)
PREFILL_LENGTHS = (16, 64, 128, 256)
# The --fast grid: a few points of the tiny model, to compare a machine with the shipped file (about 5 s when idle).
FAST_GRID = dict(models=("tiny",), decode_batches=(1, 8, 32), decode_contexts=(16, 256), prefill_batches=(1,),
                 prefill_lengths=(64, 256))
FIELDS = ("phase", "model", "hidden_size", "intermediate_size", "num_layers", "num_heads", "vocab_size",
          "batch", "context", "step_ms")


@dataclasses.dataclass(frozen=True)
class Point:
    phase: str  # "decode" or "prefill"
    model: str
    batch: int
    context: int  # decode: cached tokens per sequence at the median step; prefill: prompt tokens per sequence
    step_ms: float

    def row(self) -> dict:
        c = SHAPES[self.model]
        return {"phase": self.phase, "model": self.model, "hidden_size": c.hidden_size,
                "intermediate_size": c.intermediate_size, "num_layers": c.num_hidden_layers,
                "num_heads": c.num_attention_heads, "vocab_size": c.vocab_size, "batch": self.batch,
                "context": self.context, "step_ms": round(self.step_ms, 4)}


def _model(name: str) -> Llama:
    torch.manual_seed(0)
    model = Llama(SHAPES[name]).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return model


def _engine(model, batch, context, steps):
    from miniengine.llm import LLM

    return LLM(model=model, max_num_seqs=batch, kv_cache_tokens=batch * (context + steps + 16),
               max_num_batched_tokens=max(batch * context, batch))


def _prompts(batch, length, vocab):
    g = torch.Generator().manual_seed(batch * 1000 + length)
    return torch.randint(1, vocab, (batch, length), generator=g).tolist()


def _timed_steps(llm, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        llm.step()
        times.append(time.perf_counter() - t0)
    return times


def decode_point(model, name, batch, context, steps=9) -> Point:
    """The median of ``steps`` decode steps of ``batch`` sequences; the first prompt of ``context`` tokens is prefilled
    in one step and not timed, then two warm-up decode steps."""
    llm = _engine(model, batch, context, steps + 3)
    params = SamplingParams(temperature=0, max_tokens=steps + 3, ignore_eos=True)
    for p in _prompts(batch, context, model.config.vocab_size):
        llm.add_request(p, params)
    _timed_steps(llm, 3)  # the prefill and two decode steps: warm-up
    times = _timed_steps(llm, steps)
    # After the prefill (context tokens) and 2 + i decode steps, each sequence has context + 2 + i cached tokens.
    return Point("decode", name, batch, context + 2 + steps // 2, 1e3 * statistics.median(times))


def prefill_point(model, name, batch, length, repeats=5) -> Point:
    """The median of ``repeats`` prefill steps, each on a fresh engine (an empty cache), after one warm-up."""
    times = []
    for i in range(repeats + 1):
        llm = _engine(model, batch, length, 1)
        for p in _prompts(batch, length, model.config.vocab_size):
            llm.add_request(p, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        t = _timed_steps(llm, 1)[0]
        if i:
            times.append(t)
    return Point("prefill", name, batch, length, 1e3 * statistics.median(times))


def measure(models=tuple(SHAPES), decode_batches=DECODE_BATCHES, decode_contexts=DECODE_CONTEXTS,
            prefill_batches=PREFILL_BATCHES, prefill_lengths=PREFILL_LENGTHS, progress=print, steps=9,
            repeats=5) -> list[Point]:
    """The grid, on one thread (the thread count is restored after); ``steps`` timed decode steps and ``repeats``
    prefills per point (fewer: quicker and noisier; the shipped file used the defaults)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    points = []
    try:
        with torch.inference_mode():
            for name in models:
                model = _model(name)
                for b in decode_batches:
                    for c in decode_contexts:
                        points.append(decode_point(model, name, b, c, steps))
                        progress(points[-1])
                for b in prefill_batches:
                    for t in prefill_lengths:
                        points.append(prefill_point(model, name, b, t, repeats))
                        progress(points[-1])
    finally:
        torch.set_num_threads(threads)
    return points


def write_csv(points, path, note: str) -> None:
    """Points (or rows as dicts) under a comment header: each line of ``note`` becomes a line starting with #."""
    with open(path, "w", newline="") as f:
        f.writelines(f"# {line}\n" for line in note.splitlines())
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for p in points:
            w.writerow(p if isinstance(p, dict) else p.row())


def read_notes(path) -> list[str]:
    """The comment header of a step-times file: how and where it was measured."""
    with open(path) as f:
        return [line[1:].strip() for line in f if line.startswith("#")]


def read_csv(path) -> list[dict]:
    """Rows as dicts with numbers parsed (comment lines starting with # skipped)."""
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    ints = set(FIELDS) - {"phase", "model", "step_ms"}
    return [{k: (int(v) if k in ints else float(v) if k == "step_ms" else v) for k, v in r.items()} for r in rows]


def row_config(row: dict) -> LlamaConfig:
    """The model shape a row was measured on (the measured shapes are MHA, with tied embeddings, like SHAPES)."""
    return LlamaConfig(vocab_size=row["vocab_size"], hidden_size=row["hidden_size"],
                       intermediate_size=row["intermediate_size"], num_hidden_layers=row["num_layers"],
                       num_attention_heads=row["num_heads"], num_key_value_heads=row["num_heads"],
                       max_position_embeddings=512)


def row_batch(row: dict) -> tuple[list[int], list[int]]:
    """The forward pass a row timed, as (new_tokens, context): decode feeds one token per sequence over ``context``
    cached ones; prefill feeds a whole prompt of ``context`` tokens per sequence over an empty cache."""
    if row["phase"] == "decode":
        return [1] * row["batch"], [row["context"]] * row["batch"]
    if row["phase"] == "prefill":
        return [row["context"]] * row["batch"], [0] * row["batch"]
    raise ValueError(f"phase must be 'decode' or 'prefill', got {row['phase']!r}")


def machine() -> str:
    """This machine in a few words: the processor's model name (Linux), its core count, and torch's version."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, torch {torch.__version__}, python {platform.python_version()}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the rows to this CSV file")
    ap.add_argument("--fast", action="store_true", help="a few points of the tiny model only")
    args = ap.parse_args(argv)
    kw = FAST_GRID if args.fast else {}
    points = measure(progress=lambda p: print(p, flush=True), **kw)
    if args.out:
        note = (f"engine step times, median, one torch thread, random weights; {machine()}; "
                f"miniengine.course.step_times")
        write_csv(points, args.out, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
