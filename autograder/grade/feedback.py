"""``feedback``: one HTML page per graded student, built from an allow-list of what a student may see.

A page holds the score, and per test cell its points, status and the message the
grader kept (``messages.safe_message``: a visible test's own message, the grader's
words for a hidden one, never a hidden input), plus the grader's notes.  It is made
from the results the trusted grader wrote (course/autograded/<student>/<lab>/result.json),
not from the executed notebook: nothing a submission printed reaches the page unless
the allow-list let it through.  As a last check, every page is searched for the
hidden tests' source lines, and a page that contains one is deleted, not handed out.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

from autograder import course_paths, results

BEGIN, END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
RESULT_FILE = "result.json"

def hidden_lines(nb) -> set[str]:
    """Lines that occur only inside hidden-test regions: finding one in a page means a leak."""
    hidden, visible = set(), set()
    for cell in nb.cells:
        inside = False
        for line in cell.source.splitlines():
            if BEGIN in line:
                inside = True
                continue
            if END in line:
                inside = False
                continue
            (hidden if inside else visible).add(line.strip())
    return {line for line in hidden - visible if len(line) >= 12}


def page_text(path: Path) -> str:
    """An HTML page's text as a reader sees it: tags (syntax highlighting included) stripped, entities decoded."""
    text = re.sub(r"<style.*?</style>|<script.*?</script>", "", path.read_text(errors="replace"), flags=re.S)
    text = re.sub(r"<br\s*/?>|</(pre|div|p|li|tr|td|h\d)>", "\n", text, flags=re.I)  # block ends break lines
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def leaks(page: Path, lines: set[str]) -> list[str]:
    """Hidden-only lines that appear, whole, as a line of the page."""
    shown = {line.strip() for line in page_text(page).splitlines()}
    return sorted(lines & shown)


def _graded_students(lab: str) -> list[str]:
    """Everyone with a submission for ``lab`` in course/gradebook.db, including notebooks that could not be read."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.notebooks.nbgrader_config import COURSE_ID

    db = course_paths.COURSE / "gradebook.db"
    if not db.exists():
        return []
    try:
        with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
            return [sub.student.id for sub in gb.find_assignment(lab).submissions]
    except MissingEntry:
        return []


# What a hidden test's message holds (autograder/grade/messages.py, safe_message; autograder/notebook_checks/hidden_report.py).
FOOTER = ("Hidden tests ran on inputs you have not seen. Their messages never show a hidden prompt or an expected "
          "token: they name the hidden case and the step where the test knows them, and otherwise the error your code "
          f"raised and the function and line where it did. Messages are shown whole (one over "
          f"{results.MESSAGE_LIMIT:,} characters says where it was cut).")


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}} td,th{{padding:.2em .6em;text-align:left;
vertical-align:top}} tr.passed td.status{{color:#17752e}} tr:not(.passed) td.status{{color:#a3161b}}
td.message{{white-space:pre-wrap}}</style></head>
<body><h1>{title}</h1><p>Score: <b>{score:g} / {max_score:g}</b></p>
<table><tr><th>test</th><th>kind</th><th>points</th><th>status</th><th>message</th></tr>
{rows}</table>{notes}
<p><small>{footer}</small></p>
</body></html>
"""


def render(result: dict) -> str:
    esc = html.escape
    rows = "\n".join(
        f'<tr class="{esc(t["status"]).replace(" ", "-")}"><td>{esc(t["test"])}</td>'
        f'<td>{"hidden" if t["hidden"] else "visible"}</td><td>{t["points"]:g} / {t["max_points"]:g}</td>'
        f'<td class="status">{esc(t["status"])}</td><td class="message">{esc(t["message"])}</td></tr>'
        for t in result["tests"])
    notes = "".join(f"<li>{esc(n)}</li>" for n in result.get("notes", []))
    return PAGE.format(title=esc(f"{result['lab']}: feedback for {result['student']}"), score=result["score"],
                       max_score=result["max_score"], rows=rows, notes=f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "",
                       footer=esc(FOOTER))


def feedback(names=None, students=None) -> int:
    import nbformat

    labs = course_paths.find_labs(names)
    graded_any = False
    status = 0
    ungraded = []
    for lab in labs:
        done = sorted(p.parent.parent.name for p in (course_paths.COURSE / "autograded").glob(f"*/{lab.name}/{RESULT_FILE}"))
        chosen = [s for s in done if not students or s in students]
        if not chosen:
            ungraded.append(lab.name)
            continue
        graded_any = True
        lines = hidden_lines(nbformat.read(lab.source, as_version=4))
        for student in chosen:
            result = json.loads((course_paths.COURSE / "autograded" / student / lab.name / RESULT_FILE).read_text())
            page = course_paths.COURSE / "feedback" / student / lab.name / f"{lab.name}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(render(result))
            found = leaks(page, lines)
            if found:
                page.unlink()
                print(f"REFUSED {page}: it shows hidden-test source ({found[0]!r}); page deleted", flush=True)
                status = 1
            else:
                print(f"wrote {page}")
        for s in sorted(set(students or _graded_students(lab.name)) - set(done)):
            print(f"{lab.name}: no page for {s}: nothing of theirs was graded")
    if ungraded:  # one line for them all: most labs of a term are not graded yet
        who = f" for {', '.join(sorted(students))}" if students else ""
        print(f"no graded submissions{who} in course/autograded for {', '.join(ungraded)} "
              f"(`python -m autograder grade` writes them)")
    if not graded_any:
        return 1
    return status
