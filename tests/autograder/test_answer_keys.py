"""Every answer-key name of every lab names real code, so that a move or a rename cannot disarm the guard.

``checks.reference_forbidden`` swaps the code of each named function while a test runs; a name that resolves to
nothing would guard nothing.  The names live in autograder/notebook_checks/__init__.py (FORBIDDEN, COURSE_PARTS), in each
lab's harness (autograder/labs/labNN.py) and in the labs' test cells: every dict literal that maps a
``miniengine.`` module to a list of names is an answer key.
"""
import ast
import importlib
import json

import pytest

from autograder import notebook_checks as checks
from miniengine.paths import REPO_ROOT


def _answer_key_dicts(tree) -> list[dict]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and node.keys and all(
                isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.startswith("miniengine.")
                for k in node.keys):
            try:
                value = ast.literal_eval(node)
            except ValueError:
                continue
            if all(isinstance(v, list) for v in value.values()):
                found.append(value)
    return found


def answer_keys() -> dict[tuple[str, str], set[str]]:
    """(module, name) -> where it is named."""
    keys: dict[tuple[str, str], set[str]] = {}

    def add(where, mapping):
        for module, names in mapping.items():
            for name in names:
                keys.setdefault((module, name), set()).add(where)

    add("notebook_checks.FORBIDDEN", checks.FORBIDDEN)
    for part, target in checks.COURSE_PARTS.items():
        if target is not None:
            keys.setdefault(target, set()).add(f"notebook_checks.COURSE_PARTS[{part!r}]")
    for path in sorted((REPO_ROOT / "autograder" / "labs").rglob("*.py")):
        for mapping in _answer_key_dicts(ast.parse(path.read_text())):
            add(str(path.relative_to(REPO_ROOT)), mapping)
    for path in sorted((REPO_ROOT / "labs").glob("*/*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                try:
                    tree = ast.parse("".join(cell["source"]))
                except SyntaxError:
                    continue  # a cell with IPython magics holds no answer key
                for mapping in _answer_key_dicts(tree):
                    add(f"{path.name}:{cell.get('id')}", mapping)
    return keys


KEYS = answer_keys()


# Labs whose graded parts no course function provides, so that nothing is forbidden: their harness says so with an
# empty ANSWER_KEY. None now: lab 10's serving glue has none, but its Task 4 (penalties, stop strings) does.
NO_ANSWER_KEY: set = set()


def test_every_lab_has_an_answer_key():
    """Lab 01's is notebook_checks.FORBIDDEN (the sampler and the reference); every later lab names its own."""
    import autograder.labs

    labs = sorted(p.name.split("_")[0] for p in (REPO_ROOT / "labs").glob("lab*"))
    named = {where.replace("autograder/labs/", "").split("/")[0].split("_")[0].split(".")[0].split(":")[0]
             for places in KEYS.values() for where in places}
    assert FORBIDDEN_LAB01 <= {m for m, _ in KEYS}, "Lab 01's answer key is notebook_checks.FORBIDDEN"
    for lab in NO_ANSWER_KEY:
        assert autograder.labs.pristine(lab).ANSWER_KEY == {}, f"{lab}'s harness names an answer key: drop it here"
    missing = [lab for lab in labs[1:] if lab not in named and lab not in NO_ANSWER_KEY]
    assert not missing, f"no answer key found for {missing}: has the reader lost track of where they live?"


FORBIDDEN_LAB01 = {"miniengine.reference", "miniengine.sampling"}


@pytest.mark.parametrize("module, name", sorted(KEYS), ids=[f"{m}:{n}" for m, n in sorted(KEYS)])
def test_every_answer_key_name_is_a_function_of_the_course(module, name):
    obj = checks._resolve(importlib.import_module(module), name)
    assert list(checks._functions(obj)) or isinstance(obj, type), (
        f"{module}.{name} (named in {sorted(KEYS[module, name])}) is neither a function nor a class")


def test_a_name_that_names_nothing_stops_the_guard_instead_of_being_skipped():
    with pytest.raises(checks.AnswerKeyError, match=r"miniengine.sampling.no_such_sampler, but the module has no "
                                                    r"'no_such_sampler'"):
        with checks.reference_forbidden("x", forbidden={"miniengine.sampling": ["no_such_sampler"]}):
            pass
    with pytest.raises(checks.AnswerKeyError, match=r"SamplingParams has no 'no_such_method'"):
        with checks.reference_forbidden("x", forbidden={"miniengine.sampling": ["SamplingParams.no_such_method"]}):
            pass
    with pytest.raises(checks.AnswerKeyError, match=r"miniengine.sampling.SamplingParams, which is not a function"):
        with checks.reference_forbidden("x", forbidden={"miniengine.sampling": ["SamplingParams"]}):
            pass
