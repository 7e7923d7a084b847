"""Lab 03's design part, for instructors: the held-out split of the measured step times, the reference fit that sets
the calibration threshold, and the baseline that must miss it.

The data is ``miniengine.course.step_times``'s grid, measured once on an idle machine (153 points: 3 shapes, decode
batch 1..32 x context 22..390, prefill batch 1..8 x 16..256 tokens).  Whole slices of it are held out, so that a
table of the training rows cannot pass (the nearest training row misses the held-out points by about 30%): every
decode row at batch 24, every decode row at context 262, every prefill of 128-token prompts: 45 points, 15 per
shape, both phases.  They live in ``autograder/hidden/step_times_heldout.csv`` (never published); the 108 others
ship as ``data/step_times/cpu.csv``.  The lab's hidden test cell holds the held-out configurations only; the
grader's judge (autograder/grade/yardsticks.py, lab03-heldout-mape) reads their times from that file, outside the sandbox
(tests/autograder/test_step_times.py keeps the cell's configurations equal to the file's).

The threshold (``THRESHOLD``, in the lab's design test cells) comes from the reference fit below, measured here:

    python -m autograder.qa.design.lab03            # MAPE of the reference, the three-term fit, the baseline, a lookup
    python -m autograder.qa.design.lab03 --split    # rewrite both files by the held-out rule (after a new measurement)

Measured, MAPE on the training rows / the visible slices (fitted without them) / the held-out points: the reference
11.7 / 11.2 / 10.6%; the three-term linear fit 17.0 / 16.2 / 15.2%; the baseline 52.9 / 42.1 / 54.0%; the nearest
training row 0 / 44.3 / 30.6%.  THRESHOLD = 14% lies 3.4 points above the reference on the held-out points (2.8 on
the visible ones) and misses the three-term fit by about 1 point.  Fits in between (the lab's solution with fewer
terms, held-out MAPE): an overhead, FLOPs and bytes 16.0% (fails); with a per-layer term 14.2% (fails); with a
per-layer and a batched per-layer term 13.6% (passes); with a per-layer and the superlinear KV term 11.5%.  So a
pass needs one effect beyond a calibrated roofline with overheads.  A bilinear interpolation of the training table,
shape by shape, gets 12.4%: the harness refuses it, as it cannot price an unmeasured shape.  The repeat noise of a
point is 10-15%, so no threshold far below the reference's would be fair.

The reference is the roofline's terms plus the overheads a Python engine adds, each weighed by a non-negative
coefficient fitted to relative error (the grade is a relative error): per step, per layer, per layer when the batch
is ragged (padding and masks), the weights streamed once, the matmuls' FLOPs, attention's FLOPs, the LM head's, the
KV history read, and its square per layer (the history spills out of the caches: time grows faster than linearly).
"""
from __future__ import annotations

import sys

import numpy as np

from autograder.hidden_outputs import HIDDEN_DIR
from miniengine.cost import counting
from miniengine.course import step_times

HIDDEN_FILE = HIDDEN_DIR / "step_times_heldout.csv"
HELD_OUT = (("decode", "batch", 24), ("decode", "context", 262), ("prefill", "context", 128))  # (phase, field, value)
VISIBLE = (("decode", "batch", 16), ("prefill", "context", 64))  # design-mape-visible's slices of the training file
THRESHOLD = 0.14  # the largest mean absolute percentage error that passes (design-mape-visible and -hidden)
CPU = {"name": "one core of this CPU", "peak_flops": 80e9, "bandwidth": 18e9, "memory": 0.0}  # lab 03's measure cell

BASELINE_NAME = "the uncalibrated paper-GPU model on one core's roofline (80 GFLOP/s, 18 GB/s)"
BASELINE = {"design-calibrate": '''\
def calibrate(rows):
    """The course's baseline: the paper-GPU cost model, uncalibrated (70% of peak, 80% of bandwidth, 0.5 ms per step),
    with one core of this CPU as its GPU (float32): what lab 03's measure cell typically finds here."""
    if not rows:
        raise ValueError("rows: expected the training rows of step_times.read_csv, got none")
    cpu = {"name": "one core of this CPU", "peak_flops": 80e9, "bandwidth": 18e9, "memory": 0.0}

    class Step:
        def __init__(self, seconds):
            self.step_time_s = seconds

    class PaperCPU:
        def __init__(self, config):
            self.config = config

        def forward(self, new_tokens, context):
            new_tokens, context = list(new_tokens), list(context)
            if not new_tokens or len(new_tokens) != len(context):
                raise ValueError(f"new_tokens and context: one entry per sequence, got {len(new_tokens)} and "
                                 f"{len(context)}")
            if min(new_tokens) < 1 or min(context) < 0:
                raise ValueError("new_tokens must be >= 1 and context >= 0 for every sequence")
            flops = forward_flops(self.config, new_tokens, context)
            moved = forward_bytes(self.config, new_tokens, context, bytes_per_param=4, bytes_per_value=4)
            return Step(step_time(flops, moved, cpu))

    return PaperCPU
'''}
MUST_FAIL = ["design-mape-visible", "design-mape-hidden"]


def in_slices(row: dict, slices) -> bool:
    return any(row["phase"] == phase and row[field] == value for phase, field, value in slices)


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows), in the order given."""
    return [r for r in rows if not in_slices(r, HELD_OUT)], [r for r in rows if in_slices(r, HELD_OUT)]


def slice_name(row: dict) -> str:
    """The held-out slice a row belongs to, as the hidden test's message names it (batch 24 first)."""
    if row["phase"] == "prefill":
        return f"prefill of {row['context']}-token prompts"
    return f"decode at batch {row['batch']}" if row["batch"] == 24 else f"decode at context {row['context']}"


# ---------------------------------------------------------------- the fits

def features(cfg, new_tokens, context) -> list[float]:
    """The reference's terms for one forward pass in float32 (see the module's docstring)."""
    L, d = cfg.num_hidden_layers, cfg.hidden_size
    cost = counting.forward_cost(cfg, new_tokens, context, bytes_per_param=4, bytes_per_value=4)
    pairs = sum(t * s + t * (t + 1) // 2 for t, s in zip(new_tokens, context))
    attention = 4 * L * cfg.num_attention_heads * cfg.head_dim * pairs
    head = 2 * cfg.vocab_size * d * len(new_tokens)
    kv = cost.kv_read_bytes
    return [1.0, L, L * (len(new_tokens) > 1), 4 * counting.param_count(cfg), cost.flops - attention - head,
            attention, head, kv, kv * kv / L]


def three_terms(cfg, new_tokens, context) -> list[float]:
    """The simple linear fit: a fixed overhead, the matmuls of every token (per sequence, in decode), the KV read."""
    cost = counting.forward_cost(cfg, new_tokens, context, bytes_per_param=4, bytes_per_value=4)
    return [1.0, 2 * cfg.num_hidden_layers * counting._layer_matmul_params(cfg) * sum(new_tokens), cost.kv_read_bytes]


def nnls(A, b, iterations: int = 200) -> np.ndarray:
    """min |Ax - b| with x >= 0 (Lawson and Hanson's active set): no term may make a step faster."""
    x, active = np.zeros(A.shape[1]), np.zeros(A.shape[1], bool)
    for _ in range(iterations):
        w = A.T @ (b - A @ x)
        if active.all() or w[~active].max() <= 1e-12:
            break
        active[np.argmax(np.where(active, -np.inf, w))] = True
        while True:
            z = np.zeros_like(x)
            z[active] = np.linalg.lstsq(A[:, active], b, rcond=None)[0]
            if (z[active] > 0).all():
                x = z
                break
            shrink = active & (z <= 0)
            x = x + np.min(x[shrink] / (x[shrink] - z[shrink])) * (z - x)
            active &= x > 1e-15
    return x


class _Step:
    def __init__(self, seconds):
        self.step_time_s = seconds


def fit(rows: list[dict], terms=features):
    """A cost model (config -> object with forward(new_tokens, context).step_time_s) fitted to rows' relative error."""
    X = np.array([terms(step_times.row_config(r), *step_times.row_batch(r)) for r in rows], float)
    seconds = np.array([r["step_ms"] / 1e3 for r in rows])
    A = X / seconds[:, None]  # relative residuals: each row's error counts as a share of its own time
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    coef = nnls(A / scale, np.ones(len(rows))) / scale

    class Fitted:
        def __init__(self, config):
            self.config = config

        def forward(self, new_tokens, context):
            return _Step(float(np.dot(terms(self.config, list(new_tokens), list(context)), coef)))

    Fitted.coefficients = coef
    return Fitted


def paper_cpu(cfg):
    """The baseline as a cost model, the same arithmetic as BASELINE's cell (the course's counting, float32)."""
    class PaperCPU:
        def forward(self, new_tokens, context):
            c = counting.forward_cost(cfg, list(new_tokens), list(context), bytes_per_param=4, bytes_per_value=4)
            return _Step(max(c.flops / (0.7 * CPU["peak_flops"]), c.bytes / (0.8 * CPU["bandwidth"])) + 5e-4)
    return PaperCPU()


def mape(cost_model, rows: list[dict]) -> float:
    """Mean absolute percentage error (a fraction) of cost_model's step times on rows."""
    errors = []
    for r in rows:
        predicted = cost_model(step_times.row_config(r)).forward(*step_times.row_batch(r)).step_time_s
        errors.append(abs(1e3 * predicted - r["step_ms"]) / r["step_ms"])
    return float(np.mean(errors))


def load() -> tuple[list[dict], list[dict]]:
    """(the shipped training rows, the held-out rows); none held out before the first split."""
    held = step_times.read_csv(HIDDEN_FILE) if HIDDEN_FILE.exists() else []
    return step_times.read_csv(step_times.STEP_TIMES), held


def nearest_row(rows: list[dict]):
    """Planted bug: the step time of the nearest training row of the same shape and phase (a lookup table)."""
    def cost_model(cfg):
        class Lookup:
            def forward(self, new_tokens, context):
                phase = "prefill" if context[0] == 0 and new_tokens[0] > 1 else "decode"
                batch, length = len(new_tokens), new_tokens[0] if phase == "prefill" else context[0]
                same = [r for r in rows if r["phase"] == phase and step_times.row_config(r) == cfg]
                best = min(same, key=lambda r: abs(r["batch"] - batch) / 32 + abs(r["context"] - length) / 390)
                return _Step(best["step_ms"] / 1e3)
        return Lookup()
    return cost_model


def report(out=print) -> dict[str, tuple[float, float, float]]:
    """MAPE on the training rows, on design-mape-visible's slices (fitted without them) and on the held-out rows."""
    train, held = load()
    visible = [r for r in train if in_slices(r, VISIBLE)]
    rest = [r for r in train if not in_slices(r, VISIBLE)]
    fits = {"reference fit": lambda rows: fit(rows, features),
            "three-term linear fit": lambda rows: fit(rows, three_terms),
            "baseline: " + BASELINE_NAME: lambda rows: paper_cpu,
            "nearest training row (a lookup)": nearest_row}
    found = {}
    for name, make in fits.items():
        found[name] = (mape(make(train), train), mape(make(rest), visible), mape(make(train), held))
        out(f"{name:<60} train {100 * found[name][0]:6.1f}%  visible {100 * found[name][1]:6.1f}%  "
            f"held out {100 * found[name][2]:6.1f}%   (threshold {100 * THRESHOLD:.0f}%)")
    return found


def write_split() -> None:
    """Rewrite the training and held-out files from their union, or from a fresh measurement of the whole grid
    written to the training file (``python -m miniengine.course.step_times --out data/step_times/cpu.csv``)."""
    train, held = load()
    fresh = any(in_slices(r, HELD_OUT) for r in train)  # the whole grid is there: the old held-out file is stale
    rows = sorted(train if fresh else train + held, key=lambda r: (list(step_times.SHAPES).index(r["model"]), r["phase"] != "decode",
                                               r["batch"], r["context"]))
    notes = step_times.read_notes(step_times.STEP_TIMES)
    keep = [n for n in notes if not n.startswith(("Training file", "Held-out file"))]
    train, held = split(rows)
    step_times.write_csv(train, step_times.STEP_TIMES, "\n".join(keep + [
        "Training file: every measured point but the held-out slices (decode at batch 24, decode at context 262, "
        "prefill of 128-token prompts), which grade Lab 03's calibration."]))
    step_times.write_csv(held, HIDDEN_FILE, "\n".join(keep + [
        "Held-out file (instructors only, never published): decode at batch 24, decode at context 262, prefill "
        "of 128-token prompts; read by the grader's judge of Lab 03's design-mape-hidden cell."]))


if __name__ == "__main__":
    if "--split" in sys.argv[1:]:
        write_split()
    report()
