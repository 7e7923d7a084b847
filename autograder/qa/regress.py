"""``regress``: run every lecture and every lab source notebook top to bottom with papermill, FAST=True.

The executed copies and a summary table (notebook, status, seconds) go to
build/regress/ (git-ignored).  Exit status 1 if any notebook fails.  Lab source
notebooks run with their solutions and hidden tests, so this also checks that
the reference solutions pass.
"""
from __future__ import annotations

import csv
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from autograder import course_paths, environment
from autograder.notebooks.papermill_runs import run_one


def notebooks(selected=None) -> list[Path]:
    """Every lecture, then every lab source; or the ones named (paths, or names such as lab01)."""
    everything = course_paths.lectures() + [lab.source for lab in course_paths.all_labs()]
    if not selected:
        return everything
    chosen = []
    for name in selected:
        path = Path(name)
        if path.suffix == ".ipynb" and path.exists():
            chosen.append(path.resolve())
            continue
        matches = [nb for nb in everything if nb.stem == name or nb.stem.startswith(str(name) + "_")]
        if len(matches) != 1:
            raise course_paths.LabError(f"no notebook named {name!r} (notebooks: {', '.join(nb.stem for nb in everything) or 'none'})")
        chosen.extend(matches)
    return chosen


def _output_for(nb: Path, out: Path) -> Path:
    try:
        return out / nb.resolve().relative_to(course_paths.REPO_ROOT)
    except ValueError:
        return out / nb.name


def summary_table(rows: list[dict]) -> str:
    width = max([len("notebook")] + [len(r["notebook"]) for r in rows])
    lines = [f"| {'notebook':<{width}} | status | seconds |", f"|{'-' * (width + 2)}|--------|--------:|"]
    for r in rows:
        lines.append(f"| {r['notebook']:<{width}} | {r['status']:<6} | {r['seconds']:7.1f} |")
    return "\n".join(lines)


def regress(selected=None, workers: int = 1, timeout: int = 300, out: Path | None = None, device: str = "cpu") -> int:
    environment.prepare(workers)
    out = Path(out) if out else course_paths.BUILD / "regress"
    # The labs' last cells save the solutions they run as "the student's" parts (autograder/own/): into the run's
    # folder, never the checkout's mine/, unless the caller chose a folder.
    os.environ.setdefault("MINIENGINE_MINE", str((out / "mine").resolve()))
    found = notebooks(selected)
    if not found:
        raise course_paths.LabError("no notebooks found under lectures/ or labs/")
    print(f"running {len(found)} notebook{'s' * (len(found) != 1)} with papermill (FAST=True, DEVICE={device!r}, {workers} at a time)", flush=True)
    start = time.monotonic()
    jobs = [(nb, _output_for(nb, out), timeout, device) for nb in found]
    if workers == 1:
        rows = []
        for job in jobs:
            rows.append(run_one(*job))
            print(f"  {rows[-1]['status']:<6} {rows[-1]['seconds']:6.1f} s  {rows[-1]['notebook']}", flush=True)
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            rows = list(pool.map(run_one, *zip(*jobs)))
    total = time.monotonic() - start
    out.mkdir(parents=True, exist_ok=True)
    table = summary_table(rows)
    (out / "summary.md").write_text(f"# Regression run\n\n{table}\n\nTotal: {total:.1f} s\n")
    (out / "summary.json").write_text(json.dumps({"seconds": round(total, 1), "notebooks": rows}, indent=1) + "\n")
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["notebook", "status", "seconds", "message"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print()
    print(table)
    for r in rows:
        if r["status"] != "passed":
            print(f"\n{r['notebook']} failed: {r['message']}\n  executed copy: {r['output']}")
    failed = sum(r["status"] != "passed" for r in rows)
    print(f"\n{len(rows) - failed} of {len(rows)} notebooks passed in {total:.1f} s; summary in {out / 'summary.md'}")
    return 1 if failed else 0
