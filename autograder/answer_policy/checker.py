"""The answer policy's reading of answer cells: a syntax-tree walk with Python's own scoping (symtable)."""
from __future__ import annotations

import ast
import symtable

from autograder.answer_policy.context import Lab, _bindings, _top, parse
from autograder.answer_policy.rules import (ATTRIBUTE_BUILTINS, BUILTIN_NAMES, DOORS, FORBIDDEN_CALLS, FORMAT_DUNDER,
                                            FRAME_ATTRIBUTES, MACHINERY, PLAIN_DUNDERS, STANDARD, TAKEOVER_METHODS,
                                            Refusal)

SCOPES = {ast.FunctionDef: None, ast.AsyncFunctionDef: None, ast.ClassDef: None, ast.Lambda: "lambda",
          ast.ListComp: "listcomp", ast.SetComp: "setcomp", ast.DictComp: "dictcomp", ast.GeneratorExp: "genexpr"}


class _Checker(ast.NodeVisitor):
    def __init__(self, cell: str, lab: Lab, own_private: set[str], magic_lines: set[int], own_globals: set[str],
                 table: symtable.SymbolTable | None):
        self.cell, self.lab, self.own_private, self.magic_lines = cell, lab, own_private, magic_lines
        self.own_globals = own_globals  # module-level names the answer cells bind themselves
        self.scopes = [table] if table is not None else []
        self.found: list[Refusal] = []
        self.owners: list[str | None] = [None]  # the innermost method's first parameter (its self), if any

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for item in node.body:  # a method's first parameter is the answer's own object; anything else is not
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in getattr(item, "decorator_list", []))
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not static:
                item.own_object = item.args.posonlyargs[0].arg if item.args.posonlyargs else (
                    item.args.args[0].arg if item.args.args else None)
        self.owners.append(None)
        try:
            self.generic_visit(node)
        finally:
            self.owners.pop()

    def visit(self, node):
        kind = type(node)
        if kind not in SCOPES or not self.scopes:
            return super().visit(node)
        name = SCOPES[kind] or node.name
        children = [t for t in self.scopes[-1].get_children() if t.get_name() == name]
        child = min(children, key=lambda t: abs(t.get_lineno() - node.lineno), default=None)
        if child is None:
            return super().visit(node)
        self.scopes.append(child)
        try:
            return super().visit(node)
        finally:
            self.scopes.pop()

    def is_global(self, name: str) -> bool:
        """Whether ``name`` here means a global of the notebook (symtable's view of the cell's scopes)."""
        if len(self.scopes) <= 1:
            return True
        try:
            sym = self.scopes[-1].lookup(name)
        except KeyError:
            return True
        return sym.is_global() or sym.is_declared_global()

    def refuse(self, node, construct: str, why: str) -> None:
        self.found.append(Refusal(self.cell, getattr(node, "lineno", 0), construct, why))

    # -- names and calls
    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if name in FORBIDDEN_CALLS:
            if node.lineno in self.magic_lines:
                self.refuse(node, "an IPython magic or shell command (% or !)", "answer cells hold Python only")
            else:
                self.refuse(node, name, f"{FORBIDDEN_CALLS[name]}; an answer may not use it")
        elif name in ATTRIBUTE_BUILTINS:
            self.refuse(node, name, f"{name} is allowed only as a call with a literal attribute name, "
                                    f"such as {name}(x, \"size\")")
        elif name.startswith("__") and name.endswith("__") and name != "__name__":
            in_class = len(self.scopes) > 1 and self.scopes[-1].get_type() == "class"
            if not (in_class and isinstance(node.ctx, ast.Store) and name in PLAIN_DUNDERS | {"__slots__"}):
                self.refuse(node, name, "the interpreter's dunder names are out of an answer's reach")
        elif not self.is_global(name):
            return
        elif name in self.lab.machinery:
            self.refuse(node, name, f"the module {name} is the interpreter's machinery, which an answer may not use")
        elif name in self.lab.tests_only and name not in self.own_globals:
            self.refuse(node, name, "this name belongs to the test cells (the harness and what it holds); "
                                    "an answer may not read or change it")

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_BUILTINS:
            attr = node.args[1] if len(node.args) > 1 else None
            if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                self.attribute(node, attr.value, f"{node.func.id}(..., {attr.value!r})")
                if node.func.id in ("setattr", "delattr") and node.args:
                    self.private_write(node, node.args[0], attr.value, f"{node.func.id}(..., {attr.value!r})")
            else:
                self.refuse(node, node.func.id, f"{node.func.id} is allowed only with a literal attribute name, "
                                                f"such as {node.func.id}(x, \"size\")")
            for arg in [node.args[0]] + node.args[2:] if node.args else []:
                self.visit(arg)
            for kw in node.keywords:
                self.visit(kw)
            return
        self.generic_visit(node)

    # -- attributes
    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.attribute(node, node.attr, f".{node.attr}")
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            shown = f".{node.attr} = ..." if isinstance(node.ctx, ast.Store) else f"del .{node.attr}"
            self.private_write(node, node.value, node.attr, shown)
        self.generic_visit(node)

    def private_write(self, node, target, attr: str, construct: str) -> None:
        """A private attribute is set (or deleted) only on the answer's own object: ``self`` in a method of a class
        the answer cells define. On any other object it could be a course object's inside that the harness reads (a
        counter, a peak, a cache) under the name the answer also gives its own."""
        if not attr.startswith("_") or (attr.startswith("__") and attr.endswith("__")):
            return
        if not (isinstance(target, ast.Name) and target.id == self.owners[-1]):
            self.refuse(node, construct, "a private attribute is set only on your own object (self, in a method of a "
                                         "class your answer defines): on any other object it could change the "
                                         "insides of a course object the tests read")

    def attribute(self, node, attr: str, construct: str) -> None:
        if attr.startswith("__") and attr.endswith("__"):
            if attr not in PLAIN_DUNDERS:
                self.refuse(node, construct, "dunder attributes reach the interpreter's insides (functions' globals "
                                             "and code, classes' subclasses); an answer may not use them")
        elif attr in FRAME_ATTRIBUTES:
            self.refuse(node, construct, "frames and tracebacks hold the tests' variables; an answer may not reach them")
        elif attr in DOORS:
            self.refuse(node, construct, f"{attr} is the interpreter's machinery (or a door to it), which an answer "
                                         f"may not reach, not even through another module")
        elif attr.startswith("_") and attr not in self.own_private:
            self.refuse(node, construct, "a private attribute that your answer cells do not define: the course's "
                                         "objects keep their insides to themselves; use their public interface")

    # -- imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.module(node, alias.name, None)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.module(node, "." * node.level + (node.module or ""), alias.name)

    def module(self, node, module: str, name: str | None) -> None:
        shown = f"import {module}" if name is None else f"from {module} import {name}"
        top = _top(module)
        if module.startswith(".") or top in MACHINERY or name in DOORS:
            self.refuse(node, shown, "the interpreter's machinery and the grader are out of an answer's reach")
            return
        keys = {n for m, n in self.lab.answer_keys if m == module}
        if name is not None and (name in keys or any(k.startswith(name + ".") for k in keys)):
            self.refuse(node, shown, "this is the course's answer key for the lab: write this part yourself")
        elif name == "*":
            self.refuse(node, shown, "a star import hides what it brings in; name what you import")
        elif top not in STANDARD and (module, name) not in self.lab.imports and (module, None) not in self.lab.imports:
            self.refuse(node, shown, "answers import from Python's numeric and container modules and from what the "
                                     "lab's given cells import; this module is not among them")

    # -- definitions
    def visit_FunctionDef(self, node) -> None:
        if node.name in TAKEOVER_METHODS:
            self.refuse(node, f"def {node.name}", "this method lets an object take over what the harness does with it")
        # A method's own object; a function nested in it keeps it (unless a parameter of its own shadows the name).
        owner = getattr(node, "own_object", None)
        if owner is None and self.owners[-1] not in {a.arg for a in node.args.posonlyargs + node.args.args
                                                     + node.args.kwonlyargs}:
            owner = self.owners[-1]
        self.owners.append(owner)
        try:
            self.generic_visit(node)
        finally:
            self.owners.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and FORMAT_DUNDER.search(node.value):
            self.refuse(node, "a format string that reads a private or dunder attribute",
                        "str.format reaches attributes the rules above keep out of reach")


def _magic_lines(source: str) -> set[int]:
    return {i for i, line in enumerate(source.splitlines(), 1) if line.lstrip().startswith(("%", "!"))}


def own_private_names(trees: list[ast.Module]) -> set[str]:
    """Private attribute names the answer cells define: assigned on an object, or a method or class attribute."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    for target in (item.targets if isinstance(item, ast.Assign) else
                                   [item.target] if isinstance(item, ast.AnnAssign) else []):
                        if isinstance(target, ast.Name):
                            names.add(target.id)
    return {n for n in names if n.startswith("_")}


def _module_level(tree: ast.Module, source: str, cell: str, lab: Lab) -> list[Refusal]:
    """Module-level bindings that would change what a test cell sees, and globals named by functions (symtable)."""
    found = []
    try:
        table = symtable.symtable(source, f"<{cell}>", "exec")
    except SyntaxError:
        return found
    _, imported, _ = _bindings(tree)
    imported = {bound: dump for bound, (dump, _, _) in imported.items()}
    first_line = {}
    for node in ast.walk(tree):
        for name in ([node.id] if isinstance(node, ast.Name) else
                     [node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else
                     [a.asname or a.name.split(".")[0] for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []):
            first_line.setdefault(name, getattr(node, "lineno", 0))
    for sym in table.get_symbols():
        name = sym.get_name()
        if not (sym.is_assigned() or sym.is_imported() or sym.is_namespace()) or name in lab.tests_only:
            continue
        line = first_line.get(name, 0)
        if name in lab.given_defined and imported.get(name) != lab.given_imports.get(name, "-"):
            found.append(Refusal(cell, line, name, "the lab's given cells define this name, and the tests use it; "
                                                   "an answer may not redefine it (choose another name)"))
        elif name in BUILTIN_NAMES and name not in lab.given:
            found.append(Refusal(cell, line, name, "this is one of Python's built-ins, which the tests use; an answer "
                                                   "may not redefine it at the top of a cell (choose another name)"))

    def globals_of(t):
        for child in t.get_children():
            for sym in child.get_symbols():
                if sym.is_declared_global() and sym.is_assigned() and sym.get_name() in lab.given_defined:
                    found.append(Refusal(cell, first_line.get(sym.get_name(), 0), f"global {sym.get_name()}",
                                         "the lab's given cells define this name; an answer may not rebind it"))
            globals_of(child)

    globals_of(table)
    return found


def check_answers(answers: dict[str, str], lab: Lab) -> list[Refusal]:
    """Refusals for a submission's answer cells (grade id -> source), in the order of the cells and lines."""
    trees, found = {}, []
    for cell, source in answers.items():
        try:
            trees[cell] = parse(source)
        except SyntaxError:
            continue  # it fails on its own in the kernel: nothing in it can run
    from IPython.core.inputtransformer2 import TransformerManager

    own_private = own_private_names(list(trees.values()))
    own_globals = set().union(*(_bindings(t)[0] for t in trees.values()))
    for cell, tree in trees.items():
        source = TransformerManager().transform_cell(answers[cell])
        try:
            table = symtable.symtable(source, f"<{cell}>", "exec")
        except SyntaxError:
            table = None
        checker = _Checker(cell, lab, own_private, _magic_lines(answers[cell]), own_globals, table)
        checker.visit(tree)
        found += checker.found + _module_level(tree, source, cell, lab)
    return sorted(set(found), key=lambda r: (list(answers).index(r.cell), r.line, r.construct))
