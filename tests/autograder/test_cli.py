"""The autograder as its users drive it: a student's release, check and grade; the instructor's verify.

Every run uses working folders of its own (AUTOGRADER_*_DIR), never the real
course/ or student/.
"""
from __future__ import annotations

import json
import re

import nbformat
import pytest
from autograder_support import REPO, explain, isolated_env, run_cli
from nbformat.v4 import new_code_cell, new_notebook

from autograder import results

pytestmark = pytest.mark.slow
LAB = "lab01_naive_decode"


def solutions() -> dict[str, str]:
    source = nbformat.read(REPO / "labs" / LAB / f"{LAB}.ipynb", as_version=4)
    out = {}
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            out[meta["grade_id"]] = "\n".join(ln for ln in cell.source.splitlines() if "### " not in ln)
    return out


def write_solutions(path, replace):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in replace:
            cell.source = replace[gid]
    nbformat.write(nb, str(path))


def test_student_workflow(tmp_path):
    env = isolated_env(tmp_path)
    student_nb = tmp_path / "student" / LAB / f"{LAB}.ipynb"

    # make lab: publish once, then never overwrite the student's work
    r = run_cli("release", "--if-missing", env=env, cwd=tmp_path)
    assert r.returncode == 0 and student_nb.exists(), explain(r)
    nb = nbformat.read(student_nb, as_version=4)
    assert "BEGIN HIDDEN TESTS" not in nbformat.writes(nb) and "BEGIN SOLUTION" not in nbformat.writes(nb)

    # an honest mistake: top-k drops the logits tied with the k-th largest (and its test cell "fixed" to pass)
    good = solutions()
    write_solutions(student_nb, {**good, "top_k_mask": good["top_k_mask"].replace("logits >= kth", "logits > kth"),
                                 "top-k-visible": "pass"})
    edited = student_nb.read_text()
    for args in (("release", "--if-missing"), ("release",)):
        r = run_cli(*args, env=env, cwd=tmp_path)
        assert r.returncode == 0, explain(r)
        assert student_nb.read_text() == edited, f"{args} overwrote the student's notebook"
    assert "kept your edited" in r.stdout

    r = run_cli("check", student_nb, env=env, cwd=tmp_path)
    assert r.returncode == 1, explain(r)
    assert "top-k-visible" in r.stdout and "top_k_mask([1.0, 3.0, 2.0, 3.0], k=1) should keep" in r.stdout
    assert "hidden: runs when your notebook is graded" in r.stdout  # hidden tests are listed, not run
    assert "greedy-visible            1 pts  passed" in r.stdout
    assert "you edited this test cell; it was checked with the original" in r.stdout

    # fixed: check passes, and the grader agrees
    released = nbformat.read(tmp_path / "course" / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    original_test = next(c.source for c in released.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "top-k-visible")
    write_solutions(student_nb, {**good, "top-k-visible": original_test})
    # the counts come from the lab's own test cells, so adding a test to the lab never breaks this one
    tests = results.test_cells(nbformat.read(REPO / "labs" / LAB / f"{LAB}.ipynb", as_version=4))
    visible, total = sum(not t.hidden for t in tests), sum(t.max_points for t in tests)
    r = run_cli("check", student_nb, env=env, cwd=tmp_path)
    assert r.returncode == 0 and f"{visible} of {visible} visible tests passed" in r.stdout, explain(r)
    r = run_cli("grade", student_nb, "--student", "me", "--out", tmp_path / "grades", env=env, cwd=tmp_path)
    assert r.returncode == 0, explain(r)
    graded = json.loads((tmp_path / "grades" / "grades.json").read_text())["students"]
    assert [(s["student"], s["score"], s["max_score"]) for s in graded] == [("me", total, total)]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """One grading run of two copies of a notebook whose scratch cell loops forever: "slow" meets the whole
    notebook's limit (12 s), and "victim" has its worker killed from outside the moment it starts the sandbox's
    launcher, before bwrap runs: a sandbox started in that window once outlived its worker and held the grading
    run for ever (autograder.sandbox.bubblewrap.die_with)."""
    import shutil
    import subprocess
    import sys
    import threading
    import time

    import psutil
    from autograder_support import FIXTURES

    work = tmp_path_factory.mktemp("limits")
    for student in ("slow", "victim"):
        (work / "subs" / student).mkdir(parents=True)
        shutil.copy(FIXTURES / "c_toplevel_loop.ipynb", work / "subs" / student / f"{LAB}.ipynb")
    cmd = [sys.executable, "-m", "autograder", "grade", str(work / "subs"), "--lab", "lab01", "--timeout", "60",
           "--notebook-timeout", "12", "--workers", "2", "--out", str(work / "grades")]
    proc = subprocess.Popen(cmd, env=isolated_env(work), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    killed = []

    def kill_the_worker():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            for p in psutil.process_iter(["cmdline"]):
                line = " ".join(p.info["cmdline"] or [])
                if "autograder.grade.worker" in line and "victim" in line:
                    while time.monotonic() < deadline:
                        try:
                            launched = any("autograder.sandbox.bubblewrap" in " ".join(c.cmdline()) for c in p.children())
                        except psutil.Error:
                            launched = False
                        if launched:
                            break
                        time.sleep(0.005)
                    p.kill()
                    killed.append(p.pid)
                    return
            time.sleep(0.2)

    threading.Thread(target=kill_the_worker, daemon=True).start()
    out, err = proc.communicate(timeout=120)
    students = {s["student"]: s for s in json.loads((work / "grades" / "grades.json").read_text())["students"]}
    return {"returncode": proc.returncode, "output": out + err, "killed": killed, "students": students}


def test_a_notebook_over_its_total_time_limit_is_stopped(stopped):
    """The last line of defence: the whole notebook's limit kills the worker and its kernel, and says so."""
    assert stopped["returncode"] == 0 and sorted(stopped["students"]) == ["slow", "victim"], stopped["output"]
    student = stopped["students"]["slow"]
    assert {t["status"] for t in student["tests"]} == {"timeout"} and student["score"] == 0
    assert "took over 12 s in total" in student["tests"][0]["message"]
    assert student["seconds"] < 45


def test_a_worker_that_dies_is_reported_as_such_not_as_failed_tests(stopped):
    """A worker killed from outside (the OOM killer, an operator) costs every test, with the reason given."""
    assert stopped["killed"] and stopped["returncode"] == 0, stopped["output"]
    assert sorted(stopped["students"]) == ["slow", "victim"], stopped["output"]
    student = stopped["students"]["victim"]
    assert {t["status"] for t in student["tests"]} == {"error"} and student["score"] == 0
    assert student["tests"][0]["message"].startswith("grading process died (signal 9)"), student["tests"][0]


def _test_cell(grade_id: str, source: str):
    return new_code_cell(source, metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                                        "grade_id": grade_id, "points": 1, "schema_version": 3}})


@pytest.fixture(scope="module")
def checked_synthetic(tmp_path_factory):
    """``check`` with a 3 s limit per cell on a tiny lab: a measurement written the labs' way, then an ungraded
    cell and a test cell that each sleep past the limit.  One run (about 10 s) serves the tests below."""
    work = tmp_path_factory.mktemp("check")
    cells = [
        new_code_cell("FAST = False\nDEVICE = 'cpu'\nSEED = 0", metadata={"tags": ["parameters"]}),
        # autograder/README.md, Notebook conventions, rule 2: the grader always runs the short version
        new_code_cell("import os, time\nn_new = 48 if FAST or os.environ.get('NBGRADER_EXECUTION') else 320"),
        _test_cell("measured-short", "assert n_new == 48, f'the measurement ran {n_new} tokens, not the short 48'\n"
                                     "assert os.environ['NBGRADER_EXECUTION'] == 'autograde'"),
        new_code_cell("time.sleep(60)"),
        _test_cell("sleeps", "time.sleep(60)"),
        _test_cell("after", "assert n_new == 48"),  # the kernel goes on after an interrupted cell
        _test_cell("long", "assert False, 'the first line, ' + 'x' * 400 + '\\nand a second, which stops at the end'"),
    ]
    notebook = work / "timing.ipynb"
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                      "language": "python"}}), str(notebook))
    return run_cli("check", notebook, "--timeout", 3, env=isolated_env(work), cwd=work, timeout=120)


def _status(r, grade_id: str) -> str:
    found = re.search(rf"^  {re.escape(grade_id)}\s+1 pts  (.*)$", r.stdout, re.M)
    assert found, f"no line for {grade_id}\n" + explain(r)
    return found.group(1)


def test_check_runs_measurements_short_as_grading_does(checked_synthetic):
    r = checked_synthetic
    assert _status(r, "measured-short") == results.PASSED, explain(r)
    assert "measurements run short, as when graded" in r.stdout


def test_check_reports_a_timeout_as_a_timeout(checked_synthetic):
    r = checked_synthetic
    assert r.returncode == 1 and "2 of 4 visible tests passed" in r.stdout, explain(r)
    # a test cell: the grader's status for it, with its reason
    assert _status(r, "sleeps") == f"{results.TIMED_OUT}: ran past the 3 s limit per cell and was interrupted", explain(r)
    # an ungraded cell: a note that says what happened, not the KeyboardInterrupt the interrupt raised in it
    assert "note: cell 3 ran past the 3 s limit per cell and was interrupted" in r.stdout, explain(r)
    assert "KeyboardInterrupt" not in r.stdout, explain(r)
    assert _status(r, "after") == results.PASSED, explain(r)


def test_check_prints_a_failing_message_whole(checked_synthetic):
    r = checked_synthetic
    assert _status(r, "long") == f"{results.FAILED}: the first line, " + "x" * 400, explain(r)
    assert re.search(r"^ {10,}and a second, which stops at the end$", r.stdout, re.M), explain(r)


# ---------------------------------------------------------------- planted bugs: what a failed test's message says

# Right for as many calls as the visible tests make (their three hand-made cases, then every step of the visible greedy
# runs), then an IndexError on some steps: the hidden test's. A cell of the student's own that flipped a flag
# before the hidden test would never run: the grader runs the lab's notebook with the answer cells in it.
BROKEN_GREEDY = """def greedy(logits, _calls=[0]):
    _calls[0] += 1  # right for the first {visible} calls, then an IndexError on some steps
    if _calls[0] > {visible} and int(np.argmax(logits)) % 3 == 0:
        return [][1]
    return int(np.argmax(logits))"""


def visible_greedy_calls() -> int:
    golden = json.loads((REPO / "data" / "golden" / "visible.json").read_text())
    return 3 + sum(len(c["token_ids"]) for c in golden["cases"] if c["params"]["temperature"] == 0)

BROKEN_RING = """def ring_all_reduce(tensor, comm):
    \"\"\"Right on threads (ThreadRing); on the engine's gloo ranks, an IndexError.\"\"\"
    p, r = comm.world_size, comm.rank
    if p == 1:
        return tensor
    if type(comm).__name__ == "GlooComm":
        return tensor.reshape(-1).tensor_split(p)[p + 3]
    flat = tensor.reshape(-1).clone()
    chunks = flat.tensor_split(p)
    for s in range(p - 1):
        send, recv = (r - s) % p, (r - s - 1) % p
        chunks[recv].add_(comm.ring_exchange(chunks[send], torch.empty_like(chunks[recv])))
    for s in range(p - 1):
        comm.ring_exchange(chunks[(r + 1 - s) % p], chunks[(r - s) % p])
    return flat.view_as(tensor)"""


def planted(lab: str, replace: dict[str, str], before: dict[str, str], out, solved=None) -> None:
    """Lab ``lab``'s source notebook as a student would hand it in, solved, with ``replace``'s solution cells and a
    cell of code inserted before each test cell named in ``before``; hidden tests stripped, as in the release.
    ``solved``: the only solution cells solved besides ``replace``'s; the others are left as the release has them."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    nb = nbformat.read(REPO / "labs" / lab / f"{lab}.ipynb", as_version=4)
    cells = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade_id") in before:
            cells.append(new_code_cell(before[meta["grade_id"]]))
        if meta.get("solution") and solved is not None and meta["grade_id"] not in {*solved, *replace}:
            ClearSolutions()._replace_solution_region(cell, "python")
        elif meta.get("solution"):
            cell.source = replace.get(meta["grade_id"], "\n".join(ln for ln in cell.source.splitlines() if "### " not in ln))
        if "### BEGIN HIDDEN TESTS" in cell.source:  # as the release has it
            ClearHiddenTests()._remove_hidden_test_region(cell)
        cells.append(cell)
    nb.cells = cells
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))


def test_planted_bugs_get_whole_messages_that_name_the_hidden_case_and_where(tmp_path):
    """Graded in the sandbox: greedy raising on hidden steps only (lab 01), and ring_all_reduce raising inside the
    engine's rank processes (lab 09). The messages name the case, the step and the line, or the rank, the error and
    the line; the hidden ones never the exception's text; and the feedback page shows them whole."""
    env = isolated_env(tmp_path)
    # lab 01's other parts stay as released: only greedy's tests are read here (solved, the rest cost 16 s of CPU)
    planted("lab01_naive_decode", {"greedy": BROKEN_GREEDY.format(visible=visible_greedy_calls())}, {},
            tmp_path / "subs" / "planted" / "lab01_naive_decode.ipynb", solved=())
    planted("lab09_tensor_parallelism", {"ring": BROKEN_RING}, {},
            tmp_path / "subs" / "planted" / "lab09_tensor_parallelism.ipynb")
    r = run_cli("grade", tmp_path / "subs", "--out", tmp_path / "grades", env=env, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, explain(r)
    got = {(s["lab"], t["test"]): t for s in json.loads((tmp_path / "grades" / "grades.json").read_text())["students"]
           for t in s["tests"]}
    assert got[("lab01_naive_decode", "greedy-visible")]["status"] == "passed", got
    hidden = got[("lab01_naive_decode", "greedy-hidden")]
    assert hidden["status"] == "error", hidden
    assert re.fullmatch(r"hidden case p\d+-greedy \(greedy\), step \d+: your greedy raised IndexError at line 4 of "
                        r"its cell", hidden["message"]), hidden
    ring = got[("lab09_tensor_parallelism", "ring-visible")]
    assert ring["status"] == "passed", ring
    visible = got[("lab09_tensor_parallelism", "engine-visible")]["message"]
    assert re.fullmatch(r"RankError: visible golden cases on 2 ranks: rank \d raised IndexError: tuple index out of "
                        r"range\n  in ring_all_reduce, at line 7 of its cell", visible), visible
    notes = [n for s in json.loads((tmp_path / "grades" / "grades.json").read_text())["students"] for n in s["notes"]]
    assert not [n for n in notes if "was edited" in n], notes
    assert any("raised ProcessRaisedException" in n for n in notes), notes  # the measurement cell on 2 ranks
    engine = got[("lab09_tensor_parallelism", "engine-hidden")]["message"]
    assert re.fullmatch(r"your engine on 2 ranks, hidden cases: rank \d raised IndexError in ring_all_reduce, at line 7 "
                        r"of its cell", engine), engine
    assert "in ring_all_reduce, at line 7 of its cell" in r.stdout  # the table's second line of the visible message
    fb = run_cli("feedback", env=env, cwd=tmp_path, timeout=300)
    assert fb.returncode == 0, explain(fb)
    assert "no graded submissions in course/autograded for lab02" in fb.stdout  # one line for every ungraded lab
    assert fb.stdout.count("no graded submissions") == 1, fb.stdout
    page = (tmp_path / "course" / "feedback" / "planted" / "lab09_tensor_parallelism" /
            "lab09_tensor_parallelism.html").read_text()
    assert "tuple index out of range\n  in ring_all_reduce, at line 7 of its cell" in page
    assert "the function and line where it did" in page  # the footer says what a hidden test's message holds
