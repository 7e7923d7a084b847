"""What ``grade PATH`` was given: one notebook, a folder of them, or a zip of a folder.

Student ids come from the layout, so the usual ways of collecting work all do
the right thing:
    alice/lab01_naive_decode.ipynb                      -> alice (a folder per student)
    submitted/alice/lab01_naive_decode/lab01_...ipynb   -> alice (nbgrader's own layout)
    alice_lab01_naive_decode.ipynb, alice.ipynb         -> alice (loose files, lab name stripped)
"""
from __future__ import annotations

import dataclasses
import re
import tempfile
import zipfile
from pathlib import Path

from autograder import course_paths

SKIP_PARTS = {".ipynb_checkpoints", "__MACOSX", "__pycache__"}
CONTAINER_NAMES = {"submitted", "submissions", "student", "students", "autograded"}


@dataclasses.dataclass
class Submission:
    student: str
    lab: course_paths.Lab
    path: Path  # the notebook file as given (or as extracted from the zip)


def safe_id(text: str) -> str:
    """Student ids become folder names and database keys: keep them to letters, digits, '.', '_' and '-'."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._-")
    return cleaned or "student"


def _strip_lab(stem: str, lab: course_paths.Lab) -> str:
    short = lab.name.split("_", 1)[0]  # lab01
    for name in (lab.name, short):
        stem = re.sub(re.escape(name), "", stem, flags=re.IGNORECASE)
    return stem.strip("._- ")


def _which_lab(rel: Path, lab: course_paths.Lab | None, labs: list[course_paths.Lab]) -> course_paths.Lab:
    if lab is not None:
        return lab
    text = rel.as_posix().lower()
    named = [lb for lb in labs if lb.name.lower() in text] or [lb for lb in labs if lb.name.split("_", 1)[0] in text]
    if len(named) == 1:
        return named[0]
    if len(labs) == 1:
        return labs[0]
    raise course_paths.LabError(f"cannot tell which lab {rel} is for: pass --lab (labs: {', '.join(lb.name for lb in labs)})")


def _student_for(rel: Path, lab: course_paths.Lab) -> str:
    """The first folder under PATH, else the file name without the lab's name."""
    folders = [p for p in rel.parts[:-1] if p.lower() not in CONTAINER_NAMES and not p.startswith(lab.name)
               and p != lab.name.split("_", 1)[0]]
    if folders:
        return safe_id(folders[0])
    return safe_id(_strip_lab(rel.stem, lab) or "student")


def _student_for_file(path: Path, lab: course_paths.Lab) -> str:
    """A lone notebook: its name without the lab's, else the nearest folder that is neither the lab's nor a container."""
    stem = _strip_lab(path.stem, lab)
    if stem:
        return safe_id(stem)
    for parent in path.resolve().parents:
        name = parent.name
        if not name or name.lower() in CONTAINER_NAMES or parent == course_paths.REPO_ROOT:
            break
        if not name.startswith(lab.name) and name != lab.name.split("_", 1)[0]:
            return safe_id(name)
    return "student"


def collect(path: Path, lab: course_paths.Lab | None = None, workdir: Path | None = None,
            student: str | None = None) -> list[Submission]:
    """Every submission under ``path``; a zip is extracted into ``workdir`` first.

    ``student`` names the student of a single notebook (ignored for folders and zips).
    """
    path = Path(path)
    labs = course_paths.all_labs()
    if not path.exists():
        raise course_paths.LabError(f"{path}: no such file or folder (expected a notebook, a folder of notebooks or a zip)")
    if path.is_file() and path.suffix.lower() == ".zip":
        target = Path(tempfile.mkdtemp(prefix="submissions-", dir=workdir))
        extract_zip(path, target)
        root = target
    elif path.is_file() and path.suffix == ".ipynb":
        lab_ = _which_lab(Path(path.name), lab, labs)
        return [Submission(safe_id(student) if student else _student_for_file(path, lab_), lab_, path)]
    elif path.is_dir():
        root = path
    else:
        raise course_paths.LabError(f"{path}: expected a .ipynb notebook, a folder or a .zip")

    found = sorted(p for p in root.rglob("*.ipynb") if p.is_file() and not SKIP_PARTS & set(p.relative_to(root).parts))
    if not found:
        raise course_paths.LabError(f"{path}: no notebooks (.ipynb) inside")
    subs: list[Submission] = []
    taken: dict[tuple[str, str], Path] = {}
    for nb in found:
        rel = nb.relative_to(root)
        lab_ = _which_lab(rel, lab, labs)
        sid = _student_for(rel, lab_)
        key, n = (sid, lab_.name), 1
        while key in taken:  # two notebooks for one student and lab: grade both, under distinct ids
            n += 1
            key = (f"{sid}-{n}", lab_.name)
        taken[key] = nb
        subs.append(Submission(key[0], lab_, nb))
    return subs


def extract_zip(path: Path, target: Path) -> None:
    """Extract, refusing members that would land outside ``target`` (absolute paths, '..')."""
    try:
        with zipfile.ZipFile(path) as zf:
            for member in zf.infolist():
                dest = (target / member.filename).resolve()
                if not dest.is_relative_to(target.resolve()):
                    raise course_paths.LabError(f"{path}: member {member.filename!r} would extract outside the folder")
                zf.extract(member, target)
    except zipfile.BadZipFile as e:
        raise course_paths.LabError(f"{path}: not a readable zip file ({e})") from None
