"""The labs' test harnesses: one module per lab (``lab01`` ... ``lab09``), holding the checks its test cells run.

A test cell states its cases and calls its lab's harness, so that a student reads what is checked in one
screen, and a fix to a check is made once, here, for the visible and the hidden cell alike::

    import importlib, autograder.labs
    lab = importlib.reload(autograder.labs).pristine("lab02")   # undoes whatever earlier cells did to the checks
    lab.check_kv_bytes(kv_bytes_per_token, [("Llama-3-8B", llama3_8b, 2, 131072), ...])

``pristine`` reloads the helper modules and then the harness, every time: a student's cell that patched a
check (``lab.check_kv_bytes = lambda *a: None``) or a helper it uses is undone before the next test runs.
In the grading sandbox these files are read-only, and the hidden cells' results are compared outside it
(autograder/hidden_outputs.py), so a patched harness can fool only the student's own visible run.
"""
from __future__ import annotations

import importlib

# Reloaded first, in this order (each one's dependencies before it), then the lab's harness.
HELPERS = ("json", "autograder.hidden_outputs", "autograder.notebook_checks", "autograder.labs.shared")


def pristine(lab: str):
    """The harness module of ``lab`` (``"lab02"``), freshly reloaded with every helper it uses."""
    if not (isinstance(lab, str) and lab.startswith("lab") and lab[3:].isdigit()):
        raise ValueError(f"lab must be a lab's harness name such as 'lab02', got {lab!r}")
    for name in HELPERS:
        importlib.reload(importlib.import_module(name))
    module = importlib.reload(importlib.import_module(f"{__name__}.{lab}"))
    # Each check hands what it observed to the grader when it returns or raises (autograder/notebook_checks/ledger.py).
    ledger = importlib.import_module("autograder.notebook_checks.ledger")
    for name, obj in list(vars(module).items()):
        if name.startswith(("check_", "report_")) and callable(obj) and not hasattr(obj, "__wrapped__"):
            setattr(module, name, ledger.reported(obj))
    return module
