"""Where the course's folders are, and which labs and lectures exist.

Every path is absolute and derived from the repository root, so each verb
works from any directory.  The three working folders can be moved with
environment variables (the tests do, to leave the real ones alone):
AUTOGRADER_COURSE_DIR, AUTOGRADER_STUDENT_DIR and AUTOGRADER_BUILD_DIR.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LABS = REPO_ROOT / "labs"            # nbgrader's source directory: solutions and hidden tests inside
LECTURES = REPO_ROOT / "lectures"
COURSE = Path(os.environ.get("AUTOGRADER_COURSE_DIR") or REPO_ROOT / "course").resolve()    # nbgrader's folders (git-ignored)
STUDENT = Path(os.environ.get("AUTOGRADER_STUDENT_DIR") or REPO_ROOT / "student").resolve()  # the student edition (git-ignored)
BUILD = Path(os.environ.get("AUTOGRADER_BUILD_DIR") or REPO_ROOT / "build").resolve()        # executed notebooks (git-ignored)
HIDDEN = REPO_ROOT / "autograder" / "hidden"
# The instructors' part of autograder/ (autograder/README.md, Map): the student edition holds none of it
# (autograder/edition/publish.py) and a grading kernel sees each as an empty folder (autograder/sandbox/bubblewrap.py),
# since qa/design/ holds the design parts' references and hidden/ the hidden data.
INSTRUCTOR_PACKAGES = ("edition", "grade", "hidden", "qa", "sandbox")


class LabError(ValueError):
    """A lab name that does not exist, or a path that is not what a verb needs; the message says which."""


@dataclasses.dataclass(frozen=True)
class Lab:
    name: str  # labNN_topic: the folder, the notebook's stem and nbgrader's assignment id

    @property
    def source(self) -> Path:
        return LABS / self.name / f"{self.name}.ipynb"

    @property
    def release(self) -> Path:
        return COURSE / "release" / self.name / f"{self.name}.ipynb"

    @property
    def student(self) -> Path:
        return STUDENT / self.name / f"{self.name}.ipynb"


def all_labs() -> list[Lab]:
    if not LABS.is_dir():
        return []
    return [Lab(d.name) for d in sorted(LABS.iterdir()) if (d / f"{d.name}.ipynb").is_file()]


def find_labs(names=None) -> list[Lab]:
    """The labs named (all of them when none are named); a name may be a prefix such as lab01."""
    labs = all_labs()
    if not names:
        if not labs:
            raise LabError(f"no labs found: expected labs/labNN_topic/labNN_topic.ipynb under {REPO_ROOT}")
        return labs
    chosen = []
    for name in names:
        name = Path(str(name).rstrip("/")).name.removesuffix(".ipynb")
        matches = [lab for lab in labs if lab.name == name] or [lab for lab in labs if lab.name.startswith(name + "_")]
        if len(matches) != 1:
            known = ", ".join(lab.name for lab in labs) or "none"
            raise LabError(f"no lab named {name!r} (labs: {known})")
        chosen.append(matches[0])
    return chosen


def is_student_edition() -> bool:
    """The student edition (``publish``) keeps each lab's pristine release in autograder/released/; labs/ then holds
    the notebooks students edit, where the instructors' labs/ holds the sources."""
    return (REPO_ROOT / "autograder" / "released").is_dir()


def student_notebook(name: str) -> Path:
    """Your copy of a lab's notebook, for ``check lab01``: labs/<lab>/ in the student edition, student/<lab>/ in the
    instructors' (where ``make lab`` publishes the labs)."""
    lab = find_labs([name])[0]
    path = lab.source if is_student_edition() else lab.student
    if not path.is_file():
        raise LabError(f"{path}: no such notebook (run `make lab` to publish the labs, or give the notebook's path)")
    return path


def lectures() -> list[Path]:
    return sorted(LECTURES.glob("*.ipynb")) if LECTURES.is_dir() else []
