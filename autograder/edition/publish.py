"""``publish OUT_DIR``: the student edition, a repository students clone or open on Colab.

What it holds, and why:

* ``labs/<lab>/<lab>.ipynb``: the released notebooks (``release``'s nbgrader generate_assignment: solutions
  replaced by stubs, hidden tests removed), at their source's path so that the Colab badges resolve there;
* ``lectures/``, ``miniengine/`` and ``data/`` as they are (no hidden data lives in data/);
* from ``autograder/``, its top level and the packages ``check`` and the labs' test cells use (``SHIPPED_PACKAGES``);
  never the instructors' packages: grading, the sandbox, the edition, course QA and the hidden data;
* the tests marked ``student_edition``, which need neither hidden data nor lab solutions, and their helpers;
* Makefile, pyproject.toml, constraints.txt, environment.yml, .gitignore, .ci/run, LICENSE if any, and a
  README for students: this one without the instructors' sections and with "For students" for the edition.

What stays out: the lab sources (solutions, hidden tests), ``autograder/hidden/``, and the instructors'
verbs (release, grade, feedback, verify, regress, bench, publish, book), which need them.  Every notebook
written gets its Colab badge and setup cell from [tool.miniengine] in pyproject.toml (``colab``).  The
files come from git (tracked, plus new files not ignored), so checkpoints and caches never travel.
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

from autograder import course_paths, environment
from autograder.edition import colab
from autograder.notebooks import assignments

ROOT_FILES = ["Makefile", "pyproject.toml", "constraints.txt", "environment.yml", ".gitignore", ".ci/run"]
OPTIONAL_ROOT_FILES = ["LICENSE", "LICENSE.md", "LICENSE.txt"]
TREES = ["miniengine", "data", "lectures"]
# What ships of autograder/ is a rule of folders (autograder/README.md, The map): the top level and these packages,
# whole. The others are instructors' code or hidden data, and none ships; the import-linter contract "shipped autograder
# code imports no instructors' package" (pyproject.toml) keeps the shipped part from needing them.
SHIPPED_PACKAGES = ["answer_policy", "labs", "notebook_checks", "notebooks", "own"]
INSTRUCTOR_PACKAGES = list(course_paths.INSTRUCTOR_PACKAGES)
# Tests for students: every test file marked `student_edition` (tests/conftest.py says what the mark promises, and
# tests/autograder/test_publish.py checks that each marked file keeps it), with the helpers they import.
STUDENT_TEST_MARK = "student_edition"
# The README's sections that are for instructors only, and the one rewritten for the edition.
INSTRUCTOR_SECTIONS = {"For instructors and TAs", "Student edition and course book"}
STUDENT_COMMANDS = """\
```bash
make lab    # creates .venv, installs the pinned set, opens JupyterLab on the course
make test   # creates .venv if needed, then runs the tests: engine, notebook conventions, autograder check
```"""
STUDENT_SECTION = """\
## For students

1. `make lab`. JupyterLab opens on the course: the lectures are in `lectures/`, your lab notebooks in `labs/`.
2. Read the lecture, then work the lab in order: each task has a cell for your code, then visible tests.
3. Check the whole lab from a terminal: `.venv/bin/python -m autograder check lab01` (your copy, in `labs/`; a
   notebook's path works too).
   It runs a copy of your notebook in a fresh kernel and prints each visible test's result; the hidden
   tests are listed, and run when your notebook is graded.
4. Submit the notebook (the `.ipynb` file) as your instructor asks. Hidden tests run on other prompts: make
   your code right, not just its outputs.
"""
FORBIDDEN_MARKERS = ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS")


def _git_files(paths: list[str]) -> list[str]:
    """Files under ``paths`` that git tracks or would track (new, not ignored), relative to the repository."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *paths],
                             cwd=course_paths.REPO_ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise course_paths.LabError(f"publish needs the course's git repository at {course_paths.REPO_ROOT} "
                              f"to tell course files from local ones ({e})") from None
    return sorted({f for f in out.split("\0") if f and (course_paths.REPO_ROOT / f).is_file()})


def autograder_files() -> list[str]:
    """The files of autograder/ that ship: its top level, and the packages in SHIPPED_PACKAGES."""
    shipped = []
    for rel in _git_files(["autograder"]):
        parts = Path(rel).parts[1:]
        if len(parts) == 1:
            if rel.endswith((".py", ".md")):
                shipped.append(rel)
        elif parts[0] in SHIPPED_PACKAGES:
            if rel.endswith(".py"):
                shipped.append(rel)
        elif parts[0] not in INSTRUCTOR_PACKAGES:
            raise course_paths.LabError(f"autograder/{parts[0]}/ is in neither SHIPPED_PACKAGES nor INSTRUCTOR_PACKAGES "
                                        "(autograder/edition/publish.py): say whether students get it")
    return shipped


def _is_marked(tree: ast.Module, mark: str) -> bool:
    """Whether a test module's ``pytestmark`` names ``pytest.mark.<mark>``."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return any(isinstance(n, ast.Attribute) and n.attr == mark for n in ast.walk(node.value))
    return False


def student_tests() -> list[str]:
    """tests/conftest.py, every test file marked STUDENT_TEST_MARK, and the tests' helper modules those import."""
    root = course_paths.REPO_ROOT
    files = [rel for rel in _git_files(["tests"]) if rel.endswith(".py")]
    helpers = {Path(rel).stem: rel for rel in files if not Path(rel).name.startswith(("test_", "conftest"))}
    todo = [rel for rel in files if Path(rel).name.startswith("test_")
            and _is_marked(ast.parse((root / rel).read_text(encoding="utf-8")), STUDENT_TEST_MARK)]
    shipped = {"tests/conftest.py"}
    while todo:
        rel = todo.pop()
        if rel in shipped:
            continue
        shipped.add(rel)
        for node in ast.walk(ast.parse((root / rel).read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            todo += [helpers[n] for n in names if n in helpers]
    return sorted(shipped)


def _sections(text: str) -> list[tuple[str, str]]:
    """(title, text) per '## ' section; the part before the first one has the title ''."""
    parts = re.split(r"(?m)^(?=## )", text)
    return [(p.splitlines()[0][3:].strip() if p.startswith("## ") else "", p) for p in parts]


def student_readme(text: str) -> str:
    """The README for the edition: same two commands, no instructors' sections, "For students" for the edition."""
    sections = _sections(text)
    head = sections[0][1]
    block = re.search(r"```bash\n(?:.*\n)*?```", head)
    if not block or "make lab" not in block.group() or "make test" not in block.group():
        raise course_paths.LabError("README.md: expected its first lines to give `make lab` and `make test` in a ```bash block")
    out = [head[:block.start()] + STUDENT_COMMANDS + head[block.end():]]
    titles = [title for title, _ in sections]
    if "For students" not in titles:
        raise course_paths.LabError("README.md: no '## For students' section to rewrite for the student edition")
    for title, part in sections[1:]:
        if title in INSTRUCTOR_SECTIONS:
            continue
        out.append(STUDENT_SECTION + "\n" if title == "For students" else part)
    return "".join(out).rstrip("\n") + "\n"


def _check_out_dir(out: Path, force: bool) -> list[Path]:
    """Refuse a folder that is not empty (unless force) or that overlaps the sources; returns what force replaces."""
    root = course_paths.REPO_ROOT
    if out == root or root.is_relative_to(out):
        raise course_paths.LabError(f"{out}: would hold the course repository itself; choose an empty folder elsewhere")
    for source in TREES + ["labs", "autograder", "tests"]:
        if out.is_relative_to(root / source):
            raise course_paths.LabError(f"{out}: inside {root / source}, which publish copies from; choose another folder")
    if out.exists() and not out.is_dir():
        raise course_paths.LabError(f"{out}: exists and is not a folder")
    leftovers = [p for p in out.iterdir() if p.name != ".git"] if out.is_dir() else []
    if leftovers and not force:
        raise course_paths.LabError(f"{out}: not empty ({len(leftovers)} entries); publish writes a whole edition, "
                              "so give an empty folder, or --force to replace what is there")
    # --force keeps .git, so an edition can be published into a clone of the students' repository and committed.
    return leftovers


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)  # copy2 keeps .ci/run executable


def _render(src: Path, rel: str, where: colab.Setting) -> str:
    """The notebook as published: badge and setup cell from the setting; refused if a solution or hidden test is in it."""
    text = colab.dumps(colab.rewrite(json.loads(src.read_text(encoding="utf-8")), rel, where))
    for marker in FORBIDDEN_MARKERS:  # the release removes these; never publish a notebook where one survived
        if marker in text:
            raise course_paths.LabError(f"{src}: {marker!r} is in the notebook to publish as {rel}; not publishing")
    return text


def _opened_as(rel: str) -> str:
    """Where a notebook is opened from: a pristine release's badge and setup cell are those of its copy in labs/."""
    if rel.startswith("autograder/released/"):
        name = Path(rel).stem
        return f"labs/{name}/{name}.ipynb"
    return rel


def publish(out: Path, force: bool = False) -> int:
    out = Path(out).resolve()
    where = colab.setting()
    labs = course_paths.find_labs()
    replaced = _check_out_dir(out, force)
    files = _git_files(TREES) + autograder_files() + student_tests()
    files += ROOT_FILES + [f for f in OPTIONAL_ROOT_FILES if (course_paths.REPO_ROOT / f).is_file()]
    missing = [f for f in files if not (course_paths.REPO_ROOT / f).is_file()]
    if missing:
        raise course_paths.LabError(f"the student edition needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} missing")
    readme = student_readme((course_paths.REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    # Everything that can fail runs before the folder is touched: a failed publish leaves it as it was.
    environment.prepare()
    for lab in labs:
        assignments.generate(lab, quiet=True)  # nbgrader's stubs in course/release/, regenerated only if the source changed
    released = {(Path("labs") / lab.name / src.relative_to(lab.release.parent)).as_posix(): src
                for lab in labs for src in sorted(lab.release.parent.rglob("*")) if src.is_file()}
    # A pristine copy of each release, which `check` runs with the student's answers in it (autograder/notebooks/assembly.py):
    # the copy in labs/ is the one students edit.
    released |= {f"autograder/released/{lab.name}.ipynb": lab.release for lab in labs}
    sources = {rel: course_paths.REPO_ROOT / rel for rel in files} | released
    notebooks = {rel: _render(src, _opened_as(rel), where) for rel, src in sources.items() if src.suffix == ".ipynb"}

    for p in replaced:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    for rel, src in sources.items():
        if rel in notebooks:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(notebooks[rel], encoding="utf-8")
        else:
            _copy(src, out / rel)
    (out / "README.md").write_text(readme, encoding="utf-8")
    print(f"published the student edition to {out}: {len(sources)} files, {len(labs)} labs as released, "
          f"{len(course_paths.lectures())} lectures; Colab opens it from {where.repo} (branch {where.branch})")
    return 0
