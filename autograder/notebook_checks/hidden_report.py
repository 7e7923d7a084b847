"""What a hidden test cell reports: the student's outputs on hidden prompts, for the grader to compare outside.

The hidden golden outputs never enter the grading sandbox (autograder/hidden_outputs.py, autograder/README.md).
While a report is open, an exception that the student's code raises on a hidden case is shown as
"hidden case p3-top_p (temperature 1, top_p 0.8, seed 503000), step 12: your sample raised IndexError at line 6
of its cell": the case and the step, never the case's prompt or the exception's own text, which the grader
would withhold (autograder/grade/messages.py, safe_message).
"""
from __future__ import annotations

import builtins
import importlib
import os
import sys

from autograder.notebook_checks.convert import as_tokens

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
HARNESS = os.path.join(_REPO, "autograder") + os.sep
# Code that is not the student's: the course's packages, and Python's and the venv's libraries.
LIBRARIES = tuple(dict.fromkeys([HARNESS, os.path.join(_REPO, "miniengine") + os.sep] + [
    os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]))


def _is_harness(code) -> bool:
    return os.path.realpath(code.co_filename).startswith(HARNESS)


def _is_student(code) -> bool:
    """A function of the student's: defined in a notebook cell (or a file of theirs), not in a library."""
    name = code.co_filename
    return (code.co_name != "<module>" and not name.startswith("<")
            and not os.path.realpath(name).startswith(LIBRARIES))


def where(code, lineno: int) -> str:
    """'at line 6 of its cell' (ipykernel compiles each cell to a file of its own), or 'at mine/lab01.py:6'."""
    if "ipykernel_" in code.co_filename:
        return f"at line {lineno} of its cell"
    return f"at {os.path.basename(code.co_filename)}:{lineno}"


def raised(etype) -> str:
    """The exception's name where it is Python's own (a submission's own class could carry any name)."""
    return etype.__name__ if getattr(builtins, etype.__name__, None) is etype else "an exception"


def describe(case: dict) -> str:
    """A case's sampling parameters, which are no secret: 'greedy', or 'temperature 0.7, top_k 40, seed 7'."""
    p = case.get("params", {})
    if p.get("temperature", 1.0) == 0:
        parts = ["greedy"]
    else:
        parts = [f"temperature {p.get('temperature', 1.0):g}"] + ([f"top_k {p['top_k']}"] if p.get("top_k") else [])
        parts += [f"top_p {p['top_p']:g}"] if p.get("top_p", 1.0) < 1 else []
        parts += [f"seed {p['seed']}"] if "seed" in p else []
    parts += [f"n {p['n']}"] if p.get("n", 1) > 1 else []
    parts += ["ignore_eos"] if p.get("ignore_eos") else []
    return ", ".join(parts)


def hidden_inputs(file: str = "golden") -> dict:
    """A hidden golden file's inputs only (prompts, parameters, end-of-text id): never its outputs.

    In the grading sandbox the grader has written these views to the folder named by CASES_ENV, and the
    golden files themselves are not there; an instructor's own run derives the same view from the files.
    """
    import json
    import os

    from autograder import hidden_outputs

    spec = importlib.reload(hidden_outputs)
    folder = os.environ.get(spec.CASES_ENV)
    if folder:
        with open(os.path.join(folder, f"{file}.json")) as f:
            return json.load(f)
    return spec.public_view(spec.load(file))


class HiddenReport:
    """What a hidden test cell's run of the student's code produced, on hidden prompts, for the grader to compare.

    ``data(file)`` gives the hidden file's inputs (prompts, parameters, end-of-text id) and ``cases(file)`` the
    cases this cell must report, from autograder.hidden_outputs.SPECS.  ``add`` records an output, and ``submit``
    hands the whole report over as one display output that the grader reads from outside the sandbox.  Run by an
    instructor outside the sandbox, where the golden files are readable, ``submit`` also compares at once and
    fails with the grader's own message.
    """

    def __init__(self, lab: str, cell: str):
        from autograder import hidden_outputs

        self._spec = importlib.reload(hidden_outputs)
        self.lab, self.cell, self.rows = lab, cell, []
        self._views: dict[str, dict] = {}
        self._restore = _catch_failures(self)

    def data(self, file: str = "golden") -> dict:
        if file not in self._views:
            self._views[file] = hidden_inputs(file)
        return self._views[file]

    def cases(self, file: str = "golden", section: str = "cases") -> list[dict]:
        dues = [d for d in self._spec.spec(self.lab, self.cell) if d.file == file and d.section == section]
        assert dues, f"{self.lab}/{self.cell} reports nothing from {file}/{section}"
        seen, picked = set(), []
        for d in dues:
            for c in d.cases(self.data(file)):
                if c["name"] not in seen:
                    seen.add(c["name"])
                    picked.append(c)
        return picked

    def add(self, file: str, case: dict, field: str, value, section: str = "cases") -> None:
        if field == "chosen_logits":
            value = [float(x) for x in value]
        elif field == "completions":
            value = [as_tokens(v, f"hidden case {case['name']}: completion {i}") for i, v in enumerate(value)]
        elif field == "token_ids":
            value = as_tokens(value, f"hidden case {case['name']}: token_ids")
        self.rows.append([file, section, case["name"], field, value])

    def failure(self, etype, value, tb) -> str | None:
        """What to say of an exception that reached the cell: the hidden case and step at which the harness called
        the student's function, what it raised and where.  None where the case is not known for sure (the engine
        called the function, or the harness itself raised): the grader then names the error and where it was."""
        frames = []
        while tb is not None:
            frames.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
        test = next((i for i, (f, _) in enumerate(frames) if _is_harness(f.f_code)), len(frames))
        mine = [i for i, (f, _) in enumerate(frames) if i > test and _is_student(f.f_code)]  # called by the harness
        if not mine or not _is_harness(frames[mine[0] - 1][0].f_code):
            return None
        names = {c["name"] for d in self._spec.spec(self.lab, self.cell) for c in d.cases(self.data(d.file))
                 if d.section in self.data(d.file)}
        caller = frames[mine[0] - 1][0].f_locals  # the harness's frame that called the student's function
        found = [v for k, v in caller.items() if isinstance(v, dict) and v.get("name") in names]
        case = caller.get("case") if isinstance(caller.get("case"), dict) else (found[0] if len(found) == 1 else None)
        if case is None or case.get("name") not in names:
            return None
        step = next((caller[k] for k in ("t", "step") if type(caller.get(k)) is int), None)
        first, (inner, lineno) = frames[mine[0]][0].f_code, frames[mine[-1]]
        what = f"your {first.co_qualname}"
        at = where(inner.f_code, lineno) if inner.f_code is first else (
            f"(in {inner.f_code.co_qualname}, {where(inner.f_code, lineno)})")
        guard = sys.modules.get("autograder.notebook_checks.guard")
        if guard is not None and isinstance(value, guard.ReferenceCalled):
            how = f"called the course's reference: {value}"  # the guard's own words, no input in them
        else:
            how = f"raised {raised(etype)} {at}"
        return (f"hidden case {case['name']} ({describe(case)})" + (f", step {step}" if step is not None else "")
                + f": {what} {how}")

    def submit(self) -> None:
        from IPython.display import display

        self._restore()
        display({self._spec.MIME: {"cell": self.cell, "outputs": self.rows}}, raw=True)
        files = {d.file for d in self._spec.spec(self.lab, self.cell)}
        try:
            golden = {f: self._spec.load(f) for f in files}
        except OSError:
            return  # the student's sandbox: only the grader can compare
        ok, message = self._spec.judge(self.lab, self.cell, [{"cell": self.cell, "outputs": self.rows}], golden)
        assert ok, message


def _catch_failures(report: HiddenReport):
    """While the cell runs, show an exception from the student's code with report.failure's words (the grader reads
    an error's name and text, not its traceback).  Returns the function that puts IPython's handling back."""
    try:
        from IPython import get_ipython
    except ImportError:
        return lambda: None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return lambda: None  # not in a kernel: the exception reaches its caller as it is
    previous, count = (shell.custom_exceptions, shell.CustomTB), shell.execution_count

    def restore():
        shell.custom_exceptions, shell.CustomTB = previous

    def handler(shell, etype, value, tb, tb_offset=None):
        restore()
        try:
            message = report.failure(etype, value, tb) if shell.execution_count == count else None
        except Exception:  # noqa: BLE001 - a check that cannot name the case must not hide the error itself
            message = None
        if message is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        else:  # the traceback as it was, the exception's text replaced by the case and the step
            shell._showtraceback(etype, message, shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset))

    guard = sys.modules.get("autograder.notebook_checks.guard")
    shell.set_custom_exc((Exception,) + ((guard.ReferenceCalled,) if guard else ()), handler)
    return restore
