"""What a student may read of a graded test, and the notes that explain a result (an allow-list).

A visible test's message is its own; a hidden test's is shown only when it is the test's own words (it starts
with one of HIDDEN_TEST_PREFIXES) and quotes no hidden input; otherwise the student reads the status and the
built-in exception's name.  A hidden test that passed in the kernel passes only if the outputs it reported
match the hidden golden ones, compared here, outside the sandbox.  The notes name what else happened: an
edited test cell, raised points, a non-test cell that timed out or raised.
"""
from __future__ import annotations

import builtins
import dataclasses
import re

from autograder import hidden_spec, results
from autograder.execute import KERNEL_DIED, NOT_RUN

KERNEL_DIED_NAMES = (KERNEL_DIED, NOT_RUN)
DIED = "grading process died"


# Exception names a message may show: Python's own, and the tests' own.  A submission's exception class could
# carry any name, a hidden input included.
SHOWN_ERRORS = {name for name, obj in vars(builtins).items() if isinstance(obj, type) and issubclass(obj, BaseException)}
SHOWN_ERRORS |= {"ReferenceCalled", "CellTimeoutError"}
# A hidden test's own messages start like this; anything else in a hidden cell came from the student's code,
# and could carry the hidden inputs it was given.
HIDDEN_TEST_PREFIXES = ("hidden case ", "hidden hand-made case", "your engine", "hidden, pass ")
WITHHELD = "[withheld: it quoted a hidden input]"


def hidden_secrets(golden: dict[str, dict]) -> list[str]:
    """Strings that would give a hidden input away: prompt texts and their token id lists."""
    found = set()
    for data in golden.values():
        for section in hidden_spec.SECTIONS:
            for case in data.get(section, []):
                if len(case.get("prompt", "")) >= 8:
                    found.add(case["prompt"])
                    found.add(repr(case["prompt"])[1:-1])
                ids = case.get("prompt_token_ids", [])
                if len(ids) >= 3:
                    found.add(", ".join(map(str, ids[:3])))
                    found.add(" ".join(map(str, ids[:3])))
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    return WITHHELD if any(s in text for s in secrets) else text


def safe_message(test: results.TestResult, cell, secrets: list[str]) -> str:
    """The message a student may see for a test: the grader's or the test's own words, never a hidden input."""
    errors = [o for o in (cell.get("outputs", []) if cell is not None else []) if o.get("output_type") == "error"]
    if errors and errors[0].get("ename") in KERNEL_DIED_NAMES:
        return f"{DIED}: {errors[0].get('evalue')}"  # the grader's own words (autograder.execute)
    if not test.hidden or test.status in (results.PASSED, results.TIMED_OUT, results.MISSING, results.CORRUPT):
        return redact(test.message, secrets)
    if errors and errors[0].get("ename") == "AssertionError" and test.message.startswith(HIDDEN_TEST_PREFIXES):
        return redact(test.message, secrets)
    if not errors:
        return f"{test.status} on hidden inputs"
    ename = errors[0].get("ename")
    return f"{test.status} on hidden inputs: your code raised {ename if ename in SHOWN_ERRORS else 'an exception'}"


def judge_hidden_outputs(test: results.TestResult, cell, info) -> results.TestResult:
    """A hidden test that passed in the kernel passes only if its reported outputs match the golden ones."""
    key = (info.lab.name, test.test)
    if key not in hidden_spec.SPECS or test.status != results.PASSED:
        return test
    payloads = [o["data"][hidden_spec.MIME] for o in cell.get("outputs", [])
                if o.get("output_type") in ("display_data", "execute_result") and hidden_spec.MIME in o.get("data", {})]
    ok, message = hidden_spec.judge(info.lab.name, test.test, payloads, info.golden)
    if ok:
        return test
    return dataclasses.replace(test, points=0.0, status=results.FAILED, message=message)



CHANGED = re.compile(r"Attribute '(\w+)' for cell (\S+) has changed! \(should be: (.*?), got: (.*?)\)")


def notes_from_submission(nb, info) -> list[str]:
    """Test cells whose source differs from the released one (nbgrader restores them before running).

    nbgrader's own checksum warning fires for every cell with hidden tests (autograder/README.md,
    nbgrader fact 3), so the comparison is with the released source instead.
    """
    notes = []
    for t in results.test_cells(nb):
        if t.grade_id in info.originals and t.source not in info.originals[t.grade_id]:
            notes.append(f"test cell {t.grade_id} was edited; the grader ran the original")
    return notes


def notes_from_log(log: str) -> list[str]:
    """What else nbgrader's OverwriteCells undid: raised points, a changed cell type."""
    notes = []
    for attr, cell, should, got in CHANGED.findall(log):
        if attr == "checksum":
            continue  # see notes_from_submission
        elif attr == "points":
            notes.append(f"the points of {cell} were changed to {got}; the grader used {should}")
        else:
            notes.append(f"the {attr} of cell {cell} was changed to {got}; the grader used {should}")
    return list(dict.fromkeys(notes))


def notes_from_outputs(nb, test_ids: set[str], timeout: int) -> list[str]:
    """Events in cells other than test cells that explain the test results: timeouts, exits, crashes."""
    notes = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in test_ids:
            continue
        label = f"cell {index}" + (f" ({gid})" if gid else "")
        if results.timed_out(cell):
            notes.append(f"{label} {results.timeout_message(timeout)}")
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") != "error":
                continue
            ename = o.get("ename")
            if ename in ("SystemExit", "MemoryError", "DeadKernelError"):
                notes.append(f"{label}: {results.describe_error(ename, o.get('evalue'), 160)}")
            else:  # the name only, from the built-ins: a student's own exception class could carry text
                notes.append(f"{label} raised {ename if ename in SHOWN_ERRORS else 'an exception'}; "
                             f"the cells after it ran all the same")
            break
    return notes

