"""The student edition (``python -m autograder publish``) holds no solution, no hidden test and no hidden data.

What to look for is derived here from the instructor's files, never from the publish code:
  * every prompt of autograder/hidden/*.json, and every golden completion's text, as text and JSON-escaped,
    in every file, binary ones included;
  * every token list there (prompt_token_ids, token_ids, fork completions), as a run of integers in any
    text file, whatever the brackets, commas or line breaks around it;
  * every "### BEGIN SOLUTION" and "### BEGIN HIDDEN TESTS" region of labs/*.ipynb, whitespace-normalized,
    in every text file and in every string of every JSON file (a notebook's cells included).
One exception, by design (autograder/README.md, trust model: "the answer keys ship with the package"): a
solution region that the engine's own source holds verbatim may appear in miniengine/, and nowhere else.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HIDDEN = REPO / "autograder" / "hidden"
LAB_SOURCES = sorted((REPO / "labs").glob("*/*.ipynb"))


def cli(*args, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def explain(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("publish")


@pytest.fixture(scope="module")
def env(work) -> dict:
    # nbgrader's release goes to a course folder of its own, never the real course/
    return {**os.environ, "AUTOGRADER_COURSE_DIR": str(work / "course"), "AUTOGRADER_STUDENT_DIR": str(work / "student"),
            "AUTOGRADER_BUILD_DIR": str(work / "build")}


@pytest.fixture(scope="module")
def edition(work, env) -> Path:
    """Published over a folder that holds an old file and a .git: --force replaces the first and keeps the second."""
    out = work / "edition"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "stale.txt").write_text("from an earlier edition\n")
    r = cli("publish", out, "--force", cwd=work, env=env)
    assert r.returncode == 0, explain(r)
    assert not (out / "stale.txt").exists() and (out / ".git" / "HEAD").exists()
    return out


def edition_files(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.is_file() and ".git" not in p.relative_to(out).parts)


# ---- what is secret, read from the instructor's files ----

def hidden_json() -> list[dict]:
    files = sorted(HIDDEN.glob("*.json"))
    assert files, f"no hidden data found in {HIDDEN}: nothing to look for"
    return [json.loads(f.read_text(encoding="utf-8")) for f in files]


def hidden_prompts() -> set[str]:
    prompts = set()
    for data in hidden_json():
        prompts |= set(data.get("prompts", []))
        for section in ("cases", "fork_cases"):
            prompts |= {case["prompt"] for case in data.get(section, [])}
    assert len(prompts) >= 8
    return prompts


def hidden_completions() -> set[str]:
    texts = {case["text"] for data in hidden_json() for case in data.get("cases", []) if case.get("text")}
    texts |= {c["text"] for data in hidden_json() for case in data.get("fork_cases", [])
              for c in case.get("completions", []) if c.get("text")}
    assert len(texts) >= 40
    # A degenerate model (lab 07's mean-pooled GQA) can write a hidden run's text on a visible prompt too: text
    # that a visible golden file holds is public, not a leak.
    public = "\n".join(json.dumps(json.loads(p.read_text())) for p in (REPO / "data" / "golden").glob("*.json"))
    return {t for t in texts if json.dumps(t)[1:-1] not in public}


def token_lists(data) -> set[tuple[int, ...]]:
    """Every prompt_token_ids and token_ids list anywhere in a golden file."""
    found = set()

    def walk(x):
        if isinstance(x, dict):
            for key, value in x.items():
                if key in ("prompt_token_ids", "token_ids") and isinstance(value, list):
                    found.add(tuple(value))
                walk(value)
        elif isinstance(x, list):
            for value in x:
                walk(value)

    walk(data)
    return found


def hidden_token_lists() -> set[tuple[int, ...]]:
    found = set().union(*(token_lists(data) for data in hidden_json()))
    assert len(found) > 40 and all(len(ids) >= 4 for ids in found)
    # A hidden run can end the way a visible one does: a list inside a visible golden run is public data, not a
    # leak (lab 07's gqa2_pooled.json has one greedy run that is the tail of a visible run).
    public = ["," + ",".join(map(str, ids)) + ","
              for path in (REPO / "data" / "golden").glob("*.json") for ids in token_lists(json.loads(path.read_text()))]
    return {ids for ids in found if not any("," + ",".join(map(str, ids)) + "," in run for run in public)}


def cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def normalize(text: str) -> str:
    return " ".join(text.split())


def lab_regions(kind: str) -> list[tuple[str, str]]:
    """(where, whitespace-normalized text) of every ### BEGIN <kind> ... ### END <kind> region in labs/."""
    assert LAB_SOURCES, "no lab sources under labs/: nothing to look for"
    regions = []
    for path in LAB_SOURCES:
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            for m in re.finditer(rf"### BEGIN {kind}(.*?)### END {kind}", cell_source(cell), re.S):
                if normalize(m.group(1)):
                    regions.append((f"{path.relative_to(REPO)} cell {i}", normalize(m.group(1))))
    assert regions, f"no '### BEGIN {kind}' region found in labs/"
    return regions


def engine_text() -> str:
    return "\n".join(normalize(p.read_text(encoding="utf-8")) for p in sorted((REPO / "miniengine").rglob("*.py")))


# ---- how the edition is read ----

def strings_of(x) -> list[str]:
    """Every string in a JSON value, and every list of strings joined (a notebook cell's source)."""
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in strings_of(v)]
    if isinstance(x, list):
        joined = ["".join(x)] if x and all(isinstance(v, str) for v in x) else []
        return joined + [s for v in x for s in strings_of(v)]
    return []


def text_views(path: Path) -> list[str] | None:
    """The file's text and, for JSON, each string in it; None for a binary file."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    views = [text]
    if path.suffix in (".json", ".ipynb"):
        views += strings_of(json.loads(text))
    return views


@pytest.fixture(scope="module")
def scanned(edition) -> list[tuple[str, bytes, list[str] | None]]:
    return [(p.relative_to(edition).as_posix(), p.read_bytes(), text_views(p)) for p in edition_files(edition)]


# ---- the tests ----

def test_publish_refuses_a_folder_that_is_not_empty(work, env):
    out = work / "occupied"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    r = cli("publish", out, cwd=work, env=env)
    assert r.returncode == 2 and str(out) in r.stderr and "--force" in r.stderr, explain(r)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, explain(r)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_no_lab_source_and_no_hidden_folder(edition, scanned):
    assert not (edition / "autograder" / "hidden").exists()
    # The design parts' references and baselines (autograder/qa/design/) are an answer key: nothing of them ships.
    assert not (edition / "autograder" / "qa").exists()
    assert not [name for name, data, _ in scanned if b"from autograder.qa.design" in data or b"import autograder.qa.design" in data]
    sources = {path.read_bytes() for path in LAB_SOURCES}
    assert not [name for name, data, _ in scanned if data in sources], "a lab source (with solutions) was published"
    for path in LAB_SOURCES:
        released = edition / path.relative_to(REPO)
        assert released.is_file(), f"{path.relative_to(REPO)}: its released version is missing from the edition"
    for name, _, views in scanned:
        if name.endswith(".ipynb"):
            cells = json.loads(views[0])["cells"]
            marked = [i for i, c in enumerate(cells) if "### BEGIN SOLUTION" in cell_source(c)
                      or "### BEGIN HIDDEN TESTS" in cell_source(c)]
            assert not marked, f"{name}: cells {marked} hold a solution or hidden-test region"


def test_no_hidden_prompt_or_golden_text_anywhere(scanned):
    secrets = hidden_prompts() | hidden_completions()
    # as written in a text or binary file, and JSON-escaped (a prompt with a newline, in a JSON or .py file)
    forms = {s: {s.encode(), json.dumps(s)[1:-1].encode(), json.dumps(s, ensure_ascii=False)[1:-1].encode()} for s in secrets}
    leaks = [(name, s) for name, data, _ in scanned for s in secrets if any(f in data for f in forms[s])]
    # inside JSON strings, e.g. split over a notebook cell's lines
    leaks += [(name, s) for name, _, views in scanned if views for s in secrets if any(s in v for v in views[1:])]
    assert not leaks, f"hidden prompts or golden texts in the student edition: {sorted(set(leaks))[:10]}"


def test_no_hidden_token_list_anywhere(scanned):
    wanted = {"," + ",".join(map(str, ids)) + "," for ids in hidden_token_lists()}
    leaks = []
    for name, _, views in scanned:
        if views is None:
            continue
        for view in views[:1]:  # the raw text: a list inside a JSON string is still a run of integers there
            runs = ["," + ",".join(re.findall(r"\d+", m.group())) + ","
                    for m in re.finditer(r"\d+(?:\s*,\s*\d+)+", view)]
            leaks += [(name, ids[:40]) for ids in wanted for run in runs if ids in run]
    assert not leaks, f"hidden token lists in the student edition: {leaks[:10]}"


def test_no_held_out_step_time_anywhere(scanned):
    """Lab 03's held-out measurements (autograder/hidden/step_times_heldout.csv) are in no file of the edition."""
    rows = [line for line in (HIDDEN / "step_times_heldout.csv").read_text().splitlines()
            if line and not line.startswith(("#", "phase,"))]
    assert len(rows) == 45
    leaks = [(name, row) for name, data, _ in scanned for row in rows if row.encode() in data]
    assert not leaks, f"held-out step times in the student edition: {leaks[:5]}"


def test_no_solution_or_hidden_test_region_anywhere(scanned):
    engine = engine_text()
    regions = [("solution", where, text) for where, text in lab_regions("SOLUTION")]
    regions += [("hidden test", where, text) for where, text in lab_regions("HIDDEN TESTS")]
    normalized = [(name, [normalize(v) for v in views]) for name, _, views in scanned if views is not None]
    leaks = []
    for kind, where, text in regions:
        engine_code = kind == "solution" and text in engine  # the engine is the answer key by design
        for name, views in normalized:
            if engine_code and name.startswith("miniengine/"):
                continue
            if any(text in v for v in views):
                leaks.append(f"{kind} region of {where} in {name}: {text[:60]!r}")
    assert not leaks, "\n".join(leaks[:20])


def test_the_edition_checks_labs_but_has_no_instructor_verbs(edition):
    """Its own reduced autograder has what `check` and the labs' test cells import; instructors' verbs say they are not there.

    This repository's editable install would quietly supply any module the edition lacks, so the probe
    asserts that every autograder module it loaded came from the edition, and the verb runs without
    site-packages (-S), as in an edition's own environment.
    """
    probe = ("import sys, autograder.check, autograder.notebooks.execute, autograder.notebook_checks, autograder.kernel_limits\n"
             "import autograder.notebooks.assembly, autograder.answer_policy\n"
             "print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.split('.')[0] == 'autograder'))")
    r = subprocess.run([sys.executable, "-c", probe], cwd=edition, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, explain(r)
    outside = [f for f in r.stdout.split() if not Path(f).resolve().is_relative_to(edition.resolve())]
    assert not outside, f"the edition's autograder needs modules it does not have: {outside}"
    # `check` runs the lab's release with the student's answers in it: a pristine copy of each ships, beside the
    # copy in labs/ that the student edits (autograder/notebooks/assembly.py)
    for lab in LAB_SOURCES:
        released = edition / "autograder" / "released" / lab.name
        assert released.is_file() and released.read_text() == (edition / "labs" / lab.parent.name / lab.name).read_text()
    for verb in ("release", "verify", "publish x"):
        r = subprocess.run([sys.executable, "-S", "-m", "autograder", *verb.split()], cwd=edition,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "not in the student edition" in r.stderr and "Traceback" not in r.stderr, explain(r)
    # --help lists what the edition can do, and `check lab01` finds the student's copy in labs/
    r = subprocess.run([sys.executable, "-S", "-m", "autograder", "--help"], cwd=edition, capture_output=True, text=True,
                       timeout=120)
    listed = {line.split()[0] for line in r.stdout.splitlines() if line.startswith("    ") and line.split()}
    assert r.returncode == 0 and listed == {"check"} and "check lab01" in r.stdout, explain(r)
    probe = "from autograder import course_paths; print(course_paths.student_notebook('lab01'))"
    r = subprocess.run([sys.executable, "-c", probe], cwd=edition, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and Path(r.stdout.strip()) == edition / "labs" / LAB_SOURCES[0].parent.name / LAB_SOURCES[0].name


def test_the_edition_readme_gives_the_two_commands_and_no_instructor_section(edition):
    readme = (edition / "README.md").read_text(encoding="utf-8")
    assert "make lab" in readme[:1500] and "make test" in readme[:1500]
    assert "## For students" in readme and "## For instructors" not in readme and "autograder grade" not in readme
    assert "python -m autograder check lab01" in readme and "in `labs/`" in readme


# ---- what ships, by rule ----

# An import of an instructors' package, or a read of a hidden file, the hidden golden runs (conftest's hidden_golden)
# among them; a test may ask whether the folder is there. In the edition labs/ holds the released notebooks, so a test
# that reads labs/ reads those.
INSTRUCTOR_ONLY = re.compile(rb"autograder[./](?:grade|qa|edition|sandbox)\b|autograder/hidden/|\"hidden\" /|\bhidden_golden\b")


def test_autograder_ships_by_folder_and_only_the_instructors_folders_stay_out(edition):
    """The top level and SHIPPED_PACKAGES whole; none of INSTRUCTOR_PACKAGES; every folder of autograder/ is one or the other."""
    from autograder.edition import publish

    folders = {p.name for p in (REPO / "autograder").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(publish.SHIPPED_PACKAGES) | set(publish.INSTRUCTOR_PACKAGES)
    shipped = {p.relative_to(edition).as_posix() for p in (edition / "autograder").rglob("*.py")}
    assert shipped == set(publish.autograder_files()) - {"autograder/README.md"}
    for package in publish.INSTRUCTOR_PACKAGES:
        assert not (edition / "autograder" / package).exists(), package
    for package in publish.SHIPPED_PACKAGES:
        assert (edition / "autograder" / package / "__init__.py").is_file(), package


def test_every_test_marked_for_students_ships_and_needs_nothing_of_the_instructors():
    """The rule of the shipped tests: marked student_edition. A marked file (or a helper it imports) that imports an
    instructors' package or names a hidden file would fail in the edition: refused here."""
    from autograder.edition import publish

    shipped = publish.student_tests()
    assert "tests/conftest.py" in shipped and "tests/autograder/test_check.py" in shipped
    assert len([f for f in shipped if "/test_" in f]) >= 20
    found = [f"{rel}: {m.group().decode()!r}" for rel in shipped if rel != "tests/conftest.py"
             for m in [INSTRUCTOR_ONLY.search((REPO / rel).read_bytes())] if m]
    assert not found, "marked student_edition but needs the instructor edition:\n" + "\n".join(found)
    # What a marked test reads while it runs is checked where it runs: tests/conftest.py fails it on any read of
    # autograder/hidden/ (and on the hidden_golden fixture), in every make test.

