"""What a test cell measured of the student's code, handed to the grader, which decides outside the kernel.

A verdict never rests on the kernel's word (autograder/README.md, Trust model): the student's code runs in the same
kernel as the tests, and code there could make a test cell do nothing and raise nothing.  So every check of a
harness, besides its own assertion (which gives the student its message at once), ``observe``s the student's
output in plain values: a token list, a mask's kept ids, a count, a measured ratio.  When the cell ends, the
observations leave the kernel as one display output (``flush``, called by every ``check_``/``report_`` function
of a harness: see ``autograder.labs.pristine``), and the trusted worker compares them with the lab's answer sheet
(autograder/grade/verdicts.py): the same observations made on the course's solution, with what each must equal or
stay within.  A cell that reported nothing, or other values, fails there, whatever happened in the kernel.

``expect`` is what the harness knows the value must be (a visible test's literal); a hidden test passes nothing,
and the sheet holds the solution's value.  ``tol``/``rel`` allow a float that far off, ``at_most``/``at_least``
bound a measured quantity (a design target), and ``judge`` names a comparison of the worker's own
(``verdicts.JUDGES``), for a measure whose truth never enters the kernel.

Partial credit.  A design target observed with ``baseline`` (the value the course's baseline design measures)
scores on a scale, not all or nothing: full points when the value meets the target, none at the baseline's value
or beyond it, a linear share between (``credit``).  Its harness does not raise in the kernel when the target is
missed, so that the worker can give the share; it raises only when the student's output is wrong.
``when_graded`` marks a value whose truth only the grader has (a graded number): ``check`` shows it as checked
only when the notebook is graded, and counts no points for it.
"""
from __future__ import annotations

import math

MIME = "application/vnd.miniengine.observations+json"
_UNSET = object()
_rows: list[dict] = []


def plain(value):
    """A JSON value: bools, ints, floats (a non-finite one as its name), strings, None, and lists and string-keyed
    dicts of them.  Anything else is the harness's mistake: it converts the student's output first."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: plain(v) for k, v in value.items()}
    raise TypeError(f"observe takes plain values (convert the student's output first), got {type(value).__name__}")


def observe(label: str, value, *, expect=_UNSET, tol: float | None = None, rel: float | None = None,
            at_most: float | None = None, at_least: float | None = None, judge: str | None = None,
            baseline: float | None = None, when_graded: bool = False) -> None:
    """Record that this cell measured ``value`` (labelled, unique within the cell) and how it is judged."""
    if baseline is not None and (at_most is None) == (at_least is None):
        raise ValueError(f"{label}: a baseline scales credit towards one target: give at_most or at_least, not both")
    row = {"label": str(label), "value": plain(value)}
    if expect is not _UNSET:
        row["expect"] = plain(expect)
    for key, bound in (("tol", tol), ("rel", rel), ("at_most", at_most), ("at_least", at_least), ("judge", judge),
                       ("baseline", baseline)):
        if bound is not None:
            row[key] = bound if isinstance(bound, str) else float(bound)
    if when_graded:
        row["when_graded"] = True
    _rows.append(row)


def credit(value, *, at_most: float | None = None, at_least: float | None = None,
           baseline: float | None = None) -> float:
    """The share of a design target's points that ``value`` earns, in [0, 1]: 1 when it meets the target
    (``at_most`` or ``at_least``), 0 at the baseline's value or beyond it, linear between; with no baseline, 1 or 0.
    A value that is not a finite number earns 0."""
    if (at_most is None) == (at_least is None):
        raise ValueError("credit needs one target: at_most or at_least")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    target, sign = (at_most, 1.0) if at_most is not None else (at_least, -1.0)
    if sign * (value - target) <= 0:
        return 1.0
    if baseline is None or sign * (baseline - target) <= 0:  # no scale, or a baseline no worse than the target
        return 0.0
    return max(0.0, min(1.0, (baseline - value) / (baseline - target)))


def missed_target(value, row: dict) -> str:
    """What a missed target says, to the student and in the grade: the value, the target, and for a scaled one the
    course baseline's value and the share earned.  (The grader and ``check`` both say it this way.)"""
    key, words = ("at_most", "at most") if "at_most" in row else ("at_least", "at least")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{row['label']}: expected a finite number, got {str(value)[:60]}"
    if "baseline" not in row:
        return f"{row['label']}: {value:.6g}, where {words} {row[key]:.6g} is required"
    return (f"{row['label']}: {value:.6g}; full points need {words} {row[key]:.6g}, none at "
            f"{row['baseline']:.6g} or beyond: {row_credit(value, row):.0%} of them")


def row_credit(value, row: dict) -> float:
    """``credit`` for a row of the ledger or of an answer sheet (its at_most/at_least and baseline)."""
    return credit(value, at_most=row.get("at_most"), at_least=row.get("at_least"), baseline=row.get("baseline"))


def pending() -> list[dict]:
    return list(_rows)


def flush() -> None:
    """Hand the observations made so far to the grader, as one display output of the running cell."""
    if not _rows:
        return
    rows = list(_rows)
    del _rows[:]
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    if get_ipython() is None:
        return  # not in a kernel (a unit test): nobody to hand them to
    display({MIME: {"rows": rows}}, raw=True)


def reported(fn):
    """``fn`` (a harness's check), flushing what it observed when it returns or raises."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            flush()

    return wrapper


def observations(cell) -> list[dict] | None:
    """Every row the cell's checks handed out, in order; None when the cell handed out nothing at all."""
    payloads = [o["data"][MIME] for o in cell.get("outputs", [])
                if o.get("output_type") in ("display_data", "execute_result") and MIME in o.get("data", {})]
    if not payloads:
        return None
    rows = []
    for p in payloads:
        if not (isinstance(p, dict) and isinstance(p.get("rows"), list)):
            raise ValueError("malformed")
        rows += p["rows"]
    if not all(isinstance(r, dict) and isinstance(r.get("label"), str) and "value" in r for r in rows):
        raise ValueError("malformed")
    return rows
