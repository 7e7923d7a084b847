"""Saving a lab's graded definitions as the student's own module, ``mine/labNN.py``, and ``check``'s results with it.

``mine/`` belongs to the course checkout it is in: only a notebook that lives in that checkout (its labs/, or any
folder under its root; on Colab the setup cell works in /content/course) saves there.  A copy checked or run from
elsewhere leaves it as it was and says why, so the table of whose parts the engine holds never shows a file the
student did not write in their own edition.  ``$MINIENGINE_MINE`` is the student's explicit choice of folder, and
then any notebook saves there.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from autograder.own import registry, source, status


def graded_names(lab: int) -> list[str]:
    """Every name a solution cell of the lab's notebook defines, then the registry's (in case the notebook lacks one)."""
    names = []
    path = registry.lab_notebook(lab)
    if path is not None:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in source.solution_cells(nb):
            names += sorted(source.defines(cell))
    names += [n for p in registry.parts_of(lab) for n in p.names]
    return list(dict.fromkeys(names))


def _given(lab: int) -> tuple[list[str], str]:
    path = registry.lab_notebook(lab)
    if path is None:
        return [], ""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return source.given_cells(nb), shown_path(path)


def shown_path(path: Path) -> str:
    """A path as a student types it: from the course checkout's root when it is inside it."""
    from autograder import course_paths

    try:
        return Path(path).resolve().relative_to(course_paths.REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def elsewhere(place: Path) -> str | None:
    """None when a notebook at ``place`` (its file, or a kernel's working folder) saves into this checkout's mine/;
    else why it does not."""
    from autograder import course_paths

    if os.environ.get("MINIENGINE_MINE"):
        return None
    try:
        Path(place).resolve().relative_to(course_paths.REPO_ROOT)
        return None
    except ValueError:
        return (f"{place} is outside this course checkout ({course_paths.REPO_ROOT}), whose mine/ keeps the parts of "
                f"the notebooks in it; work in your copy under labs/ there, or set MINIENGINE_MINE to choose a folder")


def write(lab: int, text: str) -> tuple[Path, bool]:
    """Write the module unless its body is what is there already (a new date alone is no change)."""
    path = status.module_path(lab)
    if path.is_file() and source.body_of(path.read_text(encoding="utf-8")) == source.body_of(text):
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path, True


def from_kernel(lab: int, ns: dict) -> tuple[Path, list[str], bool]:
    """Save the cells behind this lab's graded names in a live namespace.  Returns the path, the names whose cell
    was not found, and whether anything was saved: a namespace without one of the lab's cells (a script, another
    lab's notebook) leaves the module as it was."""
    if elsewhere(Path.cwd()):
        raise PermissionError(f"not saved: {elsewhere(Path.cwd())}")
    given, shown = _given(lab)
    text, lost, cells = source.from_kernel(lab, ns, graded_names(lab), given, shown)
    if not cells:
        return status.module_path(lab), lost, False
    return write(lab, text)[0], lost, True


def lab_of_notebook(notebook: Path, nb: dict) -> int | None:
    """Which lab a notebook is: labNN at the start of its name, else the lab whose test cells it holds."""
    m = re.match(r"(?:.*[_-])?lab(\d\d)", Path(notebook).stem)
    if m and 1 <= int(m.group(1)) <= registry.LAST_LAB:
        return int(m.group(1))
    ids = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.get("cells", [])} - {None}
    for lab in range(1, registry.LAST_LAB + 1):
        tests = {c.grade_id for c in status.visible_tests(lab)}
        if tests and tests <= ids:
            return lab
    return None


def from_check(notebook: Path, nb: dict, outcomes: dict) -> str | None:
    """``check``'s hook: save the notebook's solution cells, record the visible tests' results it just got.

    ``nb`` is the notebook as a dict (as run, test cells restored); ``outcomes`` is ``{grade_id: (status,
    message)}``.  Returns a line for check to print, or None when the notebook is no lab's.
    """
    lab = lab_of_notebook(notebook, nb)
    if lab is None:
        return None
    why = elsewhere(Path(notebook))
    if why:
        return f"your Lab {lab:02d} parts were not saved: {why}"
    text = source.from_notebook(lab, nb, str(notebook))
    path, _ = write(lab, text)
    sha = status.sha256(source.body_of(text))
    cells = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): status.sha256(source.cell_text(c))
             for c in nb.get("cells", [])}
    results = {gid: (st, _first_line(msg), cells[gid]) for gid, (st, msg) in outcomes.items()
               if gid.endswith("-visible") and gid in cells}
    status.record(lab, sha, results, by="check")
    passed = sum(st == status.PASSED for st, _, _ in results.values())
    return (f"your Lab {lab:02d} parts are saved in {shown_path(path)} ({passed} of {len(results)} visible tests passed, recorded "
            f"for the engine the labs' last cells build from them)")


def _first_line(message) -> str:
    lines = [ln.strip() for ln in str(message or "").splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    return text if len(text) <= 300 else text[:297] + "..."
