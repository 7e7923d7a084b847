"""Probes from inside the kernel: each is a lab's released stub plus one attack of a class the grader must hold
against (autograder/README.md, Integrity inside the kernel), graded by the real pipeline. A stub scores 0, so each
probe must score 0 too: an attack that earned anything would be a grade forged from inside the kernel.

Measured before these defences, on the same stubs: the five-line input transformer alone scored 40/40 on lab 03 and
20/32 on lab 01; copying the answer key by source and routing around the pass counter got full marks in lab 01
with the hidden tests. Each attack sits where a student would put it: in an answer cell (the policy refuses it, and
the stub runs instead), or in a cell of its own (never run).
"""
from __future__ import annotations

import json

import nbformat
import pytest
from autograder_support import explain, isolated_env, run_cli

pytestmark = pytest.mark.slow

FIVE_LINES = '''\
_ip = get_ipython()
def _neuter(lines):
    src = "".join(lines)
    return ["pass\\n"] if ("autograder" in src or "lab." in src) else lines
_ip.input_transformers_post.append(_neuter)
'''
FAKE_HARNESS = '''\
import importlib
import autograder


class _Anything:
    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self


autograder.labs = _Anything()
importlib.reload = lambda module: module
'''
STEAL_HIDDEN_NUMBERS = '''\
def _steal(info):
    import re
    for name, value in re.findall(r'"(\\w+)": \\(([\\d_]+), 0\\.5\\)', info.raw_cell or ""):
        globals()[name] = int(value.replace("_", ""))


get_ipython().events.register("pre_run_cell", _steal)
'''
# name: (lab, where: "answer" (appended to the lab's first answer cell), "answer:ID" (to answer cell ID), or "added" (a
#        cell after the parameters),
#        the attack, the construct a refusal names (answer cells))
PROBES = {
    # code that changes how later cells run
    "lab03_transformer_in_an_answer": ("lab03", "answer", FIVE_LINES, "get_ipython"),
    "lab01_transformer_in_its_own_cell": ("lab01", "added", FIVE_LINES, None),
    "lab02_ast_transformer_by_another_name": ("lab02", "answer",
                                              "shell = (lambda: get_ipython)()()\nimport ast\n"
                                              "shell.ast_transformers.append(ast.NodeTransformer())\n", "get_ipython"),
    "lab01_exception_handler": ("lab01", "answer",
                                "get_ipython().set_custom_exc((Exception,), lambda *a, **k: None)\n", "get_ipython"),
    # patching the harness or how it loads
    "lab01_patched_reload_and_harness": ("lab01", "answer", FAKE_HARNESS, "import importlib"),
    "lab01_sys_modules": ("lab01", "answer", "sys.modules['autograder.labs'] = None\n", "sys"),
    # reading expected values inside the kernel: a hook that reads the hidden numbers from the cell about to run
    "lab01_steals_hidden_numbers": ("lab01", "answer", STEAL_HIDDEN_NUMBERS, "get_ipython"),
    "lab03_reads_the_tests_namespace": ("lab03", "answer",
                                        "def _peek():\n    return globals().get('HELD_OUT')\n", "globals"),
    # the answer key by another road
    "lab01_answer_key_by_source": ("lab01", "answer:top_p_mask",
                                   "import inspect\nimport miniengine.sampling as s\n"
                                   "exec(inspect.getsource(s.top_k_mask))\nexec(inspect.getsource(s.top_p_mask))\n",
                                   "import inspect"),
    # routing around an instrument, and forging the observations the grader judges
    "lab01_around_the_pass_counter": ("lab01", "answer",
                                      "def _call(model, *args):\n    return model._model(*args)\n", "._model"),
    "lab01_forged_observations": ("lab01", "answer",
                                  "display({'application/vnd.miniengine.observations+json': {'rows': []}}, raw=True)\n",
                                  "display"),
}


def answer_cell(nb, where: str):
    """The answer cell ``where`` names: the first one ("answer"), or the one of a grade id ("answer:top_p_mask")."""
    gid = where.partition(":")[2]
    return next(c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")
                and (not gid or c.metadata["nbgrader"]["grade_id"] == gid))


# The five lines in a cell of their own, graded as submitted (`grade --as-submitted`, where they do run and make every
# later test cell do nothing): each of these labs must still give 0, because a cell that hands the grader no
# observations fails outside the kernel. Before the harnesses observed, the same cell scored 21/25, 21/25, 20/24,
# 19/21, 12/16 and 13/16 on labs 04-09's stubs (lab 10 came after).
AS_SUBMITTED = ("lab04", "lab05", "lab06", "lab07", "lab08", "lab09", "lab10")
LABS = ("lab01", "lab02", "lab03") + AS_SUBMITTED


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    work = tmp_path_factory.mktemp("probes")
    env = isolated_env(work)
    r = run_cli("release", *LABS, env=env, cwd=work, timeout=600)
    assert r.returncode == 0, explain(r)
    folder = work / "submissions"
    for name, (lab, where, attack, _) in PROBES.items():
        release = next((work / "course" / "release").glob(f"{lab}_*/{lab}_*.ipynb"))
        nb = nbformat.read(release, as_version=4)
        if where.startswith("answer"):
            answer_cell(nb, where).source += "\n" + attack
        else:
            nb.cells.insert(2, nbformat.v4.new_code_cell(attack))
        (folder / name).mkdir(parents=True)
        nbformat.write(nb, folder / name / release.name)
    r = run_cli("grade", folder, "--workers", 2, "--timeout", 20, "--out", work / "grades", env=env, cwd=work,
                timeout=900)
    assert r.returncode == 0, explain(r)
    raw = work / "as-submitted"
    for lab in AS_SUBMITTED:
        release = next((work / "course" / "release").glob(f"{lab}_*/{lab}_*.ipynb"))
        nb = nbformat.read(release, as_version=4)
        nb.cells.insert(2, nbformat.v4.new_code_cell(FIVE_LINES))
        (raw / f"{lab}_transformer_as_submitted").mkdir(parents=True)
        nbformat.write(nb, raw / f"{lab}_transformer_as_submitted" / release.name)
    r = run_cli("grade", raw, "--as-submitted", "--workers", 2, "--timeout", 20, "--out", work / "raw-grades",
                env=env, cwd=work, timeout=900)
    assert r.returncode == 0, explain(r)
    return {s["student"]: s for grades in ("grades", "raw-grades")
            for s in json.loads((work / grades / "grades.json").read_text())["students"]}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_an_attack_from_inside_the_kernel_earns_nothing(graded, name):
    lab, where, _, construct = PROBES[name]
    got = graded[name]
    assert got["lab"].startswith(lab) and got["notebook"] == "assembled"
    assert got["score"] == 0 and not any(t["status"] == "passed" for t in got["tests"]), json.dumps(got)[:3000]
    if where.startswith("answer"):
        assert any(f": {construct}: " in r for r in got["refusals"]), got["refusals"]
    else:
        assert got["refusals"] == [] and any("a cell you added" in n for n in got["notes"]), got["notes"]


@pytest.mark.parametrize("lab", AS_SUBMITTED)
def test_the_five_lines_run_as_submitted_earn_nothing(graded, lab):
    got = graded[f"{lab}_transformer_as_submitted"]
    assert got["lab"].startswith(lab) and got["notebook"] == "as submitted"
    assert got["score"] == 0 and not any(t["status"] == "passed" for t in got["tests"]), json.dumps(got)[:3000]
