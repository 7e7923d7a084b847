"""Is a saved part the student's?  Its lab's visible tests, run on the saved module, their results cached.

A part counts as the student's when ``mine/labNN.py`` runs on its own, defines the part's names, and passes the
visible tests that use them (the test cells with grade ids ending in ``-visible``, read from the lab's notebook
in labs/).  Results are kept in ``mine/labNN.status.json``, keyed by the sha256 of the module's body and of each
test cell's source, so that a later lab's last cell never reruns an earlier lab's tests: ``check`` records every
visible test it ran, a last cell records the quick ones it runs itself (registry.HEAVY are left to ``check``).
"""
from __future__ import annotations

import builtins
import contextlib
import dataclasses
import hashlib
import io
import json
import signal
import threading
import time
import warnings
from pathlib import Path

from autograder.own import registry, source

PASSED = "passed"
TEST_SECONDS = 180  # a visible test of a lab runs in seconds; past this it is stopped and counts as failed


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclasses.dataclass
class Module:
    lab: int
    path: Path
    sha: str | None = None
    ns: dict | None = None
    error: str = ""  # why it cannot be used: missing, or what it raised


def module_path(lab: int) -> Path:
    return registry.mine_dir() / f"lab{lab:02d}.py"


def status_path(lab: int) -> Path:
    return registry.mine_dir() / f"lab{lab:02d}.status.json"


def first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    text = f"{type(e).__name__}: {lines[0].strip()}" if lines else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def load(lab: int) -> Module:
    """Run mine/labNN.py in a fresh namespace named __main__, as a notebook's cells are."""
    path = module_path(lab)
    if not path.is_file():
        return Module(lab, path, error=f"not saved yet: run Lab {lab:02d}'s last cell")
    text = path.read_text(encoding="utf-8")
    ns = {"__name__": "__main__", "__file__": str(path), "__builtins__": builtins}
    try:
        with _quiet():
            exec(compile(text, str(path), "exec"), ns)
    except Exception as e:  # a broken module is reported, never raised: the course's parts take over
        return Module(lab, path, sha256(source.body_of(text)), error=f"{path.name} does not run on its own: {first_line(e)}")
    return Module(lab, path, sha256(source.body_of(text)), ns)


@contextlib.contextmanager
def _quiet():
    """Tests and modules print; the last cell shows a table instead."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ---------------------------------------------------------------- the lab's visible tests

@dataclasses.dataclass(frozen=True)
class TestCell:
    grade_id: str
    source: str
    sha: str
    reads: frozenset


def visible_tests(lab: int) -> list[TestCell]:
    path = registry.lab_notebook(lab)
    if path is None:
        return []
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = []
    for c in nb.get("cells", []):
        meta = c.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id", "")
        if c.get("cell_type") == "code" and meta.get("grade") and not meta.get("solution") and gid.endswith("-visible"):
            text = source.cell_text(c)
            cells.append(TestCell(gid, text, sha256(text), frozenset(source.free_globals(text))))
    return cells


def recorded(lab: int, sha: str) -> dict:
    """{grade_id: {status, message, cell_sha256, by, when}} for this module, or {} (none yet, or another module)."""
    try:
        data = json.loads(status_path(lab).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data.get("tests", {}) if data.get("module_sha256") == sha else {}


def record(lab: int, sha: str, results: dict, by: str) -> None:
    """Merge ``{grade_id: (status, message, cell_sha)}`` into the status file of this module."""
    tests = recorded(lab, sha)
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    for gid, (status, message, cell_sha) in results.items():
        tests[gid] = {"status": status, "message": message, "cell_sha256": cell_sha, "by": by, "when": when}
    path = status_path(lab)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"module_sha256": sha, "tests": tests}, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


class _TestTimeout(BaseException):
    """A BaseException, so that a student's `except Exception` cannot swallow it."""


@contextlib.contextmanager
def _time_limit(seconds: int):
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def stop(signum, frame):
        raise _TestTimeout(f"stopped after {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run(module: Module, cells: list[TestCell]) -> dict:
    """Run test cells in the module's namespace; ``{grade_id: (status, message, cell_sha)}``."""
    import torch

    out, threads = {}, torch.get_num_threads()
    ns = module.ns
    for name, value in (("FAST", True), ("DEVICE", "cpu"), ("SEED", 0)):
        ns.setdefault(name, value)  # the parameters cell's names, which some test cells read
    for cell in cells:
        try:
            with _quiet(), _time_limit(TEST_SECONDS):
                exec(compile(cell.source, f"<{cell.grade_id}>", "exec"), ns)
            out[cell.grade_id] = (PASSED, "", cell.sha)
        except (Exception, _TestTimeout) as e:
            kind = "failed" if isinstance(e, AssertionError) else "error"
            out[cell.grade_id] = (kind, first_line(e), cell.sha)
        finally:
            torch.set_num_threads(threads)
    return out
