"""``release``: nbgrader's generate_assignment, then the student edition in student/.

nbgrader writes course/release/<lab>/ with solutions replaced by stubs and
hidden tests removed, and records every graded cell, hidden tests included, in
course/gradebook.db.  Grading restores test cells from that database, which is
why ``grade`` regenerates a lab whose source changed since the last release.

The copy into student/ never overwrites a notebook the student has edited:
student/.released.json remembers the hash of every file we published, and a
file whose hash differs from it is the student's work.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from . import layout
from .config import nbgrader_api, succeeded, write_config_file


def _fingerprints_file() -> Path:
    return layout.COURSE / ".source-fingerprints.json"


def _manifest_file() -> Path:
    return layout.STUDENT / ".released.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fingerprint(lab: layout.Lab) -> str:
    """A hash of every file in the lab's source folder: any edit means the gradebook is stale."""
    h = hashlib.sha256()
    for path in sorted(p for p in lab.source.parent.rglob("*") if p.is_file() and ".ipynb_checkpoints" not in p.parts
                       and "__pycache__" not in p.parts):
        h.update(path.relative_to(lab.source.parent).as_posix().encode())
        h.update(_sha256(path).encode())
    return h.hexdigest()


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def generate(lab: layout.Lab, force: bool = False, quiet: bool = False) -> bool:
    """Run generate_assignment unless course/ already holds this exact source. Returns True if it ran."""
    prints = _load(_fingerprints_file())
    current = fingerprint(lab)
    if not force and prints.get(lab.name) == current and lab.release.exists() and (layout.COURSE / "gradebook.db").exists():
        return False
    write_config_file()
    if not quiet:
        print(f"generating the student version of {lab.name} (nbgrader generate_assignment)")
    result = nbgrader_api().generate_assignment(lab.name, force=True, create=True)
    succeeded(result, f"nbgrader generate_assignment {lab.name}")
    prints[lab.name] = current
    _fingerprints_file().write_text(json.dumps(prints, indent=1) + "\n")
    return True


def publish(lab: layout.Lab, force: bool = False) -> list[str]:
    """Copy course/release/<lab>/ into student/<lab>/, keeping every file the student edited."""
    manifest = _load(_manifest_file())
    messages = []
    src_dir = lab.release.parent
    for src in sorted(p for p in src_dir.rglob("*") if p.is_file()):
        rel = src.relative_to(src_dir)
        dest = layout.STUDENT / lab.name / rel
        key = (Path(lab.name) / rel).as_posix()
        new_hash = _sha256(src)
        if dest.exists():
            old_hash = _sha256(dest)
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
    labs = layout.find_labs(names)
    for lab in labs:
        if if_missing and lab.student.exists():
            print(f"{lab.student} exists: left as it is")
            continue
        generate(lab)
        for line in publish(lab, force=force):
            print(line)
    return 0
