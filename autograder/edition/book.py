"""``book [OUT_DIR]``: the lectures as a static course book, readable without Jupyter.

Each lecture is executed the way ``regress`` runs it (papermill, FAST=True, its own kernel) and rendered
to one HTML page by nbconvert's HTMLExporter.  Figures are already base64 in the executed notebook's
outputs, so the exporter writes them into the page; ``embed_images`` does the same for images a markdown
cell links to, so every page is a single file.  index.html lists the lectures.  Default OUT_DIR:
build/book/ (git-ignored), with the executed notebooks in its executed/ folder.  A lecture that fails is
still rendered up to its error, marked in the index, and makes the exit status 1.
"""
from __future__ import annotations

import html
import json
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from autograder import course_paths, environment
from autograder.notebooks import papermill_runs


def title_of(nb: dict, fallback: str) -> str:
    """The first markdown heading, e.g. "Lecture 1 · The inference workload: the life of a request"."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            src = cell.get("source", "")
            for line in ("".join(src) if isinstance(src, list) else src).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip() or fallback
    return fallback


def render(executed: Path, title: str, source_dir: Path) -> str:
    """One self-contained HTML page: figures in the outputs, and images linked from markdown, inline."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(executed, as_version=4)
    exporter = HTMLExporter(embed_images=True)
    # metadata.path: where relative image links in markdown cells are resolved, i.e. the lecture's own folder
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title, "path": str(source_dir)}})
    return body


def index_page(rows: list[dict]) -> str:
    items = []
    for r in rows:
        note = "" if r["status"] == "passed" else (
            f' <strong>(did not run to the end: {html.escape(r["message"])})</strong>')
        items.append(f'  <li><a href="{html.escape(r["page"])}">{html.escape(r["title"])}</a>'
                     f' <small>({r["seconds"]:.0f} s, <a href="{html.escape(r["executed"])}">notebook</a>)</small>{note}</li>')
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<title>Build a mini LLM inference engine: lectures</title>\n"
            "<style>body{font-family:system-ui,sans-serif;max-width:48em;margin:3em auto;line-height:1.5}"
            "li{margin:.4em 0}</style>\n</head>\n<body>\n"
            "<h1>Build a mini LLM inference engine: lectures</h1>\n"
            "<p>Each lecture executed top to bottom with <code>FAST=True</code> (shorter runs than the defaults), "
            "every figure included.</p>\n<ol>\n" + "\n".join(items) + "\n</ol>\n</body>\n</html>\n")


def _page(job: tuple, result: dict, out: Path) -> dict:
    """Render one executed lecture to its page; returns its row for the index."""
    nb, executed, _ = job
    title = title_of(json.loads(nb.read_text(encoding="utf-8")), nb.stem)
    page = out / f"{nb.stem}.html"
    status, message = result["status"], result["message"]
    if executed.exists():  # papermill writes the notebook up to a failing cell, so there is a page to show
        page.write_text(render(executed, title, nb.parent), encoding="utf-8")
    else:
        status, message = "failed", message or "no executed notebook was written"
        page.write_text(f"<!DOCTYPE html><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
                        f"<p>{html.escape(title)} could not be executed: {html.escape(message)}</p>\n", encoding="utf-8")
    print(f"  {status:<6} {result['seconds']:6.1f} s  {page}", flush=True)
    return {"title": title, "page": page.name, "executed": executed.relative_to(out).as_posix(),
            "status": status, "message": message, "seconds": result["seconds"]}


def book(out: Path | None = None, notebooks: list[Path] | None = None, workers: int = 1, timeout: int = 300) -> int:
    environment.prepare(workers)
    out = Path(out).resolve() if out else course_paths.BUILD / "book"
    found = [Path(nb).resolve() for nb in notebooks] if notebooks else course_paths.lectures()
    if not found:
        raise course_paths.LabError(f"no lectures found under {course_paths.LECTURES}")
    names = [nb.stem for nb in found]
    if len(set(names)) != len(names):
        raise course_paths.LabError(f"two notebooks share a name, and so a page: {sorted(n for n in names if names.count(n) > 1)}")
    print(f"executing and rendering {len(found)} notebook{'s' * (len(found) != 1)} (FAST=True, {workers} at a time) "
          f"into {out}", flush=True)
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(nb, out / "executed" / nb.name, timeout) for nb in found]
    if workers == 1:
        rows = [_page(job, papermill_runs.run_one(*job), out) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            rows = [_page(job, result, out) for job, result in zip(jobs, pool.map(papermill_runs.run_one, *zip(*jobs)))]
    (out / "index.html").write_text(index_page(rows), encoding="utf-8")
    failed = [r for r in rows if r["status"] != "passed"]
    for r in failed:
        print(f"\n{r['title']} failed: {r['message']}")
    print(f"\n{len(rows) - len(failed)} of {len(rows)} lectures rendered in full in {time.monotonic() - start:.1f} s; "
          f"open {out / 'index.html'}")
    return 1 if failed else 0
