"""nbgrader's generate_assignment for a lab, run only when its source folder changed.

nbgrader writes course/release/<lab>/ with solutions replaced by stubs and hidden tests removed, and records every
graded cell, hidden tests included, in course/gradebook.db.  Grading restores test cells from that database, which is
why grading, ``verify``, ``bench`` and ``publish`` regenerate a lab whose source changed since the last release: each
calls ``generate``, which does nothing when course/ already holds this exact source.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from autograder import course_paths
from autograder.notebooks.nbgrader_config import nbgrader_api, succeeded, write_config_file


def _fingerprints_file() -> Path:
    return course_paths.COURSE / ".source-fingerprints.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fingerprint(lab: course_paths.Lab) -> str:
    """A hash of every file in the lab's source folder: any edit means the gradebook is stale."""
    h = hashlib.sha256()
    for path in sorted(p for p in lab.source.parent.rglob("*") if p.is_file() and ".ipynb_checkpoints" not in p.parts
                       and "__pycache__" not in p.parts):
        h.update(path.relative_to(lab.source.parent).as_posix().encode())
        h.update(sha256(path).encode())
    return h.hexdigest()


def load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def generate(lab: course_paths.Lab, force: bool = False, quiet: bool = False) -> bool:
    """Run generate_assignment unless course/ already holds this exact source. Returns True if it ran."""
    prints = load_json(_fingerprints_file())
    current = fingerprint(lab)
    if not force and prints.get(lab.name) == current and lab.release.exists() and (course_paths.COURSE / "gradebook.db").exists():
        return False
    write_config_file()
    if not quiet:
        print(f"generating the student version of {lab.name} (nbgrader generate_assignment)")
    result = nbgrader_api().generate_assignment(lab.name, force=True, create=True)
    succeeded(result, f"nbgrader generate_assignment {lab.name}")
    prints[lab.name] = current
    _fingerprints_file().write_text(json.dumps(prints, indent=1) + "\n")
    return True
