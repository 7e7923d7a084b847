"""The notebooks' Open-in-Colab badges and Colab setup cells, derived from one setting.

Students open the notebooks on Colab from the *student edition* (what ``python -m autograder publish``
writes, pushed to GitHub), never from this instructor repository, which holds the solutions and the
hidden tests.  Where that edition lives is set once, in pyproject.toml::

    [tool.miniengine]
    student_repo = "https://github.com/OWNER/NAME"
    student_branch = "main"

``python -m autograder colab [NOTEBOOK...]`` rewrites every notebook's badge (in its first markdown cell)
and its setup cell (the second code cell, autograder/README.md notebook conventions rule 3) from that
setting; ``--check`` only lists the notebooks that disagree.  ``publish`` applies the same rewrite to the
notebooks it writes, so an edition always points at itself.
"""
from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from pathlib import Path

from autograder import course_paths

PYPROJECT = course_paths.REPO_ROOT / "pyproject.toml"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
# Any Open-in-Colab badge that opens a notebook from GitHub, whatever repository, branch or path it names.
BADGE = re.compile(r"\[!\[Open In Colab\]\([^)\s]*\)\]\(https://colab\.research\.google\.com/github/[^)\s]*\)")
CLONE_DIR = "/content/course"


@dataclasses.dataclass(frozen=True)
class Setting:
    repo: str    # https://github.com/OWNER/NAME
    branch: str

    @property
    def owner_and_name(self) -> str:
        return self.repo.removeprefix("https://github.com/")


def setting(pyproject: Path = PYPROJECT) -> Setting:
    """student_repo and student_branch from [tool.miniengine], checked, since every notebook is built from them."""
    try:
        table = tomllib.loads(Path(pyproject).read_text())["tool"]["miniengine"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise course_paths.LabError(f"{pyproject}: cannot read [tool.miniengine] ({type(e).__name__}: {e}); "
                              "it must set student_repo and student_branch") from None
    repo, branch = table.get("student_repo"), table.get("student_branch")
    if not isinstance(repo, str) or not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repo):
        raise course_paths.LabError(f"{pyproject}: [tool.miniengine] student_repo must look like "
                              f"https://github.com/OWNER/NAME (Colab opens notebooks from GitHub), got {repo!r}")
    if not isinstance(branch, str) or not re.fullmatch(r"[\w.-]+(/[\w.-]+)*", branch):
        raise course_paths.LabError(f"{pyproject}: [tool.miniengine] student_branch must be a branch name, got {branch!r}")
    return Setting(repo, branch)


def badge(rel: str, where: Setting) -> str:
    """The markdown of the badge that opens the notebook at ``rel`` (relative to the repository) on Colab."""
    return (f"[![Open In Colab]({BADGE_IMAGE})]"
            f"(https://colab.research.google.com/github/{where.owner_and_name}/blob/{where.branch}/{rel})")


def setup_source(where: Setting, lab: bool) -> str:
    """The Colab setup cell.  Labs install the grading extra: ``autograder check`` needs nbgrader.

    Lectures do not: nbgrader requires IPython 8 and notebook 7, which can upgrade packages that Colab's
    runtime pins (google-colab has pinned older ones), and a lecture has no use for nbgrader.
    """
    target = f"{CLONE_DIR}[grading]" if lab else CLONE_DIR
    why = "    # [grading] brings nbgrader, which `python -m autograder check` needs\n" if lab else ""
    return (
        "# Colab setup: fetch the course and install it. On your own machine this cell does nothing.\n"
        "import os\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        f'COURSE_REPO = "{where.repo}"  # the student edition: [tool.miniengine] in pyproject.toml\n'
        f'COURSE_BRANCH = "{where.branch}"\n'
        'if "google.colab" in sys.modules:\n'
        f'    if not os.path.isdir("{CLONE_DIR}"):\n'
        f'        subprocess.run(["git", "clone", "--depth", "1", "--branch", COURSE_BRANCH, COURSE_REPO, "{CLONE_DIR}"],\n'
        "                       check=True)\n"
        f"{why}"
        f'    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "{target}"], check=True)\n'
        f'    os.chdir("{CLONE_DIR}")\n'
        f'    sys.path.insert(0, "{CLONE_DIR}")  # the running kernel does not rescan site-packages after an install'
    )


def _text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _set_text(cell: dict, text: str) -> None:
    cell["source"] = text.splitlines(keepends=True)  # the list-of-lines form Jupyter itself writes


def rewrite(nb: dict, rel: str, where: Setting) -> dict:
    """A copy of the notebook whose badge and setup cell follow ``where``; raises if either cell is missing."""
    nb = json.loads(json.dumps(nb))
    cells = nb.get("cells", [])
    code = [c for c in cells if c.get("cell_type") == "code"]
    if len(code) < 2 or "google.colab" not in _text(code[1]):
        raise course_paths.LabError(f"{rel}: the second code cell is not the Colab setup cell (it must check for "
                              "\"google.colab\"; autograder/README.md, notebook conventions rule 3)")
    _set_text(code[1], setup_source(where, lab=rel.startswith("labs/")))
    first_md = next((c for c in cells if c.get("cell_type") == "markdown"), None)
    if first_md is None or not BADGE.search(_text(first_md)):
        raise course_paths.LabError(f"{rel}: the first markdown cell has no Open in Colab badge to rewrite "
                              "(autograder/README.md, notebook conventions rule 4)")
    _set_text(first_md, BADGE.sub(lambda _: badge(rel, where), _text(first_md)))
    return nb


def dumps(nb: dict) -> str:
    """The notebooks' own JSON layout (one-space indent, UTF-8 as is, a final newline): a rewrite changes only what it must."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(course_paths.REPO_ROOT).as_posix()
    except ValueError:
        raise course_paths.LabError(f"{path}: not a notebook of this repository ({course_paths.REPO_ROOT})") from None


def sync(notebooks=None, check: bool = False) -> int:
    """Rewrite (or with ``check``, only compare) the badge and setup cell of each notebook; all of them by default."""
    where = setting()
    paths = [Path(p) for p in notebooks] if notebooks else course_paths.lectures() + [lab.source for lab in course_paths.all_labs()]
    if not paths:
        raise course_paths.LabError(f"no notebooks found under {course_paths.LECTURES} or {course_paths.LABS}")
    stale = []
    for path in paths:
        if not path.is_file():
            raise course_paths.LabError(f"{path}: no such notebook")
        rel = _relative(path)
        raw = path.read_text(encoding="utf-8")
        try:
            nb = json.loads(raw)
        except json.JSONDecodeError as e:
            raise course_paths.LabError(f"{rel}: not notebook JSON ({e})") from None
        new = dumps(rewrite(nb, rel, where))
        if new == raw:
            continue
        stale.append(rel)
        if not check:
            path.write_text(new, encoding="utf-8")
    verb = "disagree with" if check else "rewritten from"
    for rel in stale:
        print(f"{rel}: {'badge or setup cell out of date' if check else 'rewrote the badge and setup cell'}")
    print(f"{len(stale)} of {len(paths)} notebooks {verb} [tool.miniengine] ({where.repo}, branch {where.branch})")
    return 1 if check and stale else 0
