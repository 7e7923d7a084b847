"""Lab 03's held-out step times, re-measured: one run at a time on different days, then each point's median.

    python -m autograder.qa.design.lab03 --measure DIR   # one run of the 45 held-out points (about a minute, idle)
    python -m autograder.qa.design.lab03 --merge DIR     # autograder/hidden/step_times_heldout.csv := the medians

Only on an idle machine: a step timed while other jobs run can take several times as long.  The protocol is the
shipped file's (miniengine.course.step_times: one torch thread, the median of 9 decode steps or 5 prefills a point).
"""
from __future__ import annotations

from autograder.qa.design import lab03
from miniengine.course import step_times


def measure_held_out(folder) -> None:
    """One run of the 45 held-out points, with the shipped file's protocol, into folder/heldout-<UTC time>.csv."""
    import datetime
    from pathlib import Path

    batches = [b for b in step_times.DECODE_BATCHES if b != 24]
    points = (step_times.measure(decode_batches=(24,), prefill_batches=())
              + step_times.measure(decode_batches=batches, decode_contexts=(256,), prefill_batches=())
              + step_times.measure(decode_batches=(), prefill_lengths=(128,)))
    held = [p.row() for p in points if lab03.in_slices(p.row(), lab03.HELD_OUT)]
    assert len(held) == 45, f"expected the 45 held-out points, measured {len(held)}"
    now = datetime.datetime.now(datetime.timezone.utc)
    out = Path(folder) / f"heldout-{now:%Y%m%dT%H%M%SZ}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    note = f"One run of Lab 03's held-out points, {now:%Y-%m-%d %H:%M} UTC; {step_times.machine()}"
    step_times.write_csv(held, out, note)
    print(f"wrote {out}")


def merge_held_out(folder) -> None:
    """The held-out file := each point's median over folder's runs (at least 3, on different days)."""
    import statistics
    from pathlib import Path

    runs = sorted(Path(folder).glob("heldout-*.csv"))
    assert len(runs) >= 3, f"{folder}: {len(runs)} runs; measure on at least 3 different days first"
    key = lambda r: (r["model"], r["phase"], r["batch"], r["context"])  # noqa: E731
    times: dict = {}
    for run in runs:
        for r in step_times.read_csv(run):
            times.setdefault(key(r), (r, []))[1].append(r["step_ms"])
    order = [key(r) for r in lab03.load()[1]] or sorted(times)
    rows = [dict(times[k][0], step_ms=round(statistics.median(times[k][1]), 4)) for k in order]
    spread = max(max(v) / min(v) - 1 for _, v in times.values())
    notes = [n for n in step_times.read_notes(step_times.STEP_TIMES) if not n.startswith("Training file")]
    step_times.write_csv(rows, lab03.HIDDEN_FILE, "\n".join(notes + [
        f"Held-out file (instructors only, never published): each point the median over {len(runs)} runs "
        f"({', '.join(r.stem[8:16] for r in runs)}); the largest spread of a point between runs {100 * spread:.0f}%.",
        "Slices: decode at batch 24, decode at context 262, prefill of 128-token prompts; read by the grader's judge "
        "of Lab 03's design-mape-hidden cell."]))
    print(f"wrote {lab03.HIDDEN_FILE}: {len(rows)} points, medians of {len(runs)} runs")
