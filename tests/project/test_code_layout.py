"""The code's layout holds: imports point the way pyproject.toml's import-linter contracts say, and files stay small.

* The engine (everything in miniengine/ outside miniengine.course) imports neither course tooling nor the
  autograder, and the float64 reference imports no engine module: `lint-imports` checks the contracts in
  pyproject.toml ([tool.importlinter]), indirect imports included.
* No Python file in miniengine/ or autograder/ is longer than MAX_LINES: one concept per file.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from miniengine.paths import REPO_ROOT

MAX_LINES = 300


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), (f"{lint} is missing: install the test extra (.venv/bin/python -m pip install -c "
                           "constraints.txt -e '.[test]'), which brings import-linter")
    r = subprocess.run([str(lint), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (f"an import-linter contract of pyproject.toml is broken (exit {r.returncode}); "
                               f"lint-imports says:\n{r.stdout}{r.stderr}")


def _python_files(*folders: str) -> list[str]:
    """Files under ``folders`` that git tracks or would track (new, not ignored), ending in .py."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *folders],
                             cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise AssertionError(f"needs the course's git repository to tell course files from local ones ({e})") from None
    return sorted({f for f in out.split("\0") if f.endswith(".py") and (REPO_ROOT / f).is_file()})


def test_no_python_file_is_longer_than_the_limit():
    files = _python_files("miniengine", "autograder")
    assert files, "found no Python files under miniengine/ and autograder/"
    counts = {f: len((REPO_ROOT / f).read_text(encoding="utf-8").splitlines()) for f in files}
    offenders = {f: n for f, n in counts.items() if n > MAX_LINES}
    assert not offenders, (f"over {MAX_LINES} lines (split each by concept):\n"
                           + "\n".join(f"  {f}: {n} lines" for f, n in sorted(offenders.items(), key=lambda x: -x[1])))


MAX_TEST_CELL_LINES = 60


def test_lab_test_cells_state_cases_and_call_their_harness():
    """A test cell is read as a specification: its cases and a call into autograder/labs/labNN.py, on one screen."""
    import json

    too_long, no_harness = {}, []
    for path in sorted((REPO_ROOT / "labs").glob("*/*.ipynb")):
        lab = path.name[:5]
        for cell in json.loads(path.read_text())["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if not meta.get("grade") or meta.get("solution"):
                continue
            source = "".join(cell["source"])
            if len(source.splitlines()) > MAX_TEST_CELL_LINES:
                too_long[f"{path.name}:{meta['grade_id']}"] = len(source.splitlines())
            if f'pristine("{lab}")' not in source:
                no_harness.append(f"{path.name}:{meta['grade_id']}")
    assert not too_long, f"test cells over {MAX_TEST_CELL_LINES} lines (move the checks into the harness): {too_long}"
    assert not no_harness, f"test cells that do not load their lab's harness with pristine(): {no_harness}"


def test_the_command_line_imports_an_instructors_verb_only_when_it_runs():
    """cli.py ships; at module level it may import only shipped code (pyproject.toml's contract covers the rest)."""
    import ast

    tree = ast.parse((REPO_ROOT / "autograder" / "cli.py").read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [f"{n.module}.{a.name}" for n in top if isinstance(n, ast.ImportFrom) and n.module for a in n.names]
    instructors = ("autograder.grade", "autograder.qa", "autograder.edition", "autograder.sandbox")
    assert names and not [n for n in names if n.startswith(instructors)], names
