"""The grader's own comparisons, for measures whose truth never enters the kernel (autograder/grade/verdicts.py).

A harness observes a value with ``judge="name"`` (autograder/notebook_checks/ledger.py); the worker calls ``JUDGES[name](value,
row)`` outside the sandbox, where the hidden data is, and gets None (it holds) or what is wrong, in words a student
may read: never a hidden value.
"""
from __future__ import annotations

JUDGES: dict[str, object] = {}


# ---------------------------------------------------------------- lab 03: the held-out step times

# Lab 03's held-out slices of the measured step times, (phase, field, value), in the order the hidden cell lists them
# (autograder/qa/design/lab03.py, HELD_OUT: tests/autograder/test_step_times.py keeps the two equal); a row belongs to the first
# that matches.  The measured times are in the instructors' file below, which never enters the sandbox.
LAB03_SLICES = (("decode", "batch", 24), ("decode", "context", 262), ("prefill", "context", 128))


def lab03_heldout_file():
    from autograder.hidden_outputs import HIDDEN_DIR

    return HIDDEN_DIR / "step_times_heldout.csv"


def lab03_slice_name(row: dict) -> str | None:
    """The slice a held-out row belongs to, as messages name it: 'decode at batch 24', 'prefill of 128-token
    prompts'; None for a row of no held-out slice."""
    for phase, field, value in LAB03_SLICES:
        if row["phase"] == phase and row[field] == value:
            return f"{phase} at {field} {value}" if phase == "decode" else f"prefill of {value}-token prompts"
    return None


def lab03_heldout_rows() -> list[dict]:
    """The held-out rows, in the hidden cell's order: slice by slice (LAB03_SLICES), each in the file's order; a row
    as miniengine.course.step_times.read_csv gives it (read here with the csv module: the worker need not import
    torch)."""
    import csv

    with open(lab03_heldout_file()) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    rows = [{k: (v if k in ("phase", "model") else float(v) if k == "step_ms" else int(v)) for k, v in r.items()}
            for r in rows]
    names = [lab03_slice_name(r) for r in rows]
    order = {f"{p} at {f} {v}" if p == "decode" else f"prefill of {v}-token prompts": i
             for i, (p, f, v) in enumerate(LAB03_SLICES)}
    return [r for _, _, r in sorted((order.get(n, len(order)), i, r) for i, (n, r) in enumerate(zip(names, rows)))]


def _lab03_likely_cause(found) -> str:
    """The harness's own hint (autograder/labs/lab03/calibrate.py), on (predicted ms, measured ms, row): a cause, no
    value. The worker reads it from the course's file, never from the kernel."""
    from autograder.labs.lab03.calibrate import likely_cause

    return likely_cause(found)


def lab03_heldout_mape(value, row: dict) -> str | tuple[float, str] | None:
    """Lab 03's design-mape-hidden: ``value`` is the student's predicted step_ms on the held-out configurations, in
    the cell's order (lab03_heldout_rows); the mean absolute percentage error over all of them earns full points at
    most ``row["at_most"]`` and, with ``row["baseline"]`` (the uncalibrated baseline's MAPE), a linear share of them
    between the two: the answer is then (share, message).  The message names each slice's MAPE, never a point's
    time."""
    import math
    import statistics

    label = row["label"]
    try:
        rows = lab03_heldout_rows()
    except OSError:
        return f"{label}: the grader has no held-out step times to judge against (autograder/hidden/ is missing)"
    if not (isinstance(value, list) and len(value) == len(rows)):
        got = f"{len(value)} values" if isinstance(value, list) else type(value).__name__
        return f"{label}: expected {len(rows)} predictions, one per held-out configuration, got {got}"
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p > 0 for p in value):
        return f"{label}: every prediction must be a positive, finite number of milliseconds"
    found = [(float(p), r["step_ms"], r) for p, r in zip(value, rows)]
    mape = statistics.fmean(abs(p - m) / m for p, m, _ in found)
    groups: dict[str, list] = {}
    for f in found:
        groups.setdefault(lab03_slice_name(f[2]), []).append(f)
    slices = ", ".join(f"{name} {100 * statistics.fmean(abs(p - m) / m for p, m, _ in g):.1f}% ({len(g)} points)"
                       for name, g in groups.items())
    if mape <= row["at_most"]:
        return None
    if "baseline" not in row:
        return (f"{label}: MAPE {100 * mape:.1f}%, over the {100 * row['at_most']:.0f}% allowed; by slice: {slices}."
                + _lab03_likely_cause(found))
    # Partial credit: full at the target, none at the uncalibrated baseline's MAPE, linear between.
    from autograder.notebook_checks.ledger import credit

    share = credit(mape, at_most=row["at_most"], baseline=row["baseline"])
    return share, (f"{label}: MAPE {100 * mape:.1f}%, over the {100 * row['at_most']:.0f}% target: {share:.0%} of the "
                   f"points (none from the uncalibrated baseline's {100 * row['baseline']:.0f}%); by slice: {slices}."
                   + _lab03_likely_cause(found))


JUDGES["lab03-heldout-mape"] = lab03_heldout_mape


# ---------------------------------------------------------------- lab 02: the hidden text's perplexity

def lab02_hidden_ppl(value, row: dict) -> str | tuple[float, str] | None:
    """Lab 02's design-kv-ppl-hidden: ``value`` is the perplexity of every hidden window through the student's
    low-bit cache; its increase over the float32 cache's on the same windows through the same path, which the
    instructors' file holds (autograder/hidden/kv_text.json, measured by autograder/qa/design/lab02.py) and the kernel
    never sees, earns full points at most ``row["at_most"]`` and, with ``row["baseline"]`` (the increase that earns
    nothing), a linear share between the two: the answer is then (share, message).  The message gives the increase,
    not the yardstick."""
    import json
    import math

    from autograder.hidden_outputs import HIDDEN_DIR

    label = row["label"]
    try:
        float32_ppl = json.loads((HIDDEN_DIR / "kv_text.json").read_text())["float32_perplexity"]
    except (OSError, KeyError, ValueError):
        return f"{label}: the grader has no hidden text to judge against (autograder/hidden/ is missing)"
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
        return f"{label}: expected a positive, finite perplexity, got {value!r}"
    increase = value / float32_ppl - 1
    if increase <= row["at_most"]:
        return None
    missed = (f"{label}: {increase:+.2%} over the float32 cache's perplexity on the same windows through the same "
              f"path, over the +{row['at_most']:.1%} target")
    if "baseline" not in row:
        return missed
    from autograder.notebook_checks.ledger import credit

    share = credit(increase, at_most=row["at_most"], baseline=row["baseline"])
    return share, f"{missed}: {share:.0%} of the points (none from +{row['baseline']:.1%})"


JUDGES["lab02-hidden-ppl"] = lab02_hidden_ppl
