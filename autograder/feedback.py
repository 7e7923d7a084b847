"""``feedback``: nbgrader generate_feedback, with hidden tests removed, and a check that they really are.

nbgrader's feedback shows hidden tests by default (autograder/README.md, nbgrader
fact 5); the configuration adds ClearHiddenTests.  That clears a hidden test's
source, but not its outputs: a failing assert's traceback quotes the hidden
line, and a student's print inside a graded function would show hidden
inputs.  ``HideHiddenTestOutputs`` runs first and keeps only the error's one-line
message.  Finally every page is searched for the hidden tests' lines, and a page
that contains one is deleted rather than handed out.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

from nbgrader.preprocessors import NbGraderPreprocessor

from . import layout

BEGIN, END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"


class HideHiddenTestOutputs(NbGraderPreprocessor):
    """In a cell with hidden tests, replace the outputs by the bare error line, if any."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and BEGIN in cell.source:
            from .execute import error_output

            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            cell.outputs = [error_output(e.ename, e.evalue) for e in errors[:1]]
        return cell, resources


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

    from .config import COURSE_ID

    db = layout.COURSE / "gradebook.db"
    if not db.exists():
        return []
    try:
        with Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
            return [sub.student.id for sub in gb.find_assignment(lab).submissions]
    except MissingEntry:
        return []


def feedback(names=None, students=None) -> int:
    import nbformat

    from . import environment
    from .config import nbgrader_api, succeeded

    environment.prepare()
    labs = layout.find_labs(names)
    graded_any = False
    api = nbgrader_api()
    status = 0
    for lab in labs:
        autograded = sorted(p.parent.name for p in (layout.COURSE / "autograded").glob(f"*/{lab.name}"))
        chosen = [s for s in autograded if not students or s in students]
        if not chosen:
            print(f"{lab.name}: no graded submissions in course/autograded (run `python -m autograder grade` first)")
            continue
        graded_any = True
        lines = hidden_lines(nbformat.read(lab.source, as_version=4))
        for student in chosen:
            succeeded(api.generate_feedback(lab.name, student, force=True), f"feedback for {student} ({lab.name})")
            for page in sorted((layout.COURSE / "feedback" / student / lab.name).glob("*.html")):
                found = leaks(page, lines)
                if found:
                    page.unlink()
                    print(f"REFUSED {page}: it shows hidden-test source ({found[0]!r}); page deleted", flush=True)
                    status = 1
                else:
                    print(f"wrote {page}")
        for s in sorted(set(students or _graded_students(lab.name)) - set(autograded)):
            print(f"{lab.name}: no page for {s}: nothing of theirs ran (a corrupt notebook, or never graded)")
    if not graded_any:
        return 1
    return status
