"""Lab 03's design part, for instructors: the held-out split of the measured step times, the honest designs that set
the calibration threshold, the baseline that must miss it, and the re-measurement of the held-out points.

The data is ``miniengine.course.step_times``'s grid, measured once on the course's idle machine (153 points: 3
shapes, decode batch 1..32 x context 22..390, prefill batch 1..8 x 16..256 tokens).  Whole slices of it are held
out, so that a table of the training rows cannot pass (the nearest training row misses the held-out points by about
30%): every decode row at batch 24, every decode row at context 262, every prefill of 128-token prompts: 45 points,
15 per shape, both phases.  They live in ``autograder/hidden/step_times_heldout.csv`` (never published); the 108
others ship as ``data/step_times/cpu.csv``, whose header says slices are held out and never which.  The lab's hidden
test cell holds the held-out configurations only; the grader's judge (autograder/grade/yardsticks.py,
lab03-heldout-mape) reads their times from that file, outside the sandbox.

    python -m autograder.qa.design.lab03                 # MAPE of the honest designs, the baseline and a lookup
    python -m autograder.qa.design.lab03 --split         # rewrite both files by the held-out rule (new measurement)
    python -m autograder.qa.design.lab03 --measure DIR   # one run of the 45 held-out points into DIR (see below)
    python -m autograder.qa.design.lab03 --merge DIR     # the held-out file := each point's median over DIR's runs

The threshold (``THRESHOLD``) comes from the honest designs (lab03_designs.py), MAPE on the training rows / the
visible slices (fitted without them) / the held-out points, measured on the shipped data:

    fitted roofline max(FLOPs/a, bytes/b) + c      18.5 / 18.8 / 20.1     (the least a calibration can be)
    overhead + FLOPs + bytes, linear               14.9 / 15.4 / 16.0
    three-term linear fit                          17.0 / 16.2 / 15.2
    ... + per layer                                13.5 / 13.2 / 14.2
    ... + per layer when batched                   12.9 / 12.8 / 13.6
    ... + KV history squared per layer             12.5 / 12.4 / 11.5
    split rates                                    12.8 / 11.5 / 11.3
    reference fit                                  11.7 / 11.2 / 10.6
    baseline: the uncalibrated paper model         52.9 / 42.1 / 54.0
    nearest training row (a lookup)                 0.0 / 44.3 / 30.6     (refused anyway: it prices no new shape)

THRESHOLD = 25%: every calibrated design passes, the weakest (the fitted roofline) with 6.2 points to spare on the
visible slices and 4.9 on the held-out points, the linear sums with 9 to 10, the reference with 14; the uncalibrated
baseline fails by 17 and 29 points.  A roofline fitted to absolute rather than relative error (against the lab's
hint) gets 15.1 / 23.6%: it passes with 1.4 points.  Points scale linearly between the target and the baseline's
MAPE (``BASELINE_MAPE``, rounded down to the percent so that the baseline itself earns nothing).  The noise assumed:
one measurement's repeat noise is 10-15% per point, a design's MAPE over 24 to 45 points moves by about 1 to 2 points
between measurements of the same grid, and a whole run on a busier day can be several percent slower throughout;
the smallest margin of a relative-error design, 4.9 points, covers the first two, and re-measuring the held-out
points as medians over runs on different days (``--measure``/``--merge``) covers the third.  Reaching below 15%
needs terms beyond the roofline (a cost per layer, the ragged batch, the KV history outgrowing the caches): that is
the design; the grade rewards a calibrated model, and the reflection asks which terms it needed.

Re-measuring the held-out points (never on a busy machine: timings taken while other jobs run are several times
slower): ``--measure DIR`` times the 45 points once with the shipped file's protocol (one thread, the median of 9
decode steps or 5 prefills per point) and writes ``DIR/heldout-<UTC time>.csv``; about 60 to 90 s on the course's
machine when idle.  Run it on at least 3 different days (5 is better), then ``--merge DIR``: each point's median over
the runs becomes the held-out file, its header naming the runs and the largest spread of a point between runs, and
``python -m autograder.qa.design.lab03`` re-checks the margins.
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
THRESHOLD = 0.25  # the largest mean absolute percentage error that earns full points (design-mape-visible, -hidden)
# The baseline's MAPE (42.1% visible, 54.0% held out), rounded down: no points from there on, a linear share between.
BASELINE_MAPE = {"design-mape-visible": 0.42, "design-mape-hidden": 0.54}
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
    """MAPE on the training rows, on design-mape-visible's slices (fitted without them) and on the held-out rows, of
    the honest designs (lab03_designs.py), the baseline and a lookup."""
    from autograder.qa.design.lab03_designs import designs

    train, held = load()
    visible = [r for r in train if in_slices(r, VISIBLE)]
    rest = [r for r in train if not in_slices(r, VISIBLE)]
    fits = dict(designs(fit, three_terms, features))
    fits.update({"baseline: " + BASELINE_NAME: lambda rows: paper_cpu, "nearest training row (a lookup)": nearest_row})
    found = {}
    for name, make in fits.items():
        found[name] = (mape(make(train), train), mape(make(rest), visible), mape(make(train), held))
        out(f"{name:<66} train {100 * found[name][0]:5.1f}%  visible {100 * found[name][1]:5.1f}%  "
            f"held out {100 * found[name][2]:5.1f}%   (target {100 * THRESHOLD:.0f}%)")
    return found


TRAINING_NOTE = ("Training file: the measured grid less the slices held out to grade Lab 03's calibration (instructors "
                 "only; the grid is miniengine.course.step_times's).")  # never which slices: the file ships


def write_split() -> None:
    """Rewrite the training and held-out files from their union, or from a fresh measurement of the whole grid
    written to the training file (``python -m miniengine.course.step_times --out data/step_times/cpu.csv``)."""
    train, held = load()
    fresh = any(in_slices(r, HELD_OUT) for r in train)  # the whole grid is there: the old held-out file is stale
    rows = sorted(train if fresh else train + held, key=lambda r: (list(step_times.SHAPES).index(r["model"]),
                                                                   r["phase"] != "decode", r["batch"], r["context"]))
    notes = step_times.read_notes(step_times.STEP_TIMES)
    keep = [n for n in notes if not n.startswith(("Training file", "Held-out file"))]
    train, held = split(rows)
    step_times.write_csv(train, step_times.STEP_TIMES, "\n".join(keep + [TRAINING_NOTE]))
    step_times.write_csv(held, HIDDEN_FILE, "\n".join(keep + [
        "Held-out file (instructors only, never published): decode at batch 24, decode at context 262, prefill "
        "of 128-token prompts; read by the grader's judge of Lab 03's design-mape-hidden cell."]))


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--split" in args:
        write_split()
    elif "--measure" in args:
        from autograder.qa.design.lab03_measure import measure_held_out

        measure_held_out(args[args.index("--measure") + 1])
        sys.exit(0)
    elif "--merge" in args:
        from autograder.qa.design.lab03_measure import merge_held_out

        merge_held_out(args[args.index("--merge") + 1])
    report()
