"""What a student may read of a graded test, and the notes that explain a result (an allow-list).

A visible test's message is its own; a hidden test's is shown only when it is the test's own words (it starts
with one of HIDDEN_TEST_PREFIXES: the case and the step, which a harness and HiddenReport name) and quotes no
hidden input; otherwise the student reads the built-in exception's name and where it was raised, taken from the
traceback's frames (a function and a line), never the exception's text.  A hidden test that passed in the kernel passes only if the outputs it reported
match the hidden golden ones, compared here, outside the sandbox.  The notes name what else happened: an
edited test cell, raised points, a non-test cell that timed out or raised.
"""
from __future__ import annotations

import builtins
import dataclasses
import re

from autograder import hidden_outputs, results
from autograder.notebooks.execute import KERNEL_DIED, NOT_RUN

KERNEL_DIED_NAMES = (KERNEL_DIED, NOT_RUN)
DIED = "grading process died"


# Exception names a message may show: Python's own, and the tests' own.  A submission's exception class could
# carry any name, a hidden input included.
SHOWN_ERRORS = {name for name, obj in vars(builtins).items() if isinstance(obj, type) and issubclass(obj, BaseException)}
# The course's own, and torch's for a tensor-parallel rank that raised (RankError: lab 09's harness says what and where).
SHOWN_ERRORS |= {"ReferenceCalled", "CellTimeoutError", "RankError", "ProcessRaisedException"}
# A hidden test's own messages start like this; anything else in a hidden cell came from the student's code,
# and could carry the hidden inputs it was given.
HIDDEN_TEST_PREFIXES = ("hidden case ", "hidden hand-made case", "your engine", "hidden, pass ")
WITHHELD = "[withheld: it quoted a hidden input]"


def hidden_secrets(golden: dict[str, dict]) -> list[str]:
    """Strings that would give a hidden input away: prompt texts and their token id lists."""
    found = set()
    for data in golden.values():
        for section in hidden_outputs.SECTIONS:
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


# A frame's first line in an IPython traceback: code from a notebook cell, or from a file.
CELL_FRAME = re.compile(r"^Cell In\[\d+\], line (\d+), in ([\w.<>]{1,80})")
FILE_FRAME = re.compile(r"^File (\S+?):(\d+), in ([\w.<>]{1,80})")
COURSE_CODE = re.compile(r"/((?:autograder|miniengine)/[\w/]+\.py)$")
# The reference guard's own words (autograder/notebook_checks/guard.py): names of the course's functions, no input in them.
GUARD_SAYS = re.compile(r"^[\w ,.'-]{1,80} calls [\w., ]{1,200}: that is the course's reference implementation\. "
                        r"Write this part yourself \(the allowed imports are listed at the top of the lab\)\.$")


def where_raised(traceback: list) -> tuple[str, str]:
    """Where an error came from, read from its traceback's frame lines: ("yours", "in greedy, at line 6 of its
    cell") for the last function of a notebook cell in it, else ("course", "rank_of (autograder/labs/lab09/__init__.py:40)")
    for the last of the course's functions, else ("", "")."""
    frames = []
    for entry in traceback or []:
        head = results.ANSI.sub("", str(entry)).strip().splitlines()[:1]
        cell = CELL_FRAME.match(head[0]) if head else None
        file = FILE_FRAME.match(head[0]) if head and not cell else None
        course = COURSE_CODE.search(file.group(1)) if file else None
        if cell:  # a function defined in a cell (the test cell itself runs at module level: no ", in ...")
            frames.append(("yours", f"in {cell.group(2)}, at line {cell.group(1)} of its cell"))
        elif course:
            frames.append(("course", f"{file.group(3)} ({course.group(1)}:{file.group(2)})"))
    mine = [f for f in frames if f[0] == "yours"]
    return (mine or frames or [("", "")])[-1]


def safe_message(test: results.TestResult, cell, secrets: list[str]) -> str:
    """The message a student may see for a test: the grader's or the test's own words, never a hidden input."""
    errors = [o for o in (cell.get("outputs", []) if cell is not None else []) if o.get("output_type") == "error"]
    if errors and errors[0].get("ename") in KERNEL_DIED_NAMES:
        return f"{DIED}: {errors[0].get('evalue')}"  # the grader's own words (autograder.notebooks.execute)
    if not test.hidden or test.status in (results.PASSED, results.TIMED_OUT, results.MISSING, results.CORRUPT):
        return redact(test.message, secrets)
    head = f"{test.status} on hidden inputs"
    if not errors:  # what the cell wrote could show what it was given
        return head + (": the cell wrote to stderr, which nbgrader counts as a failure (what it wrote is withheld)"
                       if "stderr" in test.message else "")
    ename, evalue = errors[0].get("ename"), results.whole(errors[0].get("evalue"))
    if evalue.startswith(HIDDEN_TEST_PREFIXES):  # a harness's assertion, or HiddenReport naming the case and step
        return redact(evalue, secrets)
    shown = ename if ename in SHOWN_ERRORS else "an exception"
    kind, where = where_raised(errors[0].get("traceback"))
    if ename == "AssertionError" and where.startswith("reference_forbidden (autograder/notebook_checks/guard.py") \
            and GUARD_SAYS.match(evalue):
        return f"{head}: {evalue}"
    if kind == "yours":
        return f"{head}: your code raised {shown} {where}"
    if kind == "course" and ename == "AssertionError":  # a check whose message does not say which hidden case
        return f"{head}: the test's check in {where} failed; its message is withheld, as it does not name the case"
    if kind == "course":  # e.g. the engine refusing what a plug returned: the line says which check it was
        return f"{head}: {shown} raised in the course's {where}"
    return f"{head}: your code raised {shown}"


def judge_hidden_outputs(test: results.TestResult, cell, info) -> results.TestResult:
    """A hidden test that passed in the kernel passes only if its reported outputs match the golden ones."""
    key = (info.lab.name, test.test)
    if key not in hidden_outputs.SPECS or test.status != results.PASSED:
        return test
    payloads = [o["data"][hidden_outputs.MIME] for o in cell.get("outputs", [])
                if o.get("output_type") in ("display_data", "execute_result") and hidden_outputs.MIME in o.get("data", {})]
    ok, message = hidden_outputs.judge(info.lab.name, test.test, payloads, info.golden)
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
    present = set()
    points = {t.grade_id: t.max_points for t in info.tests}
    for t in results.test_cells(nb):
        present.add(t.grade_id)
        if t.grade_id in points and t.max_points != points[t.grade_id]:
            notes.append(f"the points of {t.grade_id} were changed to {t.max_points:g}; the grader used "
                         f"{points[t.grade_id]:g}")
        if t.grade_id in info.originals and t.source not in info.originals[t.grade_id]:
            notes.append(f"test cell {t.grade_id} was edited; the grader ran the original")
    notes += [f"test cell {gid} was deleted from the submission; the grader ran the original"
              for gid in info.originals if gid not in present]
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


# A full scratch tmpfs (autograder.sandbox.bubblewrap.SCRATCH): the student's own cell fails, and the note says why.
DISK_FULL = ("OSError: No space left on device: the submission's files (its working folder, /tmp and HOME "
             "together) reached the sandbox's disk cap")


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
            if ename == "OSError" and "No space left on device" in str(o.get("evalue")):
                notes.append(f"{label}: {DISK_FULL}")
            elif ename in ("SystemExit", "MemoryError", "DeadKernelError"):
                notes.append(f"{label}: {results.describe_error(ename, o.get('evalue'), 160)}")
            else:  # the name only, from the built-ins: a student's own exception class could carry text
                notes.append(f"{label} raised {ename if ename in SHOWN_ERRORS else 'an exception'}; "
                             f"the cells after it ran all the same")
            break
    return notes

