"""Helpers that the labs' test cells and harnesses use: strict conversions, the reference guard, golden logits.

A test cell reloads this module first (through ``autograder.labs.pristine``), and this module reloads each
of its parts, so whatever an earlier cell did to a helper is undone before the tests use it.  The tests
themselves read the golden files with ``json`` and compare plain Python values; nothing here computes an
expected answer.

Why each helper exists, and where it lives (autograder/notebook_checks/):
  * ``as_token`` / ``as_mask`` (convert.py) turn a student's output into plain ints and bools
    first, so an object whose ``__eq__`` always returns True cannot pass.
  * ``reference_forbidden`` (guard.py) makes the course's reference sampler and decoder
    fail loudly while a test runs, however the student imported or renamed them.
  * ``golden_logits`` (runs.py) gives the logits at every step of a golden run from one
    float64 forward pass, so the sampler tests cost one forward per case.
  * ``HiddenReport`` (hidden_report.py) hands a hidden cell's outputs to the grader, which compares them
    outside the sandbox.
  * ``observe`` (ledger.py) records what a check measured of the student's code; the grader judges it against
    the lab's answer sheet, outside the kernel (autograder/grade/verdicts.py).
  * ``course_parts_under`` (course_parts.py) lends a test the course's versions of the earlier
    tasks that the function under test calls by name, so that one mistake costs only the task it is in.
"""
from __future__ import annotations

import importlib

from autograder.notebook_checks import convert, course_parts, guard, hidden_report, ledger, runs

# Each part afresh, each one's dependencies before it (hidden_report uses convert; course_parts uses guard).
for _part in (ledger, guard, convert, runs, hidden_report, course_parts):
    importlib.reload(_part)

from autograder.notebook_checks.convert import as_count, as_mask, as_token, as_tokens, show  # noqa: E402
from autograder.notebook_checks.course_parts import COURSE_PARTS, course_greedy, course_parts_under  # noqa: E402
from autograder.notebook_checks.guard import (FORBIDDEN, AnswerKeyError, ReferenceCalled, _functions, _resolve,  # noqa: E402
                                              forbidden_call, reference_forbidden, require_own)
from autograder.notebook_checks.hidden_report import HiddenReport, hidden_inputs  # noqa: E402
from autograder.notebook_checks.ledger import observe  # noqa: E402
from autograder.notebook_checks.runs import (HIDDEN_GOLDEN, TARGET, VISIBLE_GOLDEN, RecordingModel,  # noqa: E402
                                             check_prefix_recompute, free_run, golden_logits, load_model,
                                             load_tokenizer, one_case_per_kind, prompt_logits, tokens_processed)

__all__ = ["as_count", "as_mask", "as_token", "as_tokens", "show", "COURSE_PARTS", "course_greedy",
           "course_parts_under", "FORBIDDEN", "AnswerKeyError", "ReferenceCalled", "forbidden_call",
           "reference_forbidden", "require_own", "HiddenReport", "hidden_inputs", "observe", "HIDDEN_GOLDEN", "TARGET",
           "VISIBLE_GOLDEN", "RecordingModel", "check_prefix_recompute", "free_run", "golden_logits", "load_model",
           "load_tokenizer", "one_case_per_kind", "prompt_logits", "tokens_processed"]
