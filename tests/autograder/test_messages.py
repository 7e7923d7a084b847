"""What a student reads of a graded test: messages kept whole, hidden tests' messages that name the case and the step
(or the error and where it was raised, never its text), and a rank process's error in lab 09.

Fast: no nbgrader run. The end-to-end checks (a planted bug graded in a sandbox) are in test_cli.py.
"""
from __future__ import annotations

import csv
import importlib
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from autograder import results
from autograder.grade import feedback, messages

LONG = ("visible case p3-top_p, step 12: top_p_mask(p=0.9) kept 40 tokens with mass 0.9312; expected the smallest "
        "set of most likely tokens whose mass reaches 0.9. " + "The kept ids were " + ", ".join(map(str, range(90)))
        + ".\nA second line, which the message's first line alone would lose, stops at the end.")


def cell_with(*outputs, grade_id="t"):
    cell = new_code_cell("pass", metadata={"nbgrader": {"grade": True, "solution": False, "grade_id": grade_id,
                                                       "points": 2, "locked": True, "schema_version": 3}})
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


def error(ename, evalue, traceback=()):
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": list(traceback)}


VISIBLE, HIDDEN = results.TestCell("t", 2.0, False), results.TestCell("t", 2.0, True)


# ---------------------------------------------------------------- item 1: whole messages

def test_a_failing_message_is_kept_whole_in_the_table_the_csv_and_the_feedback_page(tmp_path):
    assert len(LONG) > 600 and LONG.index("stops at the end") > 300
    r = results.judge(cell_with(error("AssertionError", "\x1b[31m" + LONG + "\x1b[0m\n")), 0.0, VISIBLE, timeout=10)
    assert r.status == results.FAILED and r.message == LONG  # every line, colours and the trailing newline gone
    student = results.StudentResult("alice", "lab01_naive_decode", "a.ipynb", [r])
    table = results.table([student])
    assert LONG.splitlines()[0] in table
    second = next(line for line in table.splitlines() if "stops at the end" in line)
    assert second.startswith(" " * 47)  # under the message column, not at the left margin
    csv_path, _, _ = results.write_reports([student], tmp_path)
    assert list(csv.DictReader(open(csv_path)))[0]["message"] == LONG
    page = feedback.render(results.to_json([student])["students"][0])
    assert "stops at the end" in page and "white-space:pre-wrap" in page
    assert feedback.FOOTER in page


def test_a_message_over_the_limit_says_that_it_was_cut_and_where_the_whole_one_is():
    huge = "x" * (results.MESSAGE_LIMIT + 250)
    shown = results.whole(huge)
    assert shown.startswith("x" * results.MESSAGE_LIMIT) and "250 more characters cut here" in shown
    assert "the cell's own output in the notebook shows the message whole" in shown
    assert results.whole("short\n\n  \n") == "short"


# ---------------------------------------------------------------- item 2: hidden tests' messages

ANSI_CELL = "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[7]\x1b[39m\x1b[32m, line 6\x1b[39m, in \x1b[36mgreedy\x1b[39m\x1b[34m(logits)\x1b[39m\n      5 ..."
TEST_CELL = "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[9]\x1b[39m\x1b[32m, line 7\x1b[39m\n----> 7 lab.report_greedy(greedy, report)"
HARNESS = ("\x1b[36mFile \x1b[39m\x1b[32m/work/x/autograder/labs/lab01/__init__.py:107\x1b[39m, in \x1b[36mkeeps_k_largest\x1b[39m"
           "\x1b[34m(top_k_mask, row, k, what, hidden)\x1b[39m\n    106 ...")
GUARD = "File /work/x/autograder/notebook_checks/guard.py:110, in reference_forbidden(what, forbidden)\n    109 ..."
TORCH = "File /work/x/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1778, in _wrapped_call_impl(...)"


@pytest.mark.parametrize("output, expected", [
    (error("IndexError", "index 7 is out of bounds: 'def secret_prompt'", [TEST_CELL, HARNESS, ANSI_CELL, TORCH]),
     "error on hidden inputs: your code raised IndexError in greedy, at line 6 of its cell"),
    (error("AssertionError", "p0-greedy: top_k_mask(k=3) kept 4 tokens", [TEST_CELL, HARNESS]),
     "failed on hidden inputs: the test's check in keeps_k_largest (autograder/labs/lab01/__init__.py:107) failed; its "
     "message is withheld, as it does not name the case"),
    (error("AssertionError", "top_k_mask calls miniengine.sampling.top_k_mask: that is the course's reference "
                             "implementation. Write this part yourself (the allowed imports are listed at the top of "
                             "the lab).", [TEST_CELL, HARNESS, GUARD]),
     "failed on hidden inputs: top_k_mask calls miniengine.sampling.top_k_mask: that is the course's reference"),
    (error("IndexError", "hidden case p0-greedy (greedy), step 5: your greedy raised IndexError at line 6 of its cell",
           [TEST_CELL, ANSI_CELL]),  # what HiddenReport's handler writes in the kernel
     "hidden case p0-greedy (greedy), step 5: your greedy raised IndexError at line 6 of its cell"),
    (error("Leak", "whatever it found", [TEST_CELL, ANSI_CELL]),  # a submission's own exception class: not named
     "error on hidden inputs: your code raised an exception in greedy, at line 6 of its cell"),
    (error("ValueError", "no traceback at all"), "error on hidden inputs: your code raised ValueError"),
    ({"output_type": "stream", "name": "stderr", "text": "def secret_prompt(x):\n"},
     "failed on hidden inputs: the cell wrote to stderr, which nbgrader counts as a failure (what it wrote is withheld)"),
])
def test_a_hidden_tests_message_says_where_and_never_what_the_code_saw(output, expected):
    cell = cell_with(output)
    r = results.judge(cell, 0.0, HIDDEN, timeout=10)
    shown = messages.safe_message(r, cell, ["def secret_prompt"])
    assert shown.startswith(expected), shown
    assert "secret" not in shown and "index 7" not in shown


def test_a_hidden_message_that_quotes_a_hidden_prompt_is_withheld():
    cell = cell_with(error("AssertionError", "hidden case p0-greedy: got 'def secret_prompt'"))
    r = results.judge(cell, 0.0, HIDDEN, timeout=10)
    assert messages.safe_message(r, cell, ["def secret_prompt"]) == messages.WITHHELD


def test_hidden_report_names_the_case_and_the_step_where_the_students_code_raised():
    """HiddenReport.failure, which the kernel's exception handler calls, on lab 01's greedy run over hidden prompts."""
    lab = importlib.import_module("autograder.labs").pristine("lab01")
    calls = []

    def greedy(logits):
        calls.append(1)
        if len(calls) > 12:  # 8 hidden greedy cases per step: the 13th call is case 5's (index 4's) step 1
            raise IndexError("list index out of range")
        return int(logits.argmax())

    greedy.__module__ = "__main__"  # as if defined in a notebook (require_own)
    report = lab.checks.HiddenReport("lab01_naive_decode", "greedy-hidden")
    with pytest.raises(IndexError) as raised:
        lab.report_greedy(greedy, report)
    message = report.failure(raised.type, raised.value, raised.tb)
    name = report.cases()[4]["name"]
    assert message.startswith(f"hidden case {name} (greedy), step 1: your ")
    assert message.endswith(f"greedy raised IndexError at test_messages.py:{greedy.__code__.co_firstlineno + 3}")
    assert report.failure(ValueError, ValueError("x"), None) is None  # no frame of the student's: not named


# ---------------------------------------------------------------- item 3: a rank's error (lab 09)

RANK_TRACE = """

-- Process 1 terminated with the following error:
Traceback (most recent call last):
  File "/x/.venv/lib/python3.11/site-packages/torch/multiprocessing/spawn.py", line 87, in _wrap
    fn(i, *args)
  File "/x/miniengine/distributed/sharding.py", line 155, in forward
    out = self.all_reduce(y, self._comm)
          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/tmp/ipykernel_21087/2119030873.py", line 6, in ring_all_reduce
    return chunks[p + 3]
IndexError: tuple index out of range
"""


def test_a_rank_processs_error_reaches_the_message():
    from torch.multiprocessing import ProcessRaisedException

    lab09 = importlib.import_module("autograder.labs").pristine("lab09")
    e = ProcessRaisedException(RANK_TRACE, 1, 4242)
    assert str(e).strip().startswith("-- Process 1 terminated")  # all that its first line says
    visible = str(lab09.rank_failure(e, "visible golden cases", hidden=False))
    assert visible == ("visible golden cases on 2 ranks: rank 1 raised IndexError: tuple index out of range\n"
                       "  in ring_all_reduce, at line 6 of its cell")
    hidden = str(lab09.rank_failure(e, "hidden cases", hidden=True))
    assert hidden == "your engine on 2 ranks, hidden cases: rank 1 raised IndexError in ring_all_reduce, at line 6 of its cell"
    assert hidden.startswith(messages.HIDDEN_TEST_PREFIXES)
    assert lab09.rank_failure(RuntimeError("process 0 terminated with signal SIGKILL"), "x", False) is None
    custom = ProcessRaisedException(RANK_TRACE.replace("IndexError:", "MyLeak: def secret"), 0, 1)
    assert "an exception" in str(lab09.rank_failure(custom, "hidden cases", hidden=True))
    assert "secret" not in str(lab09.rank_failure(custom, "hidden cases", hidden=True))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
