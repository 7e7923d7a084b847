"""The adversarial lab 01 submissions, graded by the real ``grade`` verb in one run.

Each fixture (tests/fixtures/lab01/, made by make_fixtures.py) must get the
right status on every test cell, the matching score, and a note that explains
what happened; the run must carry on past every one of them.  Then ``feedback``
must write a page per student with no hidden-test source on any page.
"""
from __future__ import annotations

import importlib.util
import json
import shutil

import nbformat
import pytest

from test_autograder_support import FIXTURES, REPO, explain, isolated_env, run_cli

pytestmark = pytest.mark.slow


def _load_make_fixtures():
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _load_make_fixtures()
NAMES = sorted(MAKE.FIXTURES)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    work = tmp_path_factory.mktemp("fixtures")
    env = isolated_env(work)
    submissions = work / "submissions"
    submissions.mkdir()
    for f in FIXTURES.iterdir():  # h_corrupt is committed as .ipynb.broken; a student would hand in .ipynb
        if f.name.endswith((".ipynb", ".ipynb.broken")):
            shutil.copy(f, submissions / f.name.removesuffix(".broken"))
    r = run_cli("grade", submissions, "--lab", "lab01", "--workers", 2, "--timeout", 10, "--out", work / "grades",
                env=env, cwd=work, timeout=900)
    assert r.returncode == 0, explain(r)
    students = {s["student"]: s for s in json.loads((work / "grades" / "grades.json").read_text())["students"]}
    fb = run_cli("feedback", "lab01", env=env, cwd=work, timeout=300)
    return {"students": students, "stdout": r.stdout, "work": work, "feedback": fb, "env": env}


def test_fixtures_match_the_lab(tmp_path):
    """make_fixtures.py --check: the committed fixtures are what the current lab produces."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(FIXTURES / "make_fixtures.py"), "--check"], cwd=tmp_path,
                       env=isolated_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_committed_fixtures_have_no_outputs():
    for name in NAMES:
        if name == "h_corrupt":
            continue
        nb = nbformat.read(FIXTURES / f"{name}.ipynb", as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), name


def test_every_fixture_was_graded_in_one_run(graded):
    assert sorted(graded["students"]) == NAMES
    assert "Traceback" not in graded["stdout"]


@pytest.mark.parametrize("name", NAMES)
def test_fixture_gets_the_right_statuses_and_score(graded, name):
    about, expected, note = MAKE.FIXTURES[name]
    got = graded["students"][name]
    statuses = {t["test"]: t["status"] for t in got["tests"]}
    assert statuses == expected, f"{name} ({about}): {json.dumps(got, indent=1)[:3000]}"
    assert got["score"] == sum(t["max_points"] for t in got["tests"] if t["status"] == "passed")
    assert got["max_score"] == 28  # raised points in a submission never change the maximum
    for t in got["tests"]:
        if t["status"] != "passed":
            assert t["message"], f"{name}: {t['test']} is {t['status']} without a message"
    if note:
        assert any(note in n for n in got["notes"]), f"{name}: expected a note containing {note!r}, got {got['notes']}"


def test_messages_name_the_case_step_and_tokens(graded):
    e = {t["test"]: t["message"] for t in graded["students"]["e_test_edited"]["tests"]}
    assert "tokens_processed should be" in e["decode-processed-visible"]
    assert e["decode-hidden"].startswith("hidden case ")
    i = {t["test"]: t["message"] for t in graded["students"]["i_always_equal"]["tests"]}
    assert "expected a token id (an integer), got AlwaysEqual" in i["greedy-visible"]
    assert "expected a boolean array" in i["top-k-visible"]
    l_ = {t["test"]: t["message"] for t in graded["students"]["l_reference_import"]["tests"]}
    assert "calls miniengine.sampling.top_k_mask" in l_["top-k-visible"]
    assert "calls miniengine.reference.naive_generate" in l_["decode-visible"]


def test_feedback_pages_never_show_hidden_tests(graded):
    from autograder import feedback

    r = graded["feedback"]
    assert r.returncode == 0, explain(r)
    course = graded["work"] / "course"
    pages = sorted((course / "feedback").glob("*/lab01_naive_decode/*.html"))
    # one page per student whose notebook could be read at all
    assert sorted(p.parent.parent.name for p in pages) == [n for n in NAMES if n != "h_corrupt"]
    source = nbformat.read(REPO / "labs" / "lab01_naive_decode" / "lab01_naive_decode.ipynb", as_version=4)
    hidden = feedback.hidden_lines(source)
    assert len(hidden) > 10
    for page in pages:
        text = feedback.page_text(page)
        assert "BEGIN HIDDEN TESTS" not in text, page
        assert "HIDDEN_GOLDEN" not in text, page
        assert feedback.leaks(page, hidden) == [], page


def test_grades_csv_has_a_row_per_student_and_test(graded):
    import csv

    rows = list(csv.DictReader(open(graded["work"] / "grades" / "grades.csv")))
    assert len(rows) == len(NAMES) * len(MAKE.ALL_TESTS)
    assert {r["status"] for r in rows} <= {"passed", "failed", "error", "timeout", "missing test cell", "corrupt notebook"}
