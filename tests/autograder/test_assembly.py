"""The graded notebook (autograder/notebooks/assembly.py): the lab's release, with only the answer cells' contents taken from
the submission; added cells and edited given cells do not run, a refused answer is left as the stub."""
from __future__ import annotations

import copy

import nbformat
import pytest

from autograder import answer_policy
from autograder.notebooks import assembly


@pytest.fixture(scope="module")
def release():
    """Lab 01 as released: nbgrader's own preprocessors clear the solutions and the hidden tests."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    nb = nbformat.read(assembly.course_paths.LABS / "lab01_naive_decode" / "lab01_naive_decode.ipynb", as_version=4)
    for pre in (ClearSolutions(), ClearHiddenTests()):
        nb, _ = pre.preprocess(nb, {})
    return nb


def answer(nb, gid):
    return next(c for c in nb.cells if assembly.grade_id(c) == gid)


def test_answers_come_from_the_submission_and_everything_else_from_the_release(release):
    sub = copy.deepcopy(release)
    answer(sub, "greedy").source = "def greedy(logits):\n    return int(np.argmax(logits))\n"
    answer(sub, "greedy").metadata.nbgrader["points"] = 99  # metadata stays the course's
    given = next(c for c in sub.cells if c.cell_type == "code" and not assembly.is_answer(c) and not assembly.is_test(c)
                 and "load_model" in c.source)
    given.source += "\nmodel = None\n"
    sub.cells.insert(3, nbformat.v4.new_code_cell("get_ipython().events.register('pre_run_cell', print)"))
    test = next(c for c in sub.cells if assembly.is_test(c))
    test.source = "pass"
    out = assembly.assemble(release, sub)
    assert answer(out.notebook, "greedy").source == answer(sub, "greedy").source
    assert answer(out.notebook, "greedy").metadata.nbgrader.get("points") != 99
    assert [c.source for c in out.notebook.cells if not assembly.is_answer(c)] == \
        [c.source for c in release.cells if not assembly.is_answer(c)]
    assert len(out.not_run) == 2 and any("you added" in n for n in out.not_run) and any("edited" in n for n in out.not_run)
    assert out.refusals == [] and "sample" not in out.missing


def test_a_refused_answer_is_left_as_the_stub_and_said_so(release):
    sub = copy.deepcopy(release)
    answer(sub, "greedy").source = "get_ipython().input_transformers_post.append(lambda lines: lines)\n"
    out = assembly.assemble(release, sub)
    assert answer(out.notebook, "greedy").source == answer(release, "greedy").source
    assert [r.construct for r in out.refusals] == ["get_ipython"]
    assert any(n.startswith("refused, so the stub ran in its place: answer cell greedy, line 1") for n in out.notes())


def test_a_missing_answer_cell_is_the_stub(release):
    sub = copy.deepcopy(release)
    sub.cells = [c for c in sub.cells if assembly.grade_id(c) != "greedy"]
    out = assembly.assemble(release, sub)
    assert out.missing == ["greedy"] and answer(out.notebook, "greedy").source == answer(release, "greedy").source


def test_the_policy_reads_the_source_where_the_grader_has_it():
    """The grader checks answers against the lab's source (its hidden cells' names included), check against the
    release: the harness's names are refused in both."""
    src = nbformat.read(assembly.course_paths.LABS / "lab01_naive_decode" / "lab01_naive_decode.ipynb", as_version=4)
    lab = answer_policy.lab_of(src)
    assert {"lab", "report", "golden"} <= lab.tests_only
