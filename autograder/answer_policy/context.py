"""What a lab's own cells define, read from its template notebook: the context every answer cell is checked in."""
from __future__ import annotations

import ast
import dataclasses

from autograder.answer_policy.rules import HARNESS_NAMES, MACHINERY


@dataclasses.dataclass
class Lab:
    """What the lab's own cells define, read from its template notebook (the source or the release)."""

    given: set[str]  # names the given (non-graded) cells bind
    given_defined: set[str]  # of those, the ones bound by def, class or import: the tests' tools
    tests_only: set[str]  # names only test cells bind: the harness, its reports, its inputs
    machinery: set[str]  # names the given cells bind to a module of MACHINERY (the Colab cell's sys, os)
    imports: set[tuple[str, str | None]]  # (module, name) the given cells import; name None for `import module`
    given_imports: dict[str, str]  # name -> the import statement's dump that binds it in a given cell
    answer_keys: set[tuple[str, str]]  # (module, name or Class.method) that the harnesses forbid


def _cell_kind(cell) -> str:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if meta.get("solution"):
        return "answer"
    return "test" if meta.get("grade") else "given"


def parse(source: str) -> ast.Module:
    """A cell's syntax tree, after IPython's own transformation (a magic becomes a get_ipython() call)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return ast.parse(TransformerManager().transform_cell(source))


def _bindings(tree: ast.Module) -> tuple[set[str], dict[str, tuple[str, str, str | None]], set[str]]:
    """Names a cell binds at module level; for each imported one (import statement's dump, module, name); and the
    names bound by def and class."""
    names, imported, defined = set(), {}, set()
    for node in tree.body:
        nested = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        for sub in [node] if nested else ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
                defined.add(sub.name)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                names.add(sub.id)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                for alias in sub.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    names.add(bound)
                    module, name = (alias.name, None) if isinstance(sub, ast.Import) else (sub.module or "", alias.name)
                    imported[bound] = (ast.dump(sub), module, name)
    return names, imported, defined


def _top(module: str) -> str:
    return module.split(".")[0]


def lab_of(template) -> Lab:
    """The context every answer cell of this lab is checked in."""
    given, defined, tests, imports = set(), set(), set(), {}
    for cell in template.cells:
        if cell.cell_type != "code" or _cell_kind(cell) == "answer":
            continue
        try:
            names, imported, defs = _bindings(parse(cell.source))
        except SyntaxError:
            continue
        if _cell_kind(cell) == "test":
            tests |= names
        else:
            given |= names
            defined |= defs | set(imported)
            imports.update(imported)
    machinery = {bound for bound, (_, module, _) in imports.items() if _top(module) in MACHINERY}
    return Lab(given, defined, (tests - given) | HARNESS_NAMES, machinery,
               {(module, name) for _, module, name in imports.values() if _top(module) not in MACHINERY},
               {bound: dump for bound, (dump, _, _) in imports.items()}, answer_keys())


def answer_keys() -> set[tuple[str, str]]:
    """Every (module, name) an answer-key dict of the harnesses names (autograder/labs/*.py, the shared guard)."""
    from pathlib import Path

    from autograder.notebook_checks.guard import FORBIDDEN

    keys = {(m, n) for m, names in FORBIDDEN.items() for n in names}
    for path in sorted((Path(__file__).resolve().parents[1] / "labs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and node.keys and all(
                    isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.startswith("miniengine.")
                    for k in node.keys):
                try:
                    value = ast.literal_eval(node)
                except ValueError:
                    continue
                keys |= {(m, n) for m, names in value.items() if isinstance(names, list) for n in names}
    return keys
