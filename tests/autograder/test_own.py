"""Own your engine (autograder/own/): the student's saved parts of labs 1..N inside LLM, the course's where not.

The end-to-end tests publish a student edition into a temporary folder and run there, in a process of its own,
what a student's lab 03 does after solving labs 01 to 03: each lab's solution cells saved as the student's
module (the `check` path), lab 03's last cell run from a kernel-like namespace whose cells hold lab 03's
solutions.  The engine it returns must hold the student's sampler and KV layout (their code, from mine/), a
saved sample() that always returns 0 must fall back to the course's with the failing test named, and under
grading nothing of mine/ is read or written.  The other tests run in this process on a temporary mine/.
"""
from __future__ import annotations

import json
import linecache
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LABS = sorted((REPO / "labs").glob("lab*/lab*.ipynb"))
CELL = ('# Your engine so far: your saved parts of labs 01..{n} inside LLM, the course\'s where yours is missing or '
        'fails.\nfrom autograder import own\nllm = own.my_engine("lab{n}", globals())')


def notebook(lab: int) -> dict:
    return json.loads(next((REPO / "labs").glob(f"lab{lab:02d}_*/lab{lab:02d}_*.ipynb")).read_text(encoding="utf-8"))


# What runs inside the edition: argv[1] is the instructor's labs/ folder, where the solutions come from.
IN_EDITION = r'''
import contextlib, io, json, linecache, os, sys
from pathlib import Path
from autograder import own
from autograder.own import save, source, status

labs = Path(sys.argv[1])
def nb_of(lab):
    return json.loads(next(labs.glob(f"lab{lab:02d}_*/lab{lab:02d}_*.ipynb")).read_text(encoding="utf-8"))
# Labs 01-03 solved: their solution cells saved as the student's, the way `check` saves them; labs 02 and 03 with
# every visible test recorded as passed, as `check` records them, lab 01 without (the last cell runs its tests).
save.write(1, source.from_notebook(1, nb_of(1)))
for lab in (2, 3):  # the solved notebook put in the edition's labs/, where a student's own copy lives
    src = next(labs.glob(f"lab{lab:02d}_*/lab{lab:02d}_*.ipynb"))
    path = Path("labs") / src.parent.name / f"solved_{src.name}"
    path.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    save.from_check(path, nb_of(lab), {t.grade_id: ("passed", "") for t in status.visible_tests(lab)})
ns = {"__name__": "__main__", "FAST": True, "DEVICE": "cpu", "SEED": 0}  # lab 03's kernel: one file per cell
exec("\n".join(source.preamble(source.solution_cells(nb_of(3)), source.given_cells(nb_of(3)))), ns)
for i, text in enumerate(c for c in source.solution_cells(nb_of(3)) if source.defines(c)):
    name = f"/tmp/ipykernel_own_test/{i}.py"
    linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    exec(compile(text, name, "exec"), ns)

def last_cell(serve=True):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        llm = own.my_engine("lab03", ns, serve=serve)
    c = llm.engine.config
    kv = c.kv
    return {"out": buf.getvalue(), "sampler": c.sampler and c.sampler.sample.__code__.co_filename,
            "kv": type(kv).__name__ if kv else None,
            "cache": kv is not None and getattr(kv, "cache_class", None) and kv.cache_class.write.__code__.co_filename,
            "backend": kv is not None and getattr(kv, "backend_class", None) and kv.backend_class.attend.__code__.co_filename}

report = {"mine": str(status.module_path(1).parent), "solved": last_cell()}
with open(status.module_path(1), "a", encoding="utf-8") as f:  # a broken part: sample always returns 0
    f.write("\n\ndef sample(logits, params, position):\n    return 0\n")
report["broken"] = last_cell(serve=False)  # the golden run, already tested above, left out: this test is slow enough
before = {p.name: p.stat().st_mtime_ns for p in status.module_path(1).parent.iterdir()}
os.environ["NBGRADER_EXECUTION"] = "autograde"
report["graded"] = last_cell()
report["untouched"] = before == {p.name: p.stat().st_mtime_ns for p in status.module_path(1).parent.iterdir()}
report["modules"] = sorted(m.__file__ for n, m in sys.modules.items()
                           if n.split(".")[0] in ("autograder", "miniengine") and getattr(m, "__file__", None))
print("REPORT " + json.dumps(report))
'''


@pytest.fixture(scope="module")
def edition_run(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("own")
    env = {**os.environ, "AUTOGRADER_COURSE_DIR": str(work / "course"), "AUTOGRADER_STUDENT_DIR": str(work / "student"),
           "AUTOGRADER_BUILD_DIR": str(work / "build")}
    r = subprocess.run([sys.executable, "-m", "autograder", "publish", str(work / "edition")], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"publish: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    env.pop("MINIENGINE_MINE")  # the default: mine/ at the root of the checkout the notebook runs in, the edition
    env.pop("NBGRADER_EXECUTION", None)
    r = subprocess.run([sys.executable, "-c", IN_EDITION, str(REPO / "labs")], cwd=work / "edition", env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")]
    assert r.returncode == 0 and lines, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return {"edition": work / "edition", **json.loads(lines[-1][len("REPORT "):])}


@pytest.mark.slow
def test_the_edition_saves_into_its_own_mine_folder_with_its_own_modules(edition_run):
    edition = edition_run["edition"].resolve()
    assert Path(edition_run["mine"]) == edition / "mine"
    outside = [f for f in edition_run["modules"] if not Path(f).resolve().is_relative_to(edition)]
    assert not outside, f"the edition's own/ needs modules it does not ship: {outside}"


@pytest.mark.slow
def test_labs_01_to_03_solved_build_an_engine_of_the_students_sampler_and_kv_layout(edition_run):
    run, mine = edition_run["solved"], Path(edition_run["mine"])
    assert run["sampler"] == str(mine / "lab01.py"), run["out"]
    assert run["kv"] == "PerSequenceKV" and run["cache"] == run["backend"] == str(mine / "lab02.py"), run["out"]
    row = {part: next(ln for ln in run["out"].splitlines() if ln.startswith(f"  {part}  ")) for part in ("sampler", "KV cache")}
    assert all(" yours " in r and " in LLM " in r for r in row.values()), run["out"]
    assert "40/40 visible golden runs token-exact" in run["out"], run["out"]


@pytest.mark.slow
def test_a_broken_saved_part_falls_back_with_the_reason(edition_run):
    run = edition_run["broken"]
    assert run["sampler"] is None, f"the broken sample() is still plugged in:\n{run['out']}"
    sampler = next(ln for ln in run["out"].splitlines() if ln.startswith("  sampler  "))
    assert " course's " in sampler and re.search(r"\S+-visible failed: AssertionError: ", sampler), run["out"]
    assert run["kv"] == "PerSequenceKV", run["out"]


@pytest.mark.slow
def test_grading_uses_the_courses_parts_and_leaves_mine_alone(edition_run):
    run = edition_run["graded"]
    assert run["sampler"] is None and run["kv"] is None, run
    assert "graded on its own" in run["out"] and edition_run["untouched"]


# ---------------------------------------------------------------- in this process, on a temporary mine/

def kernel(lab: int, cells: dict) -> dict:
    """A namespace as a kernel leaves it: each cell compiled under a file name of its own, its lines in linecache."""
    ns = {"__name__": "__main__"}
    for i, text in enumerate(cells.values()):
        name = f"/tmp/ipykernel_own_unit/{lab}_{i}.py"
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
        exec(compile(text, name, "exec"), ns)
    return ns


def test_a_saved_module_holds_the_students_cells_and_the_imports_they_need(mine_folder):
    from autograder.own import save, source, status

    ns = kernel(4, {"imports": "import os\nimport numpy as np\nfrom collections import OrderedDict, deque\n",
                    "helper": "def seats(budget):\n    return np.int64(budget.max_seqs)\n",
                    "demo": "rows = [1, 2, 3]\n",
                    "fits": "def fits(seq, seqs_left, tokens_left, can_allocate):\n    return seats(seqs_left) > 0\n"})
    path, lost, wrote = save.from_kernel(4, ns)
    text = path.read_text(encoding="utf-8")
    body = source.body_of(text)
    assert wrote and not lost and path == status.module_path(4) and "Your Lab 04 parts" in text
    assert "def fits" in body and "def seats" in body and "rows = [1, 2, 3]" not in body
    assert "import numpy as np" in body and "import os" not in body and "deque" not in body
    again, _, _ = save.from_kernel(4, ns)
    assert again.read_text(encoding="utf-8") == text  # the same cells: the module (and its date) stay as they were
    assert save.from_kernel(4, {"__name__": "__main__"})[2] is False  # no cell of the lab: nothing overwritten


def test_check_records_results_that_a_last_cell_reads_without_rerunning(mine_folder):
    from autograder.own import parts, save, status

    nb = notebook(5)
    visible = [c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
               if c["metadata"].get("nbgrader", {}).get("grade_id", "").endswith("-visible")]
    outcomes = {gid: ("passed", "") for gid in visible}
    outcomes["engine-visible"] = ("failed", "AssertionError: your engine, p3-top_k: step 5 differs\nmore lines")
    line = save.from_check(REPO / "labs" / "lab05_paged_attention" / "lab05_paged_attention.ipynb", nb, outcomes)
    assert "mine" in line and status.module_path(5).is_file()
    verdicts = {v.part.key: v for v in parts.judge_lab(5, live=False)}
    assert verdicts["gather"].yours is False and "engine-visible failed" in verdicts["gather"].why
    assert "p3-top_k: step 5 differs" in verdicts["block_manager"].why and "more lines" not in verdicts["block_manager"].why


def test_a_notebook_from_outside_the_checkout_leaves_mine_as_it_was(mine_folder, monkeypatch, tmp_path):
    from autograder.own import save, status

    nb = notebook(5)
    outcomes = {c["metadata"]["nbgrader"]["grade_id"]: ("passed", "") for c in nb["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id", "").endswith("-visible")}
    monkeypatch.delenv("MINIENGINE_MINE")
    monkeypatch.setattr(status, "module_path", lambda lab: tmp_path / "mine" / f"lab{lab:02d}.py")
    copy = tmp_path / "cheat" / "lab05_paged_attention.ipynb"
    line = save.from_check(copy, nb, outcomes)
    assert "were not saved" in line and "outside this course checkout" in line and "MINIENGINE_MINE" in line
    assert not (tmp_path / "mine").exists()
    monkeypatch.chdir(tmp_path)  # a kernel started from a copy elsewhere
    with pytest.raises(PermissionError, match="outside this course checkout"):
        save.from_kernel(5, {"__name__": "__main__"})


@pytest.mark.parametrize("lab", [1, 2, 5, 8])  # the four engines: default, contiguous, paged, prefix cache + chunks
def test_every_fallback_engine_serves_the_golden_runs(lab):
    from autograder.own import assemble, report

    llm, refused = assemble.build({}, lab)  # no part of the student's: every fallback at once
    served = report.serve(llm, report.golden_cases()[:3])
    assert served.ok and not refused, served.line()


def test_my_cost_model_prices_with_the_students_lab_03_outside_grading(mine_folder, monkeypatch):
    from autograder import own
    from autograder.own import save, source, status
    from miniengine.cost.roofline import CostModel, llama3_8b

    save.write(3, source.from_notebook(3, notebook(3)))
    model = own.my_cost_model(llama3_8b(), gpu="H100", verbose=False)
    assert model.forward_flops.__code__.co_filename == str(status.module_path(3))
    assert abs(model.forward([1], [1024]).step_time_s - 6.15e-3) < 0.01e-3  # worked example "Batch-1 decode"
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert type(own.my_cost_model(llama3_8b(), verbose=False)) is CostModel


def test_a_lab_id_is_checked():
    from autograder.own import registry

    assert registry.lab_number("lab03") == registry.lab_number("lab03_roofline") == 3
    for bad in ("lab3", "lab11", 0, "roofline"):
        with pytest.raises(ValueError, match="lab"):
            registry.lab_number(bad)


@pytest.mark.parametrize("path", LABS, ids=[p.parent.name for p in LABS])
def test_every_lab_ends_with_the_carry_forward_cell_before_reflect(path):
    """After the lab's last test cell and before Reflect; a cell that shows a lossy part beside it may follow it."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    n = path.parent.name[3:5]
    text = lambda c: "".join(c["source"]).strip()  # noqa: E731
    cells = nb["cells"]
    found = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and text(c) == CELL.format(n=n)]
    assert len(found) == 1, f"{path.name}: expected the carry-forward cell once, for lab{n}, found it {len(found)} times"
    meta = lambda c: c.get("metadata", {}).get("nbgrader", {})  # noqa: E731
    tests = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and meta(c).get("grade") and not meta(c).get("solution")]
    reflect = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and text(c).startswith("## Reflect")]
    assert found[0] > max(tests), f"{path.name}: a test cell follows the carry-forward cell"
    assert reflect and found[0] < reflect[0], f"{path.name}: the Reflect section must follow the carry-forward cell"
