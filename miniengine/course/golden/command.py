"""``python -m miniengine golden [--check]``: rewrite the golden files, or say which shipped ones are stale."""
from __future__ import annotations

from pathlib import Path

from miniengine.course.golden.cases import build
from miniengine.course.golden.dataset import dumps, load_golden, same
from miniengine.paths import REPO_ROOT, TARGET


def run(args) -> int:
    files = build(Path(args.model))
    if args.check:
        stale = [p for p, d in files.items() if not p.exists() or not same(d, load_golden(p))]
        for p in stale:
            print(f"{p.relative_to(REPO_ROOT)} differs from a fresh regeneration")
        return 1 if stale else 0
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(data))
        print(f"wrote {len(data['cases'])} cases to {path.relative_to(REPO_ROOT)}")
    return 0


def add_arguments(p) -> None:
    p.add_argument("--model", default=str(TARGET), help="model directory (default: the shipped target)")
    p.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing them")
