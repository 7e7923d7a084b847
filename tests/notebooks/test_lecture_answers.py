"""Lectures never print a lab's answer: no getsource of, and no re-definition of, a name a lab asks the student to write.

Two checks on the lectures' JSON, no kernel needed: no code cell shows source code through ``inspect``, and no
lecture defines a function or class under a name that a lab's solution region defines (a lecture that writes out
``kv_bytes_per_token`` hands Lab 2's first task to whoever reads it). A lecture calls the course's code instead,
and says in prose or a trace what it does.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LECTURES = sorted((REPO / "lectures").glob("*.ipynb"))
DEFINES = re.compile(r"^(?:async\s+)?(?:def|class)\s+(\w+)", re.M)  # top level only: methods are not answers by name
# Same name, different thing: these lectures' greedy(max_tokens) builds SamplingParams; Lab 1's greedy(logits)
# picks a token.
SAME_NAME_ONLY = {("05_paged_attention.ipynb", "greedy"), ("08_prefix_caching_and_chunked_prefill.ipynb", "greedy")}


def code_cells(path: Path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def lab_solution_names() -> dict[str, list[str]]:
    """Name -> labs, for every def/class in a lab's ``### BEGIN SOLUTION`` cells (none in the student edition)."""
    names: dict[str, list[str]] = {}
    for path in sorted((REPO / "labs").glob("*/*.ipynb")):
        for _, source in code_cells(path):
            if "### BEGIN SOLUTION" in source:
                for name in DEFINES.findall(source):
                    names.setdefault(name, []).append(path.parent.name)
    return names


@pytest.mark.parametrize("path", LECTURES, ids=[p.name for p in LECTURES])
def test_no_lecture_prints_source_code(path):
    shown = [i for i, source in code_cells(path) if re.search(r"\bgetsource(lines)?\s*\(", source)]
    assert not shown, (f"{path.name}: cells {shown} (counting from 0) print source code with inspect; rule 7 says a "
                       f"lecture never prints a lab's answer: describe what the code does, or trace its behaviour")


@pytest.mark.parametrize("path", LECTURES, ids=[p.name for p in LECTURES])
def test_no_lecture_writes_out_a_labs_graded_definition(path):
    graded = lab_solution_names()
    clashes = [(i, name, graded[name]) for i, source in code_cells(path) for name in DEFINES.findall(source)
               if name in graded and (path.name, name) not in SAME_NAME_ONLY]
    assert not clashes, "; ".join(
        f"{path.name}, cell {i}: defines {name}, which {' and '.join(sorted(set(labs)))} ask(s) students to write: "
        f"call the course's version instead (or rename it if it is something else)" for i, name, labs in clashes)
