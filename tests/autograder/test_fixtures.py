"""The adversarial lab 01 submissions, graded by the real ``grade`` verb in one run.

Each fixture (tests/autograder/fixtures/lab01/, made by make_fixtures.py) must get the
right status on every test cell, the matching score, and a note that explains
what happened; the run must carry on past every one of them.  Then ``feedback``
must write a page per student with no hidden-test source on any page.

The p_* fixtures are attacks on the grader itself (make_fixtures.ATTACKS).  What
they tried is checked from outside, after the run: no file outside the student's
folder changed, no process left, no connection made, honest scores, no hidden data
in grades or feedback, and nothing a later student would run was touched.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
from pathlib import Path

import nbformat
import pytest
from autograder_support import FIXTURES, REPO, explain, normal_user, run_cli, user_env
from fixture_cells import copy_fixture_set, course_cells

from autograder.grade.lab_prep import LEAVE_OUT_ENV

pytestmark = pytest.mark.slow


def _load_make_fixtures():
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _load_make_fixtures()
NAMES = sorted(MAKE.FIXTURES)


LEFTOVER = "autograder-fixture-leftover"
DAEMON = "autograder-fixture-daemon"
LISTEN_PORT = 47613  # p_network connects here


def snapshot(work) -> dict[str, str]:
    """Hashes of everything a submission could use to reach later students or change grades."""
    import site
    import sys

    roots = [REPO / "miniengine", REPO / "autograder", REPO / "data", Path(sys.prefix) / "home",
             *map(Path, site.getsitepackages())]
    files = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(".pyc"):
                files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    for path in (Path.home() / ".bashrc", Path.home() / ".profile"):
        files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"
    return files


# The attacks on the sandbox itself sit in cells they add, which the grader never runs (autograder/notebooks/assembly.py), and
# reach for what the answer policy refuses (os, subprocess, signals). To test the sandbox alone, as the layer beneath
# those two, they are graded as submitted (--as-submitted); every other fixture is graded as students are.
AS_SUBMITTED = sorted(MAKE.ATTACKS) + sorted(MAKE.EXHAUSTION) + ["m2_kill", "m_exit", "n_memory"]


@pytest.fixture(scope="module")
def graded():
    """The grading runs of every fixture, as a normal user (issue 24): in a user namespace, as an instructor on a
    laptop grades. Root's mode, a uid per student, is graded by tests/autograder/test_cli.py's runs."""
    with normal_user() as (work, as_user):
        env = user_env(work)
        submissions, raw = work / "submissions", work / "as-submitted"
        submissions.mkdir()
        raw.mkdir()
        # h_corrupt is committed as .ipynb.broken (a student would hand in .ipynb); the lab's measurement cells stay
        # out of every copy: verify runs them, in the lab's solution (tests/autograder/fixture_cells.py). The graded notebook
        # is the lab's release with the answers in it, so the cells are left out of it by their ids, a hook for
        # the course's tests (lab_prep.LEAVE_OUT_ENV).
        left_out = copy_fixture_set(FIXTURES, MAKE.LAB, submissions)
        for name in AS_SUBMITTED:
            (submissions / f"{name}.ipynb").rename(raw / f"{name}.ipynb")
        env[LEAVE_OUT_ENV] = json.dumps(sorted({i for ids in left_out.values() for i in ids}))
        before = snapshot(work)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", LISTEN_PORT))  # a clear failure if something else holds the port
        listener.listen()
        listener.setblocking(False)
        try:
            runs = [run_cli("grade", folder, "--lab", "lab01", "--workers", 2, "--timeout", 10, "--out",
                            work / "grades", *extra, env=env, cwd=work, timeout=900, **as_user)
                    for folder, extra in ((submissions, ()), (raw, ("--as-submitted",)))]
            try:
                listener.accept()
                connected = True
            except BlockingIOError:
                connected = False
        finally:
            listener.close()
        for r in runs:
            assert r.returncode == 0, explain(r)
        students = {s["student"]: s for s in json.loads((work / "grades" / "grades.json").read_text())["students"]}
        fb = run_cli("feedback", "lab01", env=env, cwd=work, timeout=300, **as_user)
        yield {"students": students, "stdout": runs[0].stdout + runs[1].stdout, "runs": runs, "work": work,
               "feedback": fb, "env": env, "before": before, "after": snapshot(work), "connected": connected,
               "left_out": left_out}


def test_fixtures_match_the_lab(graded):
    """make_fixtures.py --check: the committed fixtures are what the current lab produces. It reads the lab as
    released into the grading run's course, which the run left current, so nbgrader is not run for it again."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(FIXTURES / "make_fixtures.py"), "--check"], cwd=graded["work"],
                       env=graded["env"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_committed_fixtures_have_no_outputs():
    for name in NAMES:
        if name == "h_corrupt":
            continue
        nb = nbformat.read(FIXTURES / f"{name}.ipynb", as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), name


def test_every_fixture_was_graded_in_one_of_the_two_runs(graded):
    assert sorted(graded["students"]) == NAMES
    assert "Traceback" not in graded["stdout"]
    for name, student in graded["students"].items():
        assert student["notebook"] == ("as submitted" if name in AS_SUBMITTED else "assembled"), name
    assert "WARNING: grading the notebooks as submitted" in graded["runs"][1].stdout


def test_only_the_labs_own_measurement_cells_were_left_out(graded):
    """What each fixture changed (its solutions, test cells, inserted cells) was graded; verify runs the rest."""
    course = course_cells(nbformat.read(REPO / "labs" / MAKE.LAB / f"{MAKE.LAB}.ipynb", as_version=4))
    for name, ids in graded["left_out"].items():
        assert set(ids) <= set(course), (name, ids)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_gets_the_right_statuses_and_score(graded, name):
    about, expected, note = MAKE.FIXTURES[name]
    got = graded["students"][name]
    statuses = {t["test"]: t["status"] for t in got["tests"]}
    assert statuses == expected, f"{name} ({about}): {json.dumps(got, indent=1)[:3000]}"
    assert got["score"] == sum(t["max_points"] for t in got["tests"] if t["status"] == "passed")
    assert got["max_score"] == 34  # raised points in a submission never change the maximum
    for t in got["tests"]:
        if t["status"] != "passed":
            assert t["message"], f"{name}: {t['test']} is {t['status']} without a message"
    if note:
        assert any(note in n for n in got["notes"]), f"{name}: expected a note containing {note!r}, got {got['notes']}"


def test_messages_name_the_case_step_and_tokens(graded):
    e = {t["test"]: t["message"] for t in graded["students"]["e_test_edited"]["tests"]}
    assert "tokens_processed should be" in e["decode-processed-visible"]
    assert e["decode-hidden"].startswith("hidden case ") and "tokens_processed" in e["decode-hidden"]
    i = {t["test"]: t["message"] for t in graded["students"]["i_always_equal"]["tests"]}
    assert "expected a token id (an integer), got AlwaysEqual" in i["greedy-visible"]
    assert "expected a boolean array" in i["top-k-visible"]
    refused = graded["students"]["l_reference_import"]["refusals"]
    assert any(r.startswith("answer cell top_p_mask, line 1: from miniengine.sampling import top_p_mask: this is the "
                            "course's answer key") for r in refused), refused
    assert any("naive_decode" in r and "miniengine.reference" in r for r in refused), refused


def test_feedback_pages_never_show_hidden_tests(graded):
    from autograder.grade import feedback

    r = graded["feedback"]
    assert r.returncode == 0, explain(r)
    course = graded["work"] / "course"
    pages = sorted((course / "feedback").glob("*/lab01_naive_decode/*.html"))
    # one page per student, a corrupt notebook's too (it says so)
    assert sorted(p.parent.parent.name for p in pages) == NAMES
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


# ---------------------------------------------------------------- the attacks, checked from outside

ATTACKS = sorted(MAKE.ATTACKS)


def hidden_strings() -> list[str]:
    """Every hidden prompt, and the first tokens of every hidden golden output, as they could appear in text."""
    found = []
    for path in (REPO / "autograder" / "hidden").glob("*.json"):
        data = json.loads(path.read_text())
        for section in ("cases", "fork_cases"):
            for case in data.get(section, []):
                found.append(case["prompt"])
                outputs = case.get("token_ids") or [t for c in case.get("completions", []) for t in c]
                if len(outputs) >= 4:
                    found.append(", ".join(map(str, outputs[:4])))
    return [s for s in found if len(s) >= 8]


def test_attacks_score_their_honest_zero(graded):
    for name in ATTACKS:
        assert graded["students"][name]["score"] == 0, (name, graded["students"][name])
        assert graded["students"][name]["sandbox"] == "bubblewrap-userns"


def test_no_hidden_data_in_grades_or_feedback(graded):
    secrets = hidden_strings()
    assert len(secrets) > 20
    texts = {"grades.json": (graded["work"] / "grades" / "grades.json").read_text(),
             "grades.csv": (graded["work"] / "grades" / "grades.csv").read_text()}
    for page in (graded["work"] / "course" / "feedback").glob("*/*/*.html"):
        texts[str(page)] = page.read_text()
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"{where} shows hidden data: {secret!r}"
    messages = [t["message"] for t in graded["students"]["p_read_hidden"]["tests"]]
    assert any("withheld" in m for m in messages), messages  # the smuggled prompts were caught, not just absent


def test_no_file_outside_the_students_folder_changed(graded):
    before, after = graded["before"], graded["after"]
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert changed == [], changed
    for folder in ("/", "/root", "/tmp", "/etc", str(REPO), str(graded["work"] / "course"), str(graded["work"])):
        assert not os.path.exists(os.path.join(folder, LEFTOVER)), folder


def test_no_process_left_and_no_connection_made(graded):
    import psutil

    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if DAEMON in " ".join(p.info["cmdline"] or []):
                left.append(p.pid)
        except psutil.Error:
            pass
    assert left == []
    assert not graded["connected"], "a submission connected to a listener on 127.0.0.1"


def test_grading_log_hashes_the_files_written(graded):
    out = graded["work"] / "grades"
    line = (out / "grading.log").read_text().splitlines()[-1]
    assert "sandbox=bubblewrap-userns" in line
    for name in ("grades.csv", "grades.json"):
        assert f"{name} sha256={hashlib.sha256((out / name).read_bytes()).hexdigest()}" in line


def test_the_run_says_its_sandbox_and_each_student_records_it_and_the_memory_cap(graded):
    """Graded as a normal user: bwrap in a user namespace. The memory cap is a cgroup's only where that user may
    make one (autograder/sandbox/cgroups.py); the throwaway account the tests make as root may make none."""
    import re

    said = [ln for r in graded["runs"] for ln in r.stdout.splitlines() if ln.startswith("sandbox: ")]
    assert len(said) == 2 and said[0] == said[1], graded["stdout"][:2000]
    found = re.fullmatch(r"sandbox: bubblewrap-userns \(bwrap in an unprivileged user namespace, every kernel as your "
                         r"own uid\); memory cap per submission: (RLIMIT_AS 6 GB per process|cgroup v2 memory.max 6 GB)",
                         said[0])
    assert found, said
    cap = found.group(1)
    if os.geteuid() == 0:
        assert cap == "RLIMIT_AS 6 GB per process"
    for name, student in graded["students"].items():
        assert student["sandbox"] == "bubblewrap-userns", name
        assert student["memory_cap"] == cap, name


def test_a_full_disk_fails_only_the_cell_that_filled_it_and_says_so(graded):
    """q_disk_full writes 10 GB; the scratch tmpfs (1 GB: working folder, /tmp and HOME together) stops it."""
    from autograder.grade.messages import DISK_FULL

    notes = graded["students"]["q_disk_full"]["notes"]
    assert any(n.startswith("cell ") and n.endswith(f": {DISK_FULL}") for n in notes), notes
    assert not any(DISK_FULL in n for name, s in graded["students"].items() if name != "q_disk_full" for n in s["notes"])


def test_memory_past_the_cap_stops_only_that_submission(graded):
    """q_memory_cap takes 8 GB: the address-space limit refuses it in its own cell. Under a cgroup its kernel is
    killed at the cap, and the note says so, unless the 10 s cell limit stops it first: on a VM that hands out
    fresh pages slowly (about 230 MB/s here, as root) 6 GB take longer than that."""
    student = graded["students"]["q_memory_cap"]
    notes = " | ".join(student["notes"])
    if student["memory_cap"].startswith("RLIMIT_AS"):
        assert ": MemoryError" in notes, notes
    else:
        assert "reached its memory cap" in notes or "cell 5: DeadKernelError: the kernel stopped answering" in notes, notes
