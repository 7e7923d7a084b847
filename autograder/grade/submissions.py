"""What ``grade PATH`` was given: one notebook, a folder of them, or a zip of a folder.

Student ids come from the layout, so the usual ways of collecting work all do
the right thing:
    alice/lab01_naive_decode.ipynb                      -> alice (a folder per student)
    submitted/alice/lab01_naive_decode/lab01_...ipynb   -> alice (nbgrader's own layout)
    alice_lab01_naive_decode.ipynb, alice.ipynb         -> alice (loose files, lab name stripped)

Lab 10 serves the student's saved parts of labs 01-09 (autograder/own/), handed in as a folder ``mine/`` with the
notebook: beside it, or in a folder above it within the student's own (``alice/mine/``,
``submitted/alice/lab10_capstone/mine/``, a zip's top level when it holds one notebook); for a lone notebook, beside
it or where ``grade --mine`` says. ``snapshot_mine`` copies what the grader uses of it (``labNN.py``, regular files)
to a folder the sandbox mounts read-only.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from autograder import course_paths

SKIP_PARTS = {".ipynb_checkpoints", "__MACOSX", "__pycache__"}
CONTAINER_NAMES = {"submitted", "submissions", "student", "students", "autograded"}
MINE = "mine"  # the folder of a student's saved parts
MINE_LABS = ("lab10",)  # the labs whose tests serve them (lab 10's Task 3); every other lab grades the course's parts
MINE_FILE = re.compile(r"lab\d\d\.py")  # what of it the grader uses: the saved modules, nothing else
MINE_FILE_BYTES = 1 << 20  # a saved module is a few kilobytes; past this one is left out, with a note


@dataclasses.dataclass
class Submission:
    student: str
    lab: course_paths.Lab
    path: Path  # the notebook file as given (or as extracted from the zip)
    mine: Path | None = None  # the mine/ handed in with it (the student's saved parts), if any


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


def _mine_for(nb: Path, root: Path | None, whole_root: bool) -> Path | None:
    """The mine/ folder beside ``nb`` or above it, below ``root`` (at ``root`` too when ``whole_root``: the folder
    holds one notebook); beside it alone when there is no root (a lone notebook). A link is never followed."""
    folders = [nb.parent] if root is None else [
        f for f in [nb.parent, *nb.parent.parents] if f.is_relative_to(root) and (f != root or whole_root)]
    return next((f / MINE for f in folders if (f / MINE).is_dir() and not (f / MINE).is_symlink()), None)


def collect(path: Path, lab: course_paths.Lab | None = None, workdir: Path | None = None,
            student: str | None = None, mine: Path | None = None) -> list[Submission]:
    """Every submission under ``path``; a zip is extracted into ``workdir`` first.

    ``student`` names the student of a single notebook (ignored for folders and zips); ``mine`` the folder of its
    saved parts (else mine/ beside it).
    """
    path = Path(path)
    labs = course_paths.all_labs()
    if not path.exists():
        raise course_paths.LabError(f"{path}: no such file or folder (expected a notebook, a folder of notebooks or a zip)")
    if mine is not None and not (path.is_file() and path.suffix == ".ipynb"):
        raise course_paths.LabError(f"--mine names one student's saved parts: give a single notebook with it, not "
                                    f"{path} (in a folder or a zip, each student's mine/ goes beside their notebook)")
    if mine is not None and not Path(mine).is_dir():
        raise course_paths.LabError(f"--mine {mine}: no such folder (expected a student's mine/, holding lab01.py ...)")
    if path.is_file() and path.suffix.lower() == ".zip":
        target = Path(tempfile.mkdtemp(prefix="submissions-", dir=workdir))
        extract_zip(path, target)
        root = target
    elif path.is_file() and path.suffix == ".ipynb":
        lab_ = _which_lab(Path(path.name), lab, labs)
        return [Submission(safe_id(student) if student else _student_for_file(path, lab_), lab_, path,
                           Path(mine) if mine is not None else _mine_for(path, None, False))]
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
        subs.append(Submission(key[0], lab_, nb, _mine_for(nb, root, len(found) == 1)))
    return subs


def snapshot_mine(mine: Path, dest: Path) -> list[str]:
    """Copy the saved modules of ``mine`` (regular files named labNN.py, each at most MINE_FILE_BYTES) into ``dest``,
    readable by a sandbox's uid; returns a note for each file left out. Nothing else of it reaches the sandbox."""
    dest.mkdir(parents=True)
    os.chmod(dest, 0o755)
    notes = []
    for entry in sorted(mine.iterdir(), key=lambda p: p.name):
        if not MINE_FILE.fullmatch(entry.name):
            continue  # status files, caches, anything else: the grader reads none of them
        if entry.is_symlink() or not entry.is_file():
            notes.append(f"mine/{entry.name} is not a plain file (a link?): left out, so its parts are the course's")
        elif entry.stat().st_size > MINE_FILE_BYTES:
            notes.append(f"mine/{entry.name} is over {MINE_FILE_BYTES >> 20} MB: left out, so its parts are the course's")
        else:
            shutil.copyfile(entry, dest / entry.name, follow_symlinks=False)
            os.chmod(dest / entry.name, 0o644)
    return notes


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


def handed_in_mine(sub: Submission, dest: Path) -> tuple[Path | None, list[str]]:
    """For a lab that serves the saved parts (MINE_LABS): the copy of the submission's mine/ (snapshot_mine) and the
    notes its grade report carries; (None, []) for any other lab, or when none was handed in."""
    if sub.lab.name.split("_", 1)[0] not in MINE_LABS or sub.mine is None:
        return None, []  # (none handed in: the course's parts, as the test's output says; a note is for a problem)
    notes = snapshot_mine(sub.mine, dest)
    modules = ", ".join(p.name for p in sorted(dest.iterdir())) or "no saved module (labNN.py)"
    return dest, notes + [f"mine/ handed in ({modules}): Task 3 served every part of labs 01-09 they define that plugs "
                          f"into the engine, as handed in, and the course's for the rest"]
