"""``publish OUT_DIR``: the student edition, a repository students clone or open on Colab.

What it holds, and why:

* ``labs/<lab>/<lab>.ipynb``: the released notebooks (``release``'s nbgrader generate_assignment: solutions
  replaced by stubs, hidden tests removed), at their source's path so that the Colab badges resolve there;
* ``lectures/``, ``miniengine/`` and ``data/`` as they are (no hidden data lives in data/);
* from ``autograder/``, only what ``check`` and the labs' test cells import (followed from their imports,
  so a new helper module travels with them), plus its README;
* the tests that need neither hidden data nor lab solutions (``STUDENT_TESTS``);
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

from . import colab, environment, layout, release

ROOT_FILES = ["Makefile", "pyproject.toml", "constraints.txt", "environment.yml", ".gitignore", ".ci/run"]
OPTIONAL_ROOT_FILES = ["LICENSE", "LICENSE.md", "LICENSE.txt"]
TREES = ["miniengine", "data", "lectures"]
# The modules a student's `python -m autograder check`, the labs' test cells and their last cells (`from autograder
# import own`) start from.  cli.py's own imports are followed only at module level: its verbs import their modules
# lazily, and most are instructors'.
AUTOGRADER_ROOTS = ["__init__", "__main__", "cli", "check", "notebook_checks", "sandbox", "own/__init__"]
AUTOGRADER_SHELL = {"cli"}
# Tests for students: the engine, the models, the notebooks' conventions and `check` on a released lab.
# Left out: every test that reads autograder/hidden/ or labs/ sources, and the instructors' verbs.
STUDENT_TESTS = ["conftest.py", "test_admission.py", "test_attention.py", "test_cli.py", "test_engine.py", "test_hf.py",
                 "test_kv_cache.py", "test_metrics.py", "test_model.py", "test_notebook_conventions.py",
                 "test_paged_viz.py", "test_project.py", "test_quant_viz.py", "test_reference.py",
                 "test_roofline.py", "test_sampling.py", "test_sim.py", "test_spec_viz.py", "test_student_check.py",
                 "test_tokenizer.py", "test_train.py"]
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
3. Check the whole lab from a terminal: `.venv/bin/python -m autograder check labs/lab01_naive_decode/lab01_naive_decode.ipynb`.
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
                             cwd=layout.REPO_ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise layout.LabError(f"publish needs the course's git repository at {layout.REPO_ROOT} "
                              f"to tell course files from local ones ({e})") from None
    return sorted({f for f in out.split("\0") if f and (layout.REPO_ROOT / f).is_file()})


def _autograder_modules() -> list[str]:
    """The autograder modules the roots need, followed through their imports (absolute and relative).

    A module is named by its path under autograder/ without ``.py`` (``labs/lab02``); every lab's harness
    (autograder/labs/) is a root, since the released test cells import them by name.
    """
    package = layout.REPO_ROOT / "autograder"
    needed = set()
    todo = list(AUTOGRADER_ROOTS) + ["labs/__init__"] + [f"labs/{p.stem}" for p in (package / "labs").glob("lab*.py")]

    def module_path(dotted: str) -> str | None:
        """``labs.lab02`` -> ``labs/lab02``; a package gives its __init__; None where no such file is here."""
        rel = dotted.replace(".", "/")
        for candidate in (rel, f"{rel}/__init__"):
            if (package / f"{candidate}.py").is_file():
                return candidate
        return None

    while todo:
        name = todo.pop()
        if name in needed:
            continue
        path = package / f"{name}.py"
        if not path.is_file():
            raise layout.LabError(f"{path}: missing, but the student edition needs it")
        needed.add(name)
        here = name.rsplit("/", 1)[0].replace("/", ".") if "/" in name else ""  # the module's own package
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        nodes = tree.body if name in AUTOGRADER_SHELL else list(ast.walk(tree))
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                base = ".".join(here.split(".")[: len(here.split(".")) - (node.level - 1)]) if here else ""
                prefix = f"{base}." if base else ""
                found = ([f"{prefix}{node.module}"] + [f"{prefix}{node.module}.{a.name}" for a in node.names]
                         if node.module else [f"{prefix}{a.name}" for a in node.names])
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autograder."):
                mod = node.module.split(".", 1)[1]
                found = [mod] + [f"{mod}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "autograder":  # from autograder import hidden_spec
                found = [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name.split(".", 1)[1] for a in node.names if a.name.startswith("autograder.")]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # a kernel told to run code, e.g. --IPKernelApp.exec_lines=import autograder.sandbox
                found = re.findall(r"(?:import|-m)\s+autograder\.([\w.]+)", node.value)
            else:
                continue
            todo += [m for m in (module_path(f) for f in found) if m]
    return [f"autograder/{name}.py" for name in sorted(needed)]


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
        raise layout.LabError("README.md: expected its first lines to give `make lab` and `make test` in a ```bash block")
    out = [head[:block.start()] + STUDENT_COMMANDS + head[block.end():]]
    titles = [title for title, _ in sections]
    if "For students" not in titles:
        raise layout.LabError("README.md: no '## For students' section to rewrite for the student edition")
    for title, part in sections[1:]:
        if title in INSTRUCTOR_SECTIONS:
            continue
        out.append(STUDENT_SECTION + "\n" if title == "For students" else part)
    return "".join(out).rstrip("\n") + "\n"


def _check_out_dir(out: Path, force: bool) -> list[Path]:
    """Refuse a folder that is not empty (unless force) or that overlaps the sources; returns what force replaces."""
    root = layout.REPO_ROOT
    if out == root or root.is_relative_to(out):
        raise layout.LabError(f"{out}: would hold the course repository itself; choose an empty folder elsewhere")
    for source in TREES + ["labs", "autograder", "tests"]:
        if out.is_relative_to(root / source):
            raise layout.LabError(f"{out}: inside {root / source}, which publish copies from; choose another folder")
    if out.exists() and not out.is_dir():
        raise layout.LabError(f"{out}: exists and is not a folder")
    leftovers = [p for p in out.iterdir() if p.name != ".git"] if out.is_dir() else []
    if leftovers and not force:
        raise layout.LabError(f"{out}: not empty ({len(leftovers)} entries); publish writes a whole edition, "
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
            raise layout.LabError(f"{src}: {marker!r} is in the notebook to publish as {rel}; not publishing")
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
    labs = layout.find_labs()
    replaced = _check_out_dir(out, force)
    files = _git_files(TREES) + _autograder_modules() + ["autograder/README.md"]
    files += [f"tests/{name}" for name in STUDENT_TESTS]
    files += ROOT_FILES + [f for f in OPTIONAL_ROOT_FILES if (layout.REPO_ROOT / f).is_file()]
    missing = [f for f in files if not (layout.REPO_ROOT / f).is_file()]
    if missing:
        raise layout.LabError(f"the student edition needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} missing")
    readme = student_readme((layout.REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    # Everything that can fail runs before the folder is touched: a failed publish leaves it as it was.
    environment.prepare()
    for lab in labs:
        release.generate(lab, quiet=True)  # nbgrader's stubs in course/release/, regenerated only if the source changed
    released = {(Path("labs") / lab.name / src.relative_to(lab.release.parent)).as_posix(): src
                for lab in labs for src in sorted(lab.release.parent.rglob("*")) if src.is_file()}
    # A pristine copy of each release, which `check` runs with the student's answers in it (autograder/assembly.py):
    # the copy in labs/ is the one students edit.
    released |= {f"autograder/released/{lab.name}.ipynb": lab.release for lab in labs}
    sources = {rel: layout.REPO_ROOT / rel for rel in files} | released
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
          f"{len(layout.lectures())} lectures; Colab opens it from {where.repo} (branch {where.branch})")
    return 0
