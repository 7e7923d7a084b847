"""Fast tests of the autograder's parts: no kernels, no nbgrader runs.

The end-to-end checks (verify, the adversarial fixtures, the student workflow,
regress) live in test_fixtures.py, test_cli.py and
test_regress.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import nbformat
import numpy as np
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook

from autograder import course_paths, notebook_checks as checks, results
from autograder.grade import feedback, submissions

LAB = "lab01_naive_decode"


# ---------------------------------------------------------------- which lab, which student

def test_find_labs_accepts_full_names_and_prefixes():
    assert [lab.name for lab in course_paths.find_labs([LAB])] == [LAB]
    assert [lab.name for lab in course_paths.find_labs(["lab01"])] == [LAB]
    assert course_paths.find_labs(["lab01"])[0].source.is_file()


def test_unknown_lab_is_a_clear_error():
    with pytest.raises(course_paths.LabError, match=r"no lab named 'lab99'.*lab01_naive_decode"):
        course_paths.find_labs(["lab99"])


def _nb(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), str(path))
    return path


def test_student_ids_from_the_usual_layouts(tmp_path):
    _nb(tmp_path / "alice" / f"{LAB}.ipynb")                              # a folder per student
    _nb(tmp_path / "submitted" / "bob" / LAB / f"{LAB}.ipynb")             # nbgrader's layout
    _nb(tmp_path / f"carol_{LAB}.ipynb")                                    # loose, lab name in the file
    _nb(tmp_path / "dave lab01.ipynb")                                      # loose, short lab name, a space
    _nb(tmp_path / ".ipynb_checkpoints" / f"alice-checkpoint.ipynb")      # never a submission
    found = {s.student: s for s in submissions.collect(tmp_path)}
    assert sorted(found) == ["alice", "bob", "carol", "dave"]
    assert {s.lab.name for s in found.values()} == {LAB}


def test_single_notebook_student_id(tmp_path):
    one = _nb(tmp_path / "student" / LAB / f"{LAB}.ipynb")
    assert submissions.collect(one)[0].student == "student"
    assert submissions.collect(one, student="erin")[0].student == "erin"
    assert submissions.collect(_nb(tmp_path / "frank" / f"{LAB}.ipynb"))[0].student == "frank"


def test_two_notebooks_of_one_student_are_both_graded(tmp_path):
    _nb(tmp_path / "alice" / f"{LAB}.ipynb")
    _nb(tmp_path / "alice" / "old" / f"{LAB}.ipynb")
    assert sorted(s.student for s in submissions.collect(tmp_path)) == ["alice", "alice-2"]


def test_zip_of_submissions(tmp_path):
    src = tmp_path / "src"
    _nb(src / "alice" / f"{LAB}.ipynb")
    archive = tmp_path / "subs.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(src / "alice" / f"{LAB}.ipynb", f"alice/{LAB}.ipynb")
    work = tmp_path / "work"
    work.mkdir()
    found = submissions.collect(archive, workdir=work)
    assert [s.student for s in found] == ["alice"] and found[0].path.is_relative_to(work)


def test_zip_refuses_members_outside_the_folder(tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../escaped.ipynb", "{}")
    with pytest.raises(course_paths.LabError, match="outside"):
        submissions.collect(archive, workdir=tmp_path)


@pytest.mark.parametrize("name, content, message", [
    ("missing", None, "no such file"),
    ("notes.txt", "hello", "expected a .ipynb"),
    ("broken.zip", "not a zip", "not a readable zip"),
])
def test_bad_grade_paths(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(course_paths.LabError, match=message):
        submissions.collect(path, workdir=tmp_path)


def test_empty_folder(tmp_path):
    with pytest.raises(course_paths.LabError, match="no notebooks"):
        submissions.collect(tmp_path)


# ---------------------------------------------------------------- the saved parts handed in (mine/, lab 10)

def _mine(folder, *names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("def sample(logits, params, position):\n    return 0\n")
    return folder


def test_a_students_mine_is_found_beside_or_above_the_notebook_within_their_folder(tmp_path):
    _nb(tmp_path / "alice" / f"{LAB}.ipynb")
    _mine(tmp_path / "alice" / "mine", "lab01.py")                               # beside it
    _nb(tmp_path / "submitted" / "bob" / LAB / f"{LAB}.ipynb")
    _mine(tmp_path / "submitted" / "bob" / "mine", "lab01.py")                   # above it, in bob's folder
    _nb(tmp_path / "carol" / f"{LAB}.ipynb")                                     # none handed in
    _mine(tmp_path / "mine", "lab01.py")  # beside nobody's notebook, in a folder of many: nobody's
    found = {s.student: s.mine for s in submissions.collect(tmp_path)}
    assert found == {"alice": tmp_path / "alice" / "mine", "bob": tmp_path / "submitted" / "bob" / "mine",
                     "carol": None}


def test_a_zip_of_one_students_checkout_hands_in_its_top_level_mine(tmp_path):
    archive = tmp_path / "alice.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"labs/{LAB}/{LAB}.ipynb", nbformat.writes(new_notebook(cells=[new_code_cell("x = 1")])))
        zf.writestr("mine/lab01.py", "def sample(logits, params, position):\n    return 0\n")
    (tmp_path / "work").mkdir()
    [sub] = submissions.collect(archive, workdir=tmp_path / "work")
    assert sub.mine is not None and (sub.mine / "lab01.py").is_file() and sub.mine.is_relative_to(tmp_path / "work")


def test_a_lone_notebooks_mine_is_beside_it_or_named(tmp_path):
    one = _nb(tmp_path / "erin" / f"{LAB}.ipynb")
    assert submissions.collect(one)[0].mine is None
    elsewhere = _mine(tmp_path / "erins-parts", "lab01.py")
    assert submissions.collect(one, mine=elsewhere)[0].mine == elsewhere
    _mine(tmp_path / "erin" / "mine", "lab01.py")
    assert submissions.collect(one)[0].mine == tmp_path / "erin" / "mine"
    with pytest.raises(course_paths.LabError, match="--mine names one student's saved parts: give a single notebook"):
        submissions.collect(tmp_path, mine=elsewhere)
    with pytest.raises(course_paths.LabError, match="--mine .*nowhere: no such folder"):
        submissions.collect(one, mine=tmp_path / "nowhere")


def test_a_linked_mine_is_never_followed(tmp_path):
    secret = _mine(tmp_path / "instructor", "lab01.py")
    _nb(tmp_path / "subs" / "mallory" / f"{LAB}.ipynb")
    (tmp_path / "subs" / "mallory" / "mine").symlink_to(secret)
    assert submissions.collect(tmp_path / "subs")[0].mine is None


def test_only_the_saved_modules_of_a_mine_are_copied_for_the_sandbox(tmp_path):
    handed = _mine(tmp_path / "mine", "lab01.py", "lab05.py", "lab01.status.json", "notes.py")
    (handed / "lab04.py").symlink_to(tmp_path / "mine" / "lab01.py")
    (handed / "lab08.py").write_bytes(b"#" * (submissions.MINE_FILE_BYTES + 1))
    copy = tmp_path / "copy"
    notes = submissions.snapshot_mine(handed, copy)
    assert sorted(p.name for p in copy.iterdir()) == ["lab01.py", "lab05.py"]
    assert notes == ["mine/lab04.py is not a plain file (a link?): left out, so its parts are the course's",
                     "mine/lab08.py is over 1 MB: left out, so its parts are the course's"]
    assert oct(copy.stat().st_mode & 0o777) == "0o755" and oct((copy / "lab01.py").stat().st_mode & 0o777) == "0o644"


def test_only_lab_10_gets_the_mine_handed_in_and_its_report_says_what_was_served(tmp_path):
    handed = _mine(tmp_path / "mine", "lab01.py", "lab05.py", "lab05.status.json")
    lab01, lab10 = course_paths.find_labs([LAB, "lab10"])
    assert submissions.handed_in_mine(submissions.Submission("a", lab01, tmp_path / "x.ipynb", handed),
                                      tmp_path / "one") == (None, [])  # graded on the course's parts: nothing mounted
    copy, notes = submissions.handed_in_mine(submissions.Submission("a", lab10, tmp_path / "x.ipynb", handed),
                                             tmp_path / "ten")
    assert copy == tmp_path / "ten" and notes == [
        "mine/ handed in (lab01.py, lab05.py): Task 3 served every part of labs 01-09 they define that plugs into the "
        "engine, as handed in, and the course's for the rest"]
    assert submissions.handed_in_mine(submissions.Submission("b", lab10, tmp_path / "y.ipynb"), tmp_path / "no") == (
        None, [])  # the served test's output says so; a note would be a problem (verify's solution hands in none)
    assert not (tmp_path / "no").exists()  # nothing copied, nothing mounted


# ---------------------------------------------------------------- the helpers the test cells use

class AlwaysEqual:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


@pytest.mark.parametrize("value, expected", [(3, 3), (np.int64(7), 7), (torch.tensor(5), 5)])
def test_as_token_accepts_integers(value, expected):
    got = checks.as_token(value, "x")
    assert type(got) is int and got == expected


@pytest.mark.parametrize("value", [AlwaysEqual(), 3.0, True, np.float64(2.0), torch.tensor(1.5), "3", None])
def test_as_token_rejects_everything_else(value):
    with pytest.raises(AssertionError, match="expected a token id"):
        checks.as_token(value, "x")


def test_as_mask():
    assert checks.as_mask(np.array([True, False]), 2, "m") == [True, False]
    assert checks.as_mask(torch.tensor([False, True]), 2, "m") == [False, True]
    for bad, message in [(AlwaysEqual(), "boolean array"), (np.array([1, 0]), "boolean array"),
                         (np.array([True]), "shape")]:
        with pytest.raises(AssertionError, match=message):
            checks.as_mask(bad, 2, "m")


def test_reference_forbidden_catches_aliases_and_restores_the_reference():
    from miniengine import sampling
    from miniengine.reference import naive_generate
    from miniengine.sampling import top_k_mask as renamed

    logits = np.array([1.0, 3.0, 2.0])
    before = renamed(logits, 1).tolist()

    def student_mask(x, k):
        return renamed(x, k)

    def student_catches_everything(x, k):
        try:
            return sampling.top_k_mask(x, k)
        except Exception:
            return np.ones(len(x), dtype=bool)

    for fn in (student_mask, student_catches_everything):
        with pytest.raises(AssertionError, match="miniengine.sampling.top_k_mask"):
            with checks.reference_forbidden("top_k_mask"):
                fn(logits, 1)
    with pytest.raises(AssertionError, match="miniengine.reference.naive_generate"):
        with checks.reference_forbidden("naive_decode"):
            naive_generate(None, [[1]], sampling.SamplingParams())
    assert renamed(logits, 1).tolist() == before  # the reference works again afterwards
    with checks.reference_forbidden("own code"):
        assert checks.as_token(int(np.argmax(logits)), "x") == 1  # code that avoids the reference is unaffected


def test_require_own():
    def mine(x):
        return x

    mine.__module__ = "__main__"
    checks.require_own(mine, "mine")
    from miniengine.sampling import top_k_mask

    with pytest.raises(AssertionError, match="defined in this notebook"):
        checks.require_own(top_k_mask, "top_k_mask")
    with pytest.raises(AssertionError, match="with def"):
        checks.require_own(np.argmax, "greedy")


def test_one_case_per_kind_spreads_over_prompts():
    cases = [{"name": f"p{p}-{k}", "prompt": f"prompt {p}"} for p in range(3) for k in ("greedy", "top_k")]
    chosen = checks.one_case_per_kind(cases)
    assert [c["name"] for c in chosen] == ["p0-greedy", "p1-top_k"]


def test_tokens_processed_formula():
    assert checks.tokens_processed(5, 3) == 5 + 6 + 7


# ---------------------------------------------------------------- statuses

def _cell(outputs, grade_id="t", points=2):
    cell = new_code_cell("pass", metadata={"nbgrader": {"grade": True, "solution": False, "grade_id": grade_id,
                                                       "points": points, "locked": True, "schema_version": 3}})
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


TEST = results.TestCell("t", 2.0, False)


@pytest.mark.parametrize("outputs, score, status, message", [
    ([], 2.0, "passed", ""),
    ([{"output_type": "error", "ename": "AssertionError", "evalue": "p0-greedy, step 3: expected 5", "traceback": []}],
     0.0, "failed", "p0-greedy, step 3: expected 5"),
    ([{"output_type": "error", "ename": "NameError", "evalue": "name 'greedy' is not defined", "traceback": []}],
     0.0, "error", "NameError: name 'greedy' is not defined"),
    ([{"output_type": "error", "ename": "NotImplementedError", "evalue": "", "traceback": []}],
     0.0, "error", "NotImplementedError"),
    ([{"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []},
      {"output_type": "error", "ename": "CellTimeoutError", "evalue": "", "traceback": []}],
     0.0, "timeout", "ran past the 10 s limit"),
    ([{"output_type": "stream", "name": "stderr", "text": "UserWarning: careful\n"}], 0.0, "failed", "stderr"),
])
def test_judge(outputs, score, status, message):
    r = results.judge(_cell(outputs), score, TEST, timeout=10)
    assert r.status == status and message in r.message
    assert r.points == (2.0 if status == "passed" else 0.0)


def test_table_and_reports(tmp_path):
    rows = [results.StudentResult("alice", LAB, "a.ipynb", [results.TestResult("t", 2, 2, "passed")]),
            results.StudentResult("bob", LAB, "b.ipynb", results.everything([TEST], "corrupt notebook", "bad JSON"))]
    text = results.table(rows)
    assert "alice" in text and "2/2" in text and "corrupt notebook" in text
    csv_path, json_path, kept = results.write_reports(rows, tmp_path)
    assert "bob,lab01_naive_decode,t,False,0,2,corrupt notebook,bad JSON" in csv_path.read_text()
    assert '"score": 2' in json_path.read_text() and kept == 0


def test_a_later_batch_merges_with_the_earlier_grades(tmp_path):
    first = [results.StudentResult("alice", LAB, "a.ipynb", [results.TestResult("t", 0, 2, "failed")]),
             results.StudentResult("bob", LAB, "b.ipynb", [results.TestResult("t", 2, 2, "passed")])]
    results.write_reports(first, tmp_path)
    again = [results.StudentResult("alice", LAB, "a2.ipynb", [results.TestResult("t", 2, 2, "passed")]),
             results.StudentResult("carol", LAB, "c.ipynb", [results.TestResult("t", 1, 2, "failed")])]
    csv_path, json_path, kept = results.write_reports(again, tmp_path)
    assert kept == 1  # bob, from the first folder
    got = {s["student"]: s["score"] for s in json.loads(json_path.read_text())["students"]}
    assert got == {"alice": 2, "bob": 2, "carol": 1}  # alice's latest grade, bob kept, carol added
    assert csv_path.read_text().count("alice") == 1
    assert not list(tmp_path.glob(".*.tmp"))


# ---------------------------------------------------------------- feedback never shows hidden tests

def test_hidden_lines_exclude_lines_that_are_also_visible():
    nb = new_notebook(cells=[
        new_code_cell("import json\nassert visible_check(1)"),
        new_code_cell("# about\n### BEGIN HIDDEN TESTS\nimport json\nassert secret_prompt_check(42)\n### END HIDDEN TESTS"),
    ])
    assert feedback.hidden_lines(nb) == {"assert secret_prompt_check(42)"}


def test_leaks_reads_text_through_syntax_highlighting(tmp_path):
    page = tmp_path / "f.html"
    page.write_text('<pre><span class="k">assert</span> <span class="n">secret_prompt_check</span>(<span>42</span>)</pre>'
                    "<pre>assert secret_prompt_check(42) and more</pre>")
    assert feedback.leaks(page, {"assert secret_prompt_check(42)"}) == ["assert secret_prompt_check(42)"]
    page.write_text("<pre>assert secret_prompt_check(42) and more</pre>")
    assert feedback.leaks(page, {"assert secret_prompt_check(42)"}) == []


# ---------------------------------------------------------------- the command line, from anywhere

def run_cli(*args, cwd):
    from autograder_support import isolated_env

    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=isolated_env(cwd))


@pytest.mark.parametrize("args, message", [
    ((), "required: VERB"),
    (("frobnicate",), "invalid choice"),
    (("release", "lab99"), "no lab named 'lab99'"),
    (("grade", "/nonexistent/folder"), "no such file or folder"),
    (("grade", ".", "--workers", "0"), "must be greater than 0"),
    (("grade", ".", "--timeout", "soon"), "expected a number"),
    (("check", "/nonexistent.ipynb"), "no such notebook"),
    (("verify", "lab99"), "no lab named"),
    (("regress", "no_such_notebook"), "no notebook named"),
])
def test_bad_arguments_give_one_clear_line(tmp_path, args, message):
    r = run_cli(*args, cwd=tmp_path)  # from a directory outside the repository
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_help_lists_every_verb(tmp_path):
    r = run_cli("--help", cwd=tmp_path)
    for verb in ("release", "grade", "feedback", "check", "verify", "regress", "bench"):
        assert verb in r.stdout


# ---------------------------------------------------------------- nbgrader's gradebook stamp

def test_the_in_process_alembic_head_is_what_alembic_heads_prints(tmp_path):
    """nbgrader_config.alembic_head_in_process replaces nbgrader's `alembic heads` subprocess: the same revision, and a
    gradebook made through the course's nbgrader API carries it."""
    from nbgrader.api import Gradebook
    from nbgrader.dbutil import _temp_alembic_ini

    from autograder.notebooks import nbgrader_config

    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'unused.db'}") as ini:
        out = subprocess.run([sys.executable, "-m", "alembic", "-c", ini, "heads"], capture_output=True, text=True,
                             check=True).stdout
    printed = out.split()[0]
    nbgrader_config.nbgrader_api(tmp_path / "course")  # installs the in-process version
    import nbgrader.api

    assert nbgrader.api.get_alembic_version() == printed
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        stamped = gb.db.execute(nbgrader.api.text("select version_num from alembic_version")).scalar()
    assert stamped == printed


def test_check_takes_a_labs_name_for_your_copy(tmp_path, monkeypatch):
    """`check lab01`: the student's copy (student/ here, labs/ in the student edition), or a message that says what to do."""
    monkeypatch.setattr(course_paths, "STUDENT", tmp_path)
    with pytest.raises(course_paths.LabError, match=r"lab01_naive_decode.ipynb: no such notebook \(run `make lab`"):
        course_paths.student_notebook("lab01")
    mine = tmp_path / "lab01_naive_decode" / "lab01_naive_decode.ipynb"
    mine.parent.mkdir()
    mine.write_text("{}")
    assert course_paths.student_notebook("lab01") == mine == course_paths.student_notebook("lab01_naive_decode")
    with pytest.raises(course_paths.LabError, match=r"no lab named 'lab99' \(labs: lab01_naive_decode, "):
        course_paths.student_notebook("lab99")

