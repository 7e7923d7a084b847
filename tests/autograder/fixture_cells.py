"""The lab's measurement cells, left out of the planted-bug submissions that tests/autograder/test_fixtures.py grades.

A fixture is the released lab with its solution cells filled in and one thing changed: a solution, a test
cell, a cell it inserts. The course's own cells around the tasks (a demo run, a timing loop with its plot,
the carry-forward cell at the end) are the same in every fixture, and ``verify`` runs each of them, in the
lab's solution, with no cell allowed to raise (tests/autograder/test_verify.py). Run in every fixture as
well, they measure the same thing two dozen times. So the copy that goes into the grading folder leaves out
every cell that is (1) the course's own, unchanged: the lab's source notebook has a cell of that id with that
source, without nbgrader metadata or the parameters tag; (2) sets no attribute or item and declares nothing
global, at its top level; and (3) binds no name that a later cell kept, or any test cell of the lab (its hidden
part included), reads. A test cell that passes its namespace to the harness (``ns=globals()``) may read any
name the harness spells out as a string, so those count as read too. The committed fixtures keep every cell:
only the graded copy is shorter, and its grade must still be exactly what make_fixtures.FIXTURES says.
"""
from __future__ import annotations

import ast
import json
import shutil
import symtable
from functools import cache
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]
HARNESS = [REPO / "autograder" / "labs", REPO / "autograder" / "own", REPO / "autograder" / "checks",
           REPO / "autograder" / "notebook_checks.py"]
NAMESPACE_CALLS = {"globals", "locals", "vars", "eval", "exec"}


@cache
def harness_strings() -> frozenset[str]:
    """Every string constant of the harness that is one identifier: a name it may look up in a namespace it is given."""
    found = set()
    for root in HARNESS:
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                    found.add(node.value)  # a key it may look up (ns["greedy"]); a sentence is a message
    return frozenset(found)


def _parse(source: str) -> tuple[ast.Module, symtable.SymbolTable] | None:
    try:
        return ast.parse(source), symtable.symtable(source, "<cell>", "exec")
    except SyntaxError:  # IPython magics, or a deliberately broken cell: treated as reading everything
        return None


def reads(parsed) -> set[str]:
    """The global names a cell reads (Python's own scoping, from symtable), and what it hands a namespace to."""
    tree, table = parsed
    names = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    todo = list(table.get_children())
    while todo:  # inside the functions, classes and comprehensions it defines: the names that are not their own
        scope = todo.pop()
        names |= {s.get_name() for s in scope.get_symbols() if s.is_global() and s.is_referenced()}
        todo.extend(scope.get_children())
    names |= {n.target.id for n in ast.walk(tree) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}
    if names & NAMESPACE_CALLS:
        names |= harness_strings()
    return names


def binds(parsed) -> set[str]:
    return {s.get_name() for s in parsed[1].get_symbols() if s.is_assigned() or s.is_imported()}


def _top_level(tree: ast.Module):
    """Every node of the cell outside the bodies of the functions and classes it defines."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def changes_other_state(parsed) -> bool:
    """True if the cell assigns an attribute or an item, deletes anything, or declares a name global."""
    for node in _top_level(parsed[0]):
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            return True
        if isinstance(node, (ast.Delete, ast.Global, ast.Nonlocal)):
            return True
    return False


def course_cells(source_nb) -> dict[str, str]:
    """Cell id -> source of the lab's own ungraded code cells (no nbgrader metadata, no parameters tag)."""
    return {c.get("id"): c.source for c in source_nb.cells if c.cell_type == "code"
            and not c.metadata.get("nbgrader") and "parameters" not in c.metadata.get("tags", [])}


def measurement_cells(nb, source_nb) -> list[int]:
    """The indices of ``nb``'s cells that the module docstring's rule leaves out."""
    course = course_cells(source_nb)
    needed: set[str] = set()
    for cell in source_nb.cells:  # every test cell as graded: nbgrader restores each from the lab's gradebook
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            parsed = _parse(cell.source)
            if parsed is None:
                return []
            needed |= reads(parsed)
    left_out = []
    for i in range(len(nb.cells) - 1, -1, -1):  # from the end: a cell is needed if a cell kept after it reads it
        cell = nb.cells[i]
        if cell.cell_type != "code":
            continue
        parsed = _parse(cell.source)
        if parsed is None:  # from here up, keep every cell
            break
        if course.get(cell.get("id")) == cell.source and not changes_other_state(parsed) and not binds(parsed) & needed:
            left_out.append(i)
        else:
            needed |= reads(parsed)
    return sorted(left_out)


def copy_without_measurements(src: Path, dest: Path, source_nb) -> list[str]:
    """Copy the notebook ``src`` to ``dest`` without its measurement cells; the ids of the cells left out.

    Cells are removed from the file's JSON as it is, so that nothing else a fixture planted (a cell id, a
    metadata field, the order of keys) is changed on the way."""
    out = measurement_cells(nbformat.read(src, as_version=4), source_nb)
    if not out:
        shutil.copyfile(src, dest)
        return []
    raw = json.loads(Path(src).read_text(encoding="utf-8"))
    ids = [raw["cells"][i].get("id") for i in out]
    raw["cells"] = [c for i, c in enumerate(raw["cells"]) if i not in set(out)]
    Path(dest).write_text(json.dumps(raw, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return ids


def copy_fixture_set(folder: Path, lab: str, dest: Path) -> dict[str, list[str]]:
    """Every fixture of ``folder`` (tests/autograder/fixtures/labNN/) into ``dest``, as a student hands it in, without the
    measurement cells of the lab (its folder name under labs/); fixture name -> the ids of the cells left out.
    A fixture committed as ``.ipynb.broken`` (a corrupt notebook) is copied byte for byte as ``.ipynb``."""
    source = nbformat.read(REPO / "labs" / lab / f"{lab}.ipynb", as_version=4)
    left_out = {}
    for f in sorted(Path(folder).iterdir()):
        if f.name.endswith(".ipynb.broken"):
            shutil.copyfile(f, Path(dest) / f.name.removesuffix(".broken"))
        elif f.name.endswith(".ipynb"):
            left_out[f.stem] = copy_without_measurements(f, Path(dest) / f.name, source)
    return left_out
