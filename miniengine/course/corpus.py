"""The training corpus: the Python standard library's own source, already on every machine.

Nothing of it is committed.  The file list is sorted, so it is the same on every
run, and the train/validation split is by file (a file's whole text lands on one
side), decided by a hash of its path so that it does not shift when a Python
release adds or removes a module.
"""
from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

# Test suites, the IDLE GUI and generated data tables are not the code we want the model to write.
EXCLUDED_PARTS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "pydoc_data", "__pycache__", "turtledemo"}
VALIDATION_EVERY = 10  # about 1 file in 10 goes to validation


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = root or stdlib_root()
    files = [p for p in root.rglob("*.py") if not EXCLUDED_PARTS.intersection(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_validation(path: Path, root: Path | None = None) -> bool:
    rel = path.relative_to(root or stdlib_root()).as_posix()
    return zlib.crc32(rel.encode()) % VALIDATION_EVERY == 0


def split_files(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    root = root or stdlib_root()
    train, val = [], []
    for p in stdlib_files(root):
        (val if is_validation(p, root) else train).append(p)
    return train, val


def read_texts(paths) -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths]
