"""Every notebook in lectures/ and labs/ follows the notebook conventions of autograder/README.md (rules 1-5).

Each rule is its own test, parametrized by notebook, so a failure names both the
notebook and the rule it breaks.  The notebooks are read as plain JSON: these
checks need neither Jupyter nor a kernel.  The student edition (``python -m
autograder publish``) runs them too, on its released labs.
"""
from __future__ import annotations

import ast
import json
import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
# The student edition has no hidden tests' data, and its labs/ holds the released notebooks, not the sources.
STUDENT_EDITION = not (REPO / "autograder" / "hidden").is_dir()


def course_notebooks() -> list[Path]:
    found = []
    for folder in ("lectures", "labs"):
        found += [p for p in sorted((REPO / folder).glob("**/*.ipynb")) if ".ipynb_checkpoints" not in p.parts]
    return found


NOTEBOOKS = course_notebooks()
LECTURES = [p for p in NOTEBOOKS if p.parts[len(REPO.parts)] == "lectures"]
LABS = [p for p in NOTEBOOKS if p.parts[len(REPO.parts)] == "labs"]


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        problem = str(e)
    pytest.fail(f"{rel(path)}: rule 'valid JSON': the file is not notebook JSON ({problem})")


def source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]


def ids(paths):
    return [rel(p) for p in paths]


def test_the_course_has_notebooks():
    assert LECTURES, f"rule 'lectures exist': no *.ipynb found under {rel(REPO / 'lectures')}/ (is the glob wrong?)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_is_a_valid_notebook(path):
    nbformat = pytest.importorskip("nbformat")
    try:
        nbformat.validate(nbformat.reads(path.read_text(encoding="utf-8"), as_version=nbformat.NO_CONVERT))
        return
    except Exception as e:  # ValidationError or a JSON error: either way, Jupyter could not open it
        problem = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    pytest.fail(f"{rel(path)}: rule 'valid nbformat': {problem}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_outputs_are_stripped(path):
    nb = load(path)
    cells = list(enumerate(nb.get("cells", [])))  # indices count every cell from 0, markdown included
    dirty = [i for i, c in cells if c.get("cell_type") == "code" and c.get("outputs")]
    counted = [i for i, c in cells if c.get("cell_type") == "code" and c.get("execution_count") is not None]
    assert not dirty, f"{rel(path)}: rule 'outputs stripped': cells {dirty} (counting from 0) have outputs"
    assert not counted, f"{rel(path)}: rule 'outputs stripped': cells {counted} (counting from 0) have an execution_count"
    assert "widgets" not in nb.get("metadata", {}), (
        f"{rel(path)}: rule 'outputs stripped': the notebook metadata still holds saved widget state ('widgets')")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_kernelspec_is_python3(path):
    spec = load(path).get("metadata", {}).get("kernelspec", {})
    assert spec.get("name") == "python3", (
        f"{rel(path)}: rule 'kernelspec python3': metadata.kernelspec.name is {spec.get('name')!r}, expected 'python3'")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_first_code_cell_is_the_parameters_cell(path):
    cells = code_cells(load(path))
    assert cells, f"{rel(path)}: rule 'parameters cell': the notebook has no code cells"
    first = cells[0]
    tags = first.get("metadata", {}).get("tags", [])
    assert "parameters" in tags, (
        f"{rel(path)}: rule 'parameters cell': the first code cell is not tagged 'parameters' (tags: {tags})")
    try:
        tree = ast.parse(source(first))
    except SyntaxError as e:
        tree, problem = None, str(e)
    if tree is None:
        pytest.fail(f"{rel(path)}: rule 'parameters cell': the first code cell is not valid Python ({problem})")
    assigned = {t.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    missing = sorted({"FAST", "DEVICE", "SEED"} - assigned)
    assert not missing, f"{rel(path)}: rule 'parameters cell': the first code cell does not define {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_second_code_cell_is_the_colab_setup_cell(path):
    cells = code_cells(load(path))
    assert len(cells) >= 2, f"{rel(path)}: rule 'Colab setup cell': there is no second code cell"
    assert "google.colab" in source(cells[1]), (
        f"{rel(path)}: rule 'Colab setup cell': the second code cell does not check for \"google.colab\"")


@pytest.mark.parametrize("path", LECTURES, ids=ids(LECTURES))
def test_lecture_has_an_open_in_colab_badge_for_itself(path):
    cells = load(path).get("cells", [])
    first_md = next((source(c) for c in cells if c.get("cell_type") == "markdown"), "")
    links = re.findall(r"colab\.research\.google\.com/github/[^/\s)]+/[^/\s)]+/blob/[^/\s)]+/([^\s)]+)", first_md)
    assert links, f"{rel(path)}: rule 'Colab badge': the first markdown cell has no Open in Colab link"
    assert rel(path) in links, (
        f"{rel(path)}: rule 'Colab badge': the badge opens {links}, not this notebook ({rel(path)})")


def solution_cells(nb: dict) -> list[tuple[int, dict]]:
    return [(i, c) for i, c in enumerate(nb.get("cells", []))
            if c.get("cell_type") == "code" and c.get("metadata", {}).get("nbgrader", {}).get("solution")]


@pytest.mark.parametrize("path", LABS, ids=ids(LABS))
def test_lab_solution_cells_are_delimited(path):
    nb = load(path)
    cells = solution_cells(nb)
    assert cells, f"{rel(path)}: rule 'solution delimiters': a lab notebook has no nbgrader solution cells"
    if STUDENT_EDITION:  # released: nbgrader replaced every solution with its stub
        leaked = [i for i, cell in cells if "### BEGIN SOLUTION" in source(cell) or "YOUR CODE HERE" not in source(cell)]
        assert not leaked, (f"{rel(path)}: rule 'solution delimiters': in the student edition every solution cell "
                            f"holds nbgrader's stub, but cells {leaked} (counted from 0) do not")
        return
    problems = []
    for i, cell in cells:
        src = source(cell)
        begin, end = src.find("### BEGIN SOLUTION"), src.find("### END SOLUTION")
        if begin < 0 or end < 0:
            problems.append(f"cell {i} lacks {'### BEGIN SOLUTION' if begin < 0 else '### END SOLUTION'}")
        elif end < begin:
            problems.append(f"in cell {i}, ### END SOLUTION comes before ### BEGIN SOLUTION")
    assert not problems, f"{rel(path)}: rule 'solution delimiters' (cells counted from 0): " + "; ".join(problems)


def colab_setting() -> tuple[str, str]:
    """[tool.miniengine] in pyproject.toml: the one place that says where students open the notebooks."""
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["miniengine"]
    return table["student_repo"], table["student_branch"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_badge_and_setup_cell_follow_the_one_colab_setting(path):
    """Rules 3 and 4 point at the student edition named in pyproject.toml (``python -m autograder colab`` rewrites them)."""
    repo, branch = colab_setting()
    fix = "run `python -m autograder colab` to rewrite them from [tool.miniengine] in pyproject.toml"
    nb = load(path)
    first_md = next((source(c) for c in nb.get("cells", []) if c.get("cell_type") == "markdown"), "")
    links = re.findall(r"https://colab\.research\.google\.com/github/[^\s)]+", first_md)
    expected = f"https://colab.research.google.com/github/{repo.removeprefix('https://github.com/')}/blob/{branch}/{rel(path)}"
    assert links and set(links) == {expected}, (
        f"{rel(path)}: rule 'Colab badge': the badge opens {links}, expected {expected}; {fix}")
    cells = code_cells(nb)
    setup = source(cells[1]) if len(cells) > 1 else ""
    assert f'COURSE_REPO = "{repo}"' in setup and f'COURSE_BRANCH = "{branch}"' in setup, (
        f"{rel(path)}: rule 'Colab setup cell': it does not clone {repo} (branch {branch}); {fix}")
    if path in LABS:  # `python -m autograder check` on Colab needs nbgrader: pyproject's grading extra
        assert '"/content/course[grading]"' in setup, (
            f"{rel(path)}: rule 'Colab setup cell': a lab's setup cell must install /content/course[grading]; {fix}")


def _returns_a_value(fn) -> bool:
    """Whether ``fn``'s own body (not the functions defined inside it) returns anything but None."""
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))).body[0]
    todo, found = list(tree.body), False
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue  # a function of its own: its returns are not this one's
        if isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            found = True
        todo.extend(ast.iter_child_nodes(node))
    return found


@pytest.mark.parametrize("path", LABS, ids=ids(LABS))
def test_a_test_cell_hands_nbgrader_no_number_as_its_score(path):
    """nbgrader scores a test cell by its last expression's value when that value reads as a number (a cell ending in
    ``lab.check_flags(...)``, which returns how many cases it checked, scores that count, not the cell's points). So a
    test cell's last statement is no expression, unless it is ``print(...)`` or a harness call that returns nothing."""
    import importlib

    import autograder.labs

    lab = importlib.reload(autograder.labs).pristine(path.parent.name.split("_", 1)[0])
    problems = []
    for cell in code_cells(load(path)):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("grade") or meta.get("solution"):
            continue
        tree = ast.parse(re.sub(r"^\s*### (BEGIN|END) HIDDEN TESTS\s*$", "", source(cell), flags=re.M))
        last = tree.body[-1] if tree.body else None
        if not isinstance(last, ast.Expr):
            continue
        call = last.value if isinstance(last.value, ast.Call) else None
        name = ast.unparse(call.func) if call else ""
        if name in ("print", "report.submit"):
            continue
        if name.startswith("lab.") and not _returns_a_value(getattr(lab, name[4:])):
            continue
        problems.append(f"{meta.get('grade_id')} ends in `{ast.unparse(last)[:60]}`")
    assert not problems, (f"{rel(path)}: rule 'no score by expression': assign the value (n = ...) or print it: "
                          + "; ".join(problems))
