"""The text of a student's module, ``mine/labNN.py``: the cells that defined a lab's graded parts, and their imports.

Two ways in, one result:

* from a live kernel (a lab's last cell): each graded name of the namespace leads to the cell that defined it,
  ``inspect.getsourcefile`` of a notebook-defined function being the kernel's file for that cell, whose lines
  ``linecache`` holds; a helper such a cell calls, defined in another cell of the notebook, comes along;
* from the notebook's JSON (``check``, after its run): the code cells nbgrader marks ``solution``.

Either way the module opens with a header, then the imports those cells need, taken from the lab's given cells
(the student did not write them, but the cells do not run without them).
"""
from __future__ import annotations

import ast
import builtins
import dis
import inspect
import linecache
import symtable
import time
import types

BODY_MARK = "# ---- everything below is yours, from your notebook's cells; the sha256 of this part keys the test results\n"
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def cell_text(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def solution_cells(nb: dict) -> list[str]:
    """The code cells nbgrader marks ``solution``, in order: what the student writes."""
    return [cell_text(c) for c in nb.get("cells", []) if c.get("cell_type") == "code" and _meta(c).get("solution")]


def given_cells(nb: dict) -> list[str]:
    """The other code cells that are not tests: the lab's own setup, imports and demos."""
    return [cell_text(c) for c in nb.get("cells", []) if c.get("cell_type") == "code"
            and not _meta(c).get("solution") and not _meta(c).get("grade")]


def _parse(text: str):
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def defines(text: str) -> set[str]:
    """Names a cell binds at its top level with def or class."""
    tree = _parse(text)
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))} if tree else set()


def free_globals(text: str) -> set[str]:
    """Global names the code reads but does not bind itself (builtins left out)."""
    try:
        table = symtable.symtable(text, "cell", "exec")
    except SyntaxError:
        return set()
    used, bound = set(), set()

    def walk(t):
        for s in t.get_symbols():
            top = t.get_type() == "module"
            if s.is_global() or (top and s.is_referenced()):
                used.add(s.get_name())
            if top and (s.is_assigned() or s.is_imported()):
                bound.add(s.get_name())
        for child in t.get_children():
            walk(child)

    walk(table)
    return used - bound - set(dir(builtins))


# ---------------------------------------------------------------- following a part's code in a namespace

def _codes(obj):
    """The code objects behind a function or a class's methods (decorators unwrapped)."""
    if isinstance(obj, type):
        for value in vars(obj).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                yield from (c for f in (value.fget, value.fset) if f for c in _codes(f))
            elif inspect.isfunction(value):
                yield from _codes(value)
        return
    try:
        fn = inspect.unwrap(obj) if callable(obj) else obj
    except ValueError:  # a wrapper that wraps itself
        return
    code = getattr(fn, "__code__", None)
    if code is not None:
        yield code


def _global_reads(code) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_reads(const)
    return names


def notebook_defined(obj) -> bool:
    """A function or class written in the notebook (or in a module of the student's, run as one)."""
    if getattr(obj, "__module__", None) != "__main__":
        return False
    if isinstance(obj, type):
        return True
    try:
        return callable(obj) and inspect.isfunction(inspect.unwrap(obj))
    except ValueError:  # a wrapper that wraps itself
        return False


def closure(names, ns: dict) -> list[str]:
    """``names`` and every notebook-defined name their code reads, a class's own bases before it."""
    order: list[str] = []

    def visit(name):
        obj = ns.get(name)
        if name in order or obj is None or not notebook_defined(obj):
            return
        if isinstance(obj, type):
            for base in obj.__bases__:
                if notebook_defined(base) and ns.get(base.__name__) is base:
                    visit(base.__name__)
        if name in order:
            return
        order.append(name)
        for code in _codes(obj):
            for ref in sorted(_global_reads(code)):
                visit(ref)

    for name in names:
        visit(name)
    return order


def _cell_file(obj) -> str | None:
    for code in _codes(obj):
        if linecache.getlines(code.co_filename):
            return code.co_filename
    return None


def kernel_cells(names, ns: dict) -> tuple[list[str], list[str]]:
    """The cells that defined ``names`` (and what they call), in dependency order; and the names without a cell."""
    cells, seen, lost = [], set(), []
    for name in closure(names, ns):
        filename = _cell_file(ns[name])
        if filename is not None and filename not in seen:
            seen.add(filename)
            cells.append("".join(linecache.getlines(filename)))
        elif filename is None:
            try:  # defined outside a cell (a file of its own): its own source, at least
                cells.append(inspect.getsource(ns[name]))
            except (OSError, TypeError):
                lost.append(name)
    return cells, lost


# ---------------------------------------------------------------- the imports those cells need

def _import_lines(given: list[str], needed: set[str]) -> tuple[list[str], set[str]]:
    """The given cells' top-level imports (and literal constants) that bind a needed name, cut to those names."""
    lines, found = [], set()
    for text in given:
        tree = _parse(text)
        for node in tree.body if tree else []:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                keep = [a for a in node.names if a.name != "*" and (a.asname or a.name).split(".")[0] in needed - found]
                if keep:
                    node.names = keep
                    lines.append(ast.unparse(node))
                    found |= {(a.asname or a.name).split(".")[0] for a in keep}
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                  and node.targets[0].id in needed - found):
                try:
                    ast.literal_eval(node.value)
                except ValueError:
                    continue
                lines.append(ast.unparse(node))
                found.add(node.targets[0].id)
    return lines, found


def _from_namespace(name: str, value) -> str | None:
    """How to bind ``name`` to ``value`` in a fresh module: an import, or a literal; None if there is no way."""
    import importlib

    if isinstance(value, types.ModuleType):
        return f"import {value.__name__}" if value.__name__ == name else f"import {value.__name__} as {name}"
    if isinstance(value, (bool, int, float, str, type(None))):
        return f"{name} = {value!r}"
    module, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and module != "__main__" and qual and "." not in qual:
        try:
            if getattr(importlib.import_module(module), qual) is value:
                return f"from {module} import {qual}" + (f" as {name}" if qual != name else "")
        except Exception:
            return None
    return None


def preamble(cells: list[str], given: list[str], ns: dict | None = None) -> list[str]:
    joined = "\n\n".join(cells)
    defined = set().union(*(defines(c) for c in cells)) if cells else set()
    needed = free_globals(joined) - defined
    lines, found = _import_lines(given, needed)
    for name in sorted(needed - found):
        line = _from_namespace(name, ns[name]) if ns is not None and name in ns else None
        lines.append(line or f"# {name}: not found in the lab's given cells")
    return lines


# ---------------------------------------------------------------- the module

def _clean(cell: str) -> str:
    """A cell as module code: no solution markers, and no IPython magics (``%time``, ``!pip``, and what the kernel
    turns them into), which only a kernel runs."""
    kept = [ln for ln in cell.splitlines() if ln.strip() not in MARKERS
            and not ln.lstrip().startswith(("%", "!", "get_ipython()."))]
    return "\n".join(kept).strip("\n")


def module_text(lab: int, cells: list[str], imports: list[str], origin: str, notebook: str = "") -> str:
    where = notebook or f"labs/lab{lab:02d}_*/lab{lab:02d}_*.ipynb"
    header = (f'"""Your Lab {lab:02d} parts, saved by autograder.own on {time.strftime("%Y-%m-%d %H:%M")} ({origin}).\n\n'
              f"Regenerate it by running the lab's last cell, or\n    python -m autograder check {where}\n"
              f"Edits made here are overwritten.  Later labs' last cells build your engine from these modules.\n\"\"\"\n")
    body = ("\n".join(imports) + "\n\n\n" if imports else "") + "\n\n\n".join(_clean(c) for c in cells) + "\n"
    return header + BODY_MARK + body


def body_of(text: str) -> str:
    """What the module's hash covers: everything after the header (a new date alone is no new module)."""
    return text.split(BODY_MARK, 1)[-1]


def from_notebook(lab: int, nb: dict, notebook: str = "") -> str:
    """The module from a notebook's JSON: its solution cells that define something, with their imports."""
    cells = [c for c in solution_cells(nb) if defines(c)]
    given = given_cells(nb)
    # A helper the student put in a cell of their own (defs and imports only) comes along when a saved cell reads it.
    extra = [c for c in given if defines(c) and _definitions_only(c)]
    need = set().union(*(free_globals(c) for c in cells)) if cells else set()
    chosen = [c for c in extra if defines(c) & need]
    return module_text(lab, chosen + cells, preamble(chosen + cells, given), "from the notebook, by check", notebook)


def _definitions_only(text: str) -> bool:
    tree = _parse(text)
    ok = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    return bool(tree) and all(isinstance(n, ok) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
                              for n in tree.body)


def from_kernel(lab: int, ns: dict, graded: list[str], given: list[str], notebook: str = ""):
    """The module from a live namespace: the cells behind ``graded`` names.  Returns (text, the names whose cell
    was not found, how many cells it holds)."""
    present = [n for n in graded if n in ns and notebook_defined(ns[n])]
    cells, lost = kernel_cells(present, ns)
    return module_text(lab, cells, preamble(cells, given, ns), "from the notebook's kernel", notebook), lost, len(cells)
