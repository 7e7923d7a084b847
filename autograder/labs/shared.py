"""What several labs' checks share, written once: token runs compared with a message in words, and the block pool's
state and invariants (labs 05 and 06 hold a student's ``BlockManager`` to the same pool).

``pristine`` (autograder/labs/__init__.py) reloads this module before any lab's harness, so a cell that patched one of
these functions is undone before the next test runs, as for the harnesses themselves.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np

import autograder.notebook_checks as checks


# ---------------------------------------------------------------- token runs

def first_difference(got, want) -> int:
    """The first step at which two runs (or two texts) part: the shorter one's length where one is a prefix of the
    other."""
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def difference(tok, got: list[int], want: list[int]) -> str:
    """Where two runs first part, for a message: the step, and each run's token there, decoded."""
    t = first_difference(got, want)
    shown = [checks.show(tok, run[t]) if t < len(run) else "no more tokens" for run in (want, got)]
    return f"first difference at step {t}: expected {shown[0]}, got {shown[1]}"


def compare_tokens(got, want, what, seq=None, observe=False):
    """Your engine's tokens, as plain ints, against the golden ones: a failure names the first difference, decoded,
    and says whether the sequence was preempted and recomputed. ``observe`` also hands the tokens to the grader."""
    got = checks.as_tokens(got, f"{what}: token_ids")
    if observe:
        checks.observe(f"{what}: token_ids", got, expect=want)
    preempted = getattr(seq, "num_preemptions", 0)
    assert got == want, (f"{what}: {difference(checks.load_tokenizer(), got, want)}"
                         + (f" (this sequence was preempted {preempted} time(s) and recomputed)" if preempted else ""))


# ---------------------------------------------------------------- the block pool (labs 05 and 06)

def as_ints(xs, what):
    """Block ids as a list of plain ints (a deque, a list, a tensor...)."""
    if isinstance(xs, (str, bytes, dict)) or not hasattr(xs, "__iter__"):
        raise AssertionError(f"{what}: expected a list of block ids, got {type(xs).__name__}")
    return [checks.as_count(x, f"{what}[{i}]") for i, x in enumerate(list(xs))]


def state(bm, where):
    """Your manager's free list, reference counts and block tables, as plain ints."""
    free = as_ints(bm.free_blocks, f"{where}: free_blocks")
    refs = as_ints(bm.ref_count, f"{where}: ref_count")
    if not isinstance(bm.block_tables, dict):
        raise AssertionError(f"{where}: block_tables must be a dict seq_id -> list of blocks, got "
                             f"{type(bm.block_tables).__name__}")
    tables = {checks.as_count(k, f"{where}: a key of block_tables"): as_ints(t, f"{where}: block_tables[{k!r}]")
              for k, t in bm.block_tables.items()}
    return free, refs, tables


def check_pool(free, refs, tables, num_blocks, where):
    """Reference counts equal the tables holding each block; the free list holds each free block once; no leak."""
    assert len(refs) == num_blocks, f"{where}: ref_count has {len(refs)} entries, expected one per block ({num_blocks})"
    held = Counter()
    for sid, table in sorted(tables.items()):
        bad = sorted({b for b in table if not 0 <= b < num_blocks})
        assert not bad, f"{where}: sequence {sid}'s table holds {bad}, which are not block ids (0..{num_blocks - 1})"
        twice = sorted(b for b, c in Counter(table).items() if c > 1)
        assert not twice, f"{where}: sequence {sid}'s table {table} holds block(s) {twice} twice"
        held.update(table)
    for b in range(num_blocks):
        holders = [sid for sid, t in sorted(tables.items()) if b in t]
        assert refs[b] == held[b], (f"{where}: block {b} is held by {held[b]} block table(s) (sequences {holders}), "
                                    f"but ref_count[{b}] is {refs[b]}")
    bad = sorted({b for b in free if not 0 <= b < num_blocks})
    assert not bad, f"{where}: the free list holds {bad}, which are not block ids (0..{num_blocks - 1})"
    twice = sorted(b for b, c in Counter(free).items() if c > 1)
    assert not twice, f"{where}: the free list holds block(s) {twice} more than once"
    busy = sorted(set(free) & set(held))
    assert not busy, (f"{where}: block(s) {busy} are on the free list, but a block table still holds them: a shared "
                      f"block may go back on the free list only when its last holder lets go of it")
    leaked = sorted(set(range(num_blocks)) - set(free) - set(held))
    assert not leaked, (f"{where}: {len(leaked)} block(s) leaked: {leaked} are neither on the free list nor in any "
                        f"block table")


@contextlib.contextmanager
def replaying(tracker):
    """A failure inside one of a tracker's operations ends with the operations that led to it (the last eight), so
    that you can replay them on your class. Only the outermost operation adds them: a preemption (free) happens
    inside a decode step (append). ``tracker`` has ``history``, ``depth``, ``num_blocks`` and ``block_size``."""
    tracker.depth += 1
    try:
        yield
    except AssertionError as e:
        if tracker.depth > 1:
            raise
        h = tracker.history
        more = f"{len(h) - 8} earlier operations, then " if len(h) > 8 else ""
        raise AssertionError(f"{str(e).rstrip('.')}. The operations so far: BlockManager(num_blocks="
                             f"{tracker.num_blocks}, block_size={tracker.block_size}), then {more}"
                             f"{'; '.join(h[-8:])}") from None
    finally:
        tracker.depth -= 1


# ---------------------------------------------------------------- graded numbers (labs 04, 05)

def _number(ns, name):
    if name not in ns:
        raise NameError(f"{name} is not defined: set it in the cell above")
    x = ns[name]
    ok = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
    assert ok and np.isfinite(x), f"{name} should be a number (an int or a float), got {type(x).__name__} {x!r:.40}"
    return float(x)


def check_numbers(ns, tolerances: dict) -> None:
    """Visible: each answer is a finite number; its value is checked only when graded (when_graded)."""
    for name, tolerance in tolerances.items():
        checks.observe(f"{name} (within {tolerance:g})", _number(ns, name), tol=tolerance, when_graded=True)


def report_numbers(ns, tolerances: dict) -> None:
    """Hidden: each answer's value; the grader compares it with the right one, which never enters the notebook."""
    for name, tolerance in tolerances.items():
        checks.observe(f"hidden: {name} (within {tolerance:g})", _number(ns, name), tol=tolerance)
