"""What a hidden test cell reports: the student's outputs on hidden prompts, for the grader to compare outside.

The hidden golden outputs never enter the grading sandbox (autograder/hidden_spec.py, autograder/README.md).
"""
from __future__ import annotations

import importlib

from autograder.checks.convert import as_tokens


def hidden_inputs(file: str = "golden") -> dict:
    """A hidden golden file's inputs only (prompts, parameters, end-of-text id): never its outputs.

    In the grading sandbox the grader has written these views to the folder named by CASES_ENV, and the
    golden files themselves are not there; an instructor's own run derives the same view from the files.
    """
    import json
    import os

    from autograder import hidden_spec

    spec = importlib.reload(hidden_spec)
    folder = os.environ.get(spec.CASES_ENV)
    if folder:
        with open(os.path.join(folder, f"{file}.json")) as f:
            return json.load(f)
    return spec.public_view(spec.load(file))


class HiddenReport:
    """What a hidden test cell's run of the student's code produced, on hidden prompts, for the grader to compare.

    ``data(file)`` gives the hidden file's inputs (prompts, parameters, end-of-text id) and ``cases(file)`` the
    cases this cell must report, from autograder.hidden_spec.SPECS.  ``add`` records an output, and ``submit``
    hands the whole report over as one display output that the grader reads from outside the sandbox.  Run by an
    instructor outside the sandbox, where the golden files are readable, ``submit`` also compares at once and
    fails with the grader's own message.
    """

    def __init__(self, lab: str, cell: str):
        from autograder import hidden_spec

        self._spec = importlib.reload(hidden_spec)
        self.lab, self.cell, self.rows = lab, cell, []
        self._views: dict[str, dict] = {}

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
            value = [as_tokens(v, f"case {case['name']}: completion") for v in value]
        elif field == "token_ids":
            value = as_tokens(value, f"case {case['name']}: token_ids")
        self.rows.append([file, section, case["name"], field, value])

    def submit(self) -> None:
        from IPython.display import display

        display({self._spec.MIME: {"cell": self.cell, "outputs": self.rows}}, raw=True)
        files = {d.file for d in self._spec.spec(self.lab, self.cell)}
        try:
            golden = {f: self._spec.load(f) for f in files}
        except OSError:
            return  # the student's sandbox: only the grader can compare
        ok, message = self._spec.judge(self.lab, self.cell, [{"cell": self.cell, "outputs": self.rows}], golden)
        assert ok, message
