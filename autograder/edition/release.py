"""``release``: nbgrader's generate_assignment (autograder/notebooks/assignments.py), then the labs in student/.

The copy into student/ never overwrites a notebook the student has edited:
student/.released.json remembers the hash of every file we published, and a
file whose hash differs from it is the student's work.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from autograder import course_paths
from autograder.notebooks import assignments


def _manifest_file() -> Path:
    return course_paths.STUDENT / ".released.json"


def copy_to_student(lab: course_paths.Lab, force: bool = False) -> list[str]:
    """Copy course/release/<lab>/ into student/<lab>/, keeping every file the student edited."""
    manifest = assignments.load_json(_manifest_file())
    messages = []
    src_dir = lab.release.parent
    for src in sorted(p for p in src_dir.rglob("*") if p.is_file()):
        rel = src.relative_to(src_dir)
        dest = course_paths.STUDENT / lab.name / rel
        key = (Path(lab.name) / rel).as_posix()
        new_hash = assignments.sha256(src)
        if dest.exists():
            old_hash = assignments.sha256(dest)
            if old_hash == new_hash:
                manifest[key] = new_hash
                continue
            if not force and old_hash != manifest.get(key):
                messages.append(f"kept your edited {dest}; the new version is at {src}")
                continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        manifest[key] = new_hash
        messages.append(f"wrote {dest}")
    _manifest_file().parent.mkdir(parents=True, exist_ok=True)
    _manifest_file().write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return messages


def release(names=None, if_missing: bool = False, force: bool = False) -> int:
    labs = course_paths.find_labs(names)
    for lab in labs:
        if if_missing and lab.student.exists():
            print(f"{lab.student} exists: left as it is")
            continue
        assignments.generate(lab)
        for line in copy_to_student(lab, force=force):
            print(line)
    return 0
