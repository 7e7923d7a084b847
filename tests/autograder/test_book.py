"""``python -m autograder book``: lectures executed (FAST=True) and rendered to self-contained HTML, with an index.

A tiny synthetic lecture keeps this fast; ``python -m autograder book`` itself renders the real ones.
"""
from __future__ import annotations

import base64
import os
import subprocess
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

# A 1x1 PNG, linked from a markdown cell: the page must carry it inline, not point at the file.
PIXEL = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def test_a_lecture_becomes_a_page_with_its_figures_inside_and_the_index_links_it(tmp_path):
    lecture = tmp_path / "lectures" / "01_tiny.ipynb"
    lecture.parent.mkdir()
    (lecture.parent / "pixel.png").write_bytes(PIXEL)
    cells = [new_markdown_cell("# Lecture 1 · A tiny lecture\n\nA linked image: ![pixel](pixel.png)"),
             new_code_cell("FAST = False\nDEVICE = 'cpu'\nSEED = 0", metadata={"tags": ["parameters"]}),
             new_code_cell("assert FAST, 'the book runs lectures with FAST=True'\n"
                           "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nplt.show()")]
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                      "language": "python"}}), str(lecture))
    out = tmp_path / "book"
    code = f"from autograder.edition import book; raise SystemExit(book.book({str(out)!r}, [{str(lecture)!r}]))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "AUTOGRADER_BUILD_DIR": str(tmp_path / "build")})
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"

    page = (out / "01_tiny.html").read_text(encoding="utf-8")
    inline = page.count('src="data:image/png;base64,')
    assert inline >= 2, f"expected the figure and the linked image inline, found {inline} inline images"
    assert 'src="pixel.png"' not in page
    assert (out / "executed" / "01_tiny.ipynb").is_file()
    index = (out / "index.html").read_text(encoding="utf-8")
    assert 'href="01_tiny.html"' in index and "Lecture 1 · A tiny lecture" in index
