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
            at_most: float | None = None, at_least: float | None = None, judge: str | None = None) -> None:
    """Record that this cell measured ``value`` (labelled, unique within the cell) and how it is judged."""
    row = {"label": str(label), "value": plain(value)}
    if expect is not _UNSET:
        row["expect"] = plain(expect)
    for key, bound in (("tol", tol), ("rel", rel), ("at_most", at_most), ("at_least", at_least), ("judge", judge)):
        if bound is not None:
            row[key] = bound if isinstance(bound, str) else float(bound)
    _rows.append(row)


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
