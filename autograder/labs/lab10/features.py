"""Task 4, what a client sends: ``process_row(logits, prompt_ids, output_ids, params)`` (the penalties and ``min_p``)
and ``StopRules`` (``find_stop`` and ``sendable``), your own, served. Reloaded by ``autograder.labs.lab10``.

Two halves, visible and hidden alike:

* by hand: your ``process_row`` on seeded random rows (each penalty alone, together, ``min_p`` at a temperature, a
  greedy row), the tokens it keeps and their logits; your ``find_stop`` and ``sendable`` on fixed texts. Each result
  is observed: visible, against the course's own functions (miniengine/logits_processors.py and stop_strings.py);
  hidden, the grader compares it with the course's solution's.
* served: the harness writes the cells that define them into a module of their own (the same way ``own`` saves a
  lab: autograder/own/source.py) and starts ``python -m miniengine serve`` with ``--logits-processor`` and
  ``--stop-strings`` naming it, on the harness's own flags (your ``serve_flags`` is Task 1's, not this task's). Its own
  client sends the penalty, ``min_p`` and stop-string cases; tokens and text must be the golden ones (hidden: they go
  to the grader).
"""
from __future__ import annotations

import contextlib
import random
import tempfile
from pathlib import Path

import numpy as np

import autograder.notebook_checks as checks
from autograder.labs.lab10 import common
from miniengine.sampling import SamplingParams

# The harness's own engine for this task: the tests' budgets (serving.SERVED), as flags, with no part of the student's.
FLAGS = ["--max-num-seqs", "8", "--max-num-batched-tokens", "64", "--enable-chunked-prefill", "true",
         "--kv-cache-tokens", "4096"]
MODULE = "lab10_your_features"  # the module the served check writes your cells into
VOCAB = 48

# (what, sampling parameters) for the rows by hand: each feature alone, together, and where it must do nothing.
ROW_PARAMS = [
    ("repetition penalty 1.3", dict(temperature=1.0, repetition_penalty=1.3)),
    ("repetition penalty 0.8 (a reward)", dict(temperature=1.0, repetition_penalty=0.8)),
    ("frequency 0.5 and presence 0.4", dict(temperature=1.0, frequency_penalty=0.5, presence_penalty=0.4)),
    ("negative frequency and presence", dict(temperature=1.0, frequency_penalty=-0.7, presence_penalty=-0.3)),
    ("min_p 0.05 at temperature 0.7", dict(temperature=0.7, min_p=0.05)),
    ("min_p 0.2 at temperature 1.5", dict(temperature=1.5, min_p=0.2)),
    ("everything at once", dict(temperature=0.8, repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2,
                                min_p=0.1)),
    ("greedy with min_p (min_p does nothing)", dict(temperature=0.0, min_p=0.5, repetition_penalty=1.1)),
]


def rows(seed: int, n: int = 3):
    """(logits, prompt_ids, output_ids) rows: ties, repeats in the prompt and the output, negative logits."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        logits = np.array([round(rng.gauss(0, 2.5), 1) for _ in range(VOCAB)], dtype=np.float64)
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))]
        output = [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 10))] + [prompt[0]] * rng.randrange(0, 3)
        out.append((logits, prompt, output))
    return out


def _own_class(cls, name: str):
    import inspect

    assert inspect.isclass(cls) and getattr(cls, "__module__", None) == "__main__", (
        f"{name} must be a class written with class in this notebook, got {type(cls).__name__} "
        f"from {getattr(cls, '__module__', None)!r}")


ANSWER_KEY = {  # this task's answer key: the course's own, which the server runs when no plug names yours
    "miniengine.logits_processors": ["process_row", "apply_penalties", "min_p_mask"],
    "miniengine.stop_strings": ["find_stop", "sendable", "held_back", "stopped_text"],
}


def _call(fn, what, *args):
    """Your function on ``args``, with this task's answer key forbidden while it runs."""
    try:
        with checks.reference_forbidden(what, forbidden=ANSWER_KEY):
            return fn(*args)
    except (NotImplementedError, AssertionError):
        raise
    except Exception as e:
        raise AssertionError(f"{what}: raised {type(e).__name__}: {str(e)[:200]}") from None


def _row_result(got, what):
    try:
        row = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        raise AssertionError(f"{what}: process_row must return a row of {VOCAB} floats, got {type(got).__name__}") \
            from None
    assert row.shape == (VOCAB,), f"{what}: process_row must return a row of {VOCAB} logits, got shape {row.shape}"
    assert not np.isnan(row).any(), f"{what}: the row holds NaN (a masked token is -inf)"
    kept = [int(i) for i in np.flatnonzero(np.isfinite(row))]
    return kept, [float(row[i]) for i in kept]


def check_rows(process_row, seed: int, label: str = "", hidden: bool = False) -> int:
    """Your process_row on each ROW_PARAMS setting over seeded rows: the tokens kept and their logits (within 1e-9)."""
    from miniengine.logits_processors import process_row as course

    checks.require_own(process_row, "process_row")
    n = 0
    for what, kw in ROW_PARAMS:
        params = SamplingParams(max_tokens=1, **kw)
        for i, (logits, prompt, output) in enumerate(rows(seed + n)):
            where = f"{label}{what}, row {i}"
            got = _row_result(_call(process_row, where, logits.copy(), list(prompt), list(output), params), where)
            want = _row_result(course(logits.copy(), prompt, output, params), where)
            if hidden:
                checks.observe(f"{where}: tokens kept", got[0])
                checks.observe(f"{where}: their logits", got[1], tol=1e-9)
                continue
            checks.observe(f"{where}: tokens kept", got[0], expect=want[0])
            assert got[0] == want[0], (f"{where}: your row keeps tokens {got[0]}, the course's {want[0]} (prompt "
                                       f"{prompt}, output {output}, logits {logits.tolist()})")
            checks.observe(f"{where}: their logits", got[1], expect=want[1], tol=1e-9)
            far = [(t, a, b) for t, a, b in zip(got[0], got[1], want[1]) if abs(a - b) > 1e-9]
            assert not far, (f"{where}: token {far[0][0]}'s logit is {far[0][1]!r}, expected {far[0][2]!r} (prompt "
                             f"{prompt}, output {output}, its raw logit {float(logits[far[0][0]])!r})")
        n += 1
    return n


# (what, text, stops) for find_stop; (what, text, stops, finished) for sendable.
FIND = [("one stop, inside the text", "def f(x):\n    return x\n\n", ["\n\n"]),
        ("none found", "x = 1", ["\n\n", "def"]),
        ("the earliest end wins, not the earliest start", "x = foo(bar)", ["= foo(bar)", "foo"]),
        ("at the same end, the longer", "for i in range", ["range", "in range"]),
        ("a stop at the very start", "#!/bin", ["#"])]
SEND = [("running, a two-character stop held back one", "x = 1\n", ["\n\n"], False),
        ("finished: all of it", "x = 1\n", ["\n\n"], True),
        ("running, no stop strings", "abc", [], False),
        ("running, an incomplete character at the end", "caf\ufffd", ["!"], False),
        ("running, shorter than what is held back", "ab", ["abcdef"], False)]


def _match(m, what):
    if m is None:
        return None
    try:
        return [str(m.stop), int(m.start), int(m.end)]
    except (AttributeError, TypeError, ValueError):
        raise AssertionError(f"{what}: find_stop must return None or a match with .stop, .start and .end, got "
                             f"{type(m).__name__}") from None


def check_stop_rules(StopRules, find=FIND, send=SEND, label: str = "", hidden: bool = False) -> int:
    """Your StopRules().find_stop and .sendable on fixed texts, against the course's (miniengine/stop_strings.py)."""
    from miniengine import stop_strings as course

    _own_class(StopRules, "StopRules")
    rules = _call(StopRules, f"{label}StopRules()")
    for what, text, stops in find:
        where = f"{label}find_stop, {what}"
        got = _match(_call(rules.find_stop, where, text, list(stops)), where)
        want = _match(course.find_stop(text, stops), where)
        checks.observe(where, got, **({} if hidden else {"expect": want}))
        assert hidden or got == want, (f"{where}: find_stop({text!r}, {stops}) gave {got}, expected {want} "
                                       f"([stop, start, end])")
    for what, text, stops, finished in send:
        where = f"{label}sendable, {what}"
        got = _call(rules.sendable, where, text, list(stops), finished)
        assert isinstance(got, str), f"{where}: sendable must return a str, got {type(got).__name__}"
        want = course.sendable(text, stops, finished)
        checks.observe(where, got, **({} if hidden else {"expect": want}))
        assert hidden or got == want, (f"{where}: sendable({text!r}, {stops}, finished={finished}) gave {got!r}, "
                                       f"expected {want!r}")
    return len(find) + len(send)


@contextlib.contextmanager
def _served(ns: dict, what: str):
    """The server with your two parts plugged: the cells that define them, written as a module of their own."""
    from autograder.own import source

    text, lost, _ = source.from_kernel(10, ns, ["process_row", "StopRules"], [])
    assert not lost, f"{what}: the cell that defines {', '.join(lost)} was not found (define it with def or class)"
    folder = Path(tempfile.mkdtemp(prefix="lab10-features-"))
    (folder / f"{MODULE}.py").write_text(text, encoding="utf-8")
    flags = FLAGS + ["--logits-processor", f"{MODULE}:process_row", "--stop-strings", f"{MODULE}:StopRules"]
    with common.server(flags, what, path=str(folder)) as url:
        yield url


def check_served_features(process_row, StopRules, ns, files, label: str = "") -> int:
    """Visible: every case of ``files`` served with your process_row and StopRules; tokens, text, finish reason."""
    checks.require_own(process_row, "process_row")
    _own_class(StopRules, "StopRules")
    cases = common.load_cases(files)
    tok = checks.load_tokenizer()
    with _served(ns, f"{label}the server with your process_row and StopRules") as url:
        answers = common.complete_all(url, [c for _, c in cases])
    for (file, case), answer in zip(cases, answers):
        common.compare_answer(f"{label}{file} {case['name']}, your features served", answer, case, tok)
    return len(cases)


def report_served_features(process_row, StopRules, ns, report, label: str = "hidden: ") -> int:
    """Hidden: every hidden penalty and stop-string case served with yours; tokens and text go to the grader."""
    checks.require_own(process_row, "process_row")
    _own_class(StopRules, "StopRules")
    due = [(f, c) for f in ("sampling_features", "lab10_stops") for c in report.cases(f)]
    with _served(ns, f"{label}the server with your process_row and StopRules") as url:
        answers = common.complete_all(url, [c for _, c in due])
    for (file, case), answer in zip(due, answers):
        report.add(file, case, "token_ids", answer["token_ids"])
        report.add(file, case, "text", answer["text"])
    return len(due)

