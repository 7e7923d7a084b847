"""Lab 04's visible simulator test compares a serving run with the student's ContinuousBatching against figures pasted
into the cell; here the same runs use the course's ContinuousBatching.  The hidden cells hold their inputs only (the
answer sheet takes the expected values from the solution): their answers are pinned here, where the solution's
observations, made by the harness as a grading run makes them, must give them.
"""
import ast
import json

import pytest
from lab_literals import cell_calls, observed

from miniengine.cost.roofline import GPUS, CostModel
from miniengine.paths import REPO_ROOT
from miniengine.serving import metrics, simulator as sim

LAB04 = REPO_ROOT / "labs" / "lab04_continuous_batching" / "lab04_continuous_batching.ipynb"
LAB04_RUNS = {  # the same runs as the cells: workload (n, rate, seed), GPU, seats, tokens per step
    "visible": ((60, 200.0, 0), "H100", 64, 2304),
    "hidden_a100": ((60, 150.0, 4), "A100-80GB", 32, 3072),
    "hidden_h200": ((60, 200.0, 6), "H200", 64, 2400),
}
# The hidden simulator runs' figures: computed once by the same simulation with the course's ContinuousBatching.
LAB04_HIDDEN_SIM = {
    "hidden_a100": {"goodput_req_s": 1.687019152, "slo_attainment": 0.55, "throughput_tok_s": 783.594835,
                    "ttft_p99_s": 3.393244165, "tpot_p50_s": 0.01351380508},
    "hidden_h200": {"goodput_req_s": 11.68768271, "slo_attainment": 1.0, "throughput_tok_s": 2307.148568,
                    "ttft_p99_s": 0.4465350621, "tpot_p50_s": 0.006666112908}}
# The hidden hand-built cases' answers, in the cells' order (fits: True/False; admit: the positions admitted).
LAB04_HIDDEN_ANSWERS = {
    "fits-hidden": [True, False, False, True, False, False],
    "admit-hidden": [[0, 1, 2, 3, 4, 5], [0, 1, 2], [0, 1], [], [0, 1], [0, 1], [], [0]],
    "static-hidden": [[0], [], [0], [], [0, 1, 2], [], [0, 1, 2], [0]]}


def lab04_cells() -> dict[str, str]:
    return {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"])
            for c in json.loads(LAB04.read_text())["cells"]}


def lab04_expectations() -> dict:
    found = dict(LAB04_HIDDEN_SIM)
    for gid, source in lab04_cells().items():
        if (gid or "").startswith("sim-"):
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXPECTED":
                    found.update(ast.literal_eval(node.value))
    return found


@pytest.mark.parametrize("name", sorted(LAB04_RUNS))
def test_lab04_simulator_expectations_match_the_course_policy(name):
    from miniengine.cost.roofline import llama3_8b
    from miniengine.engine import ContinuousBatching

    work, gpu, seats, tokens = LAB04_RUNS[name]
    run = sim.simulate(sim.chat_workload(*work), ContinuousBatching(), CostModel(llama3_8b(), GPUS[gpu]),
                       max_num_seqs=seats, max_num_batched_tokens=tokens)
    s = metrics.summarize(run.timelines)
    want = lab04_expectations()[name]
    for key in want:
        assert s[key] == pytest.approx(want[key], rel=1e-8), (name, key)


@pytest.fixture(scope="module")
def lab04():
    """(the harness, the solution's namespace: the setup cells and the answer cells of the lab, run here)."""
    import importlib

    import autograder.labs

    lab = importlib.reload(autograder.labs).pristine("lab04")
    cells = json.loads(LAB04.read_text())["cells"]
    ns = {"__name__": "__main__"}
    for c in cells:  # the parameters, the imports, then fits, ContinuousBatching and StaticBatching
        gid = c["metadata"].get("nbgrader", {}).get("grade_id")
        src = "".join(c["source"])
        if c["cell_type"] == "code" and (gid in ("fits", "ContinuousBatching", "StaticBatching")
                                         or src.startswith(("# Parameters", "import os"))):
            exec(compile(src, f"<cell {gid}>", "exec"), ns)
    return lab, ns


def lab04_calls(lab04, grade_id: str) -> list:
    lab, ns = lab04
    return cell_calls(lab, ns, lab04_cells()[grade_id])


@pytest.mark.parametrize("grade_id", sorted(LAB04_HIDDEN_ANSWERS) + ["sim-hidden"])
def test_lab04_hidden_cells_hold_inputs_and_the_solution_gives_the_answers(lab04, grade_id):
    lab, ns = lab04
    (name, args, kwargs), = lab04_calls(lab04, grade_id)
    source = lab04_cells()[grade_id]
    assert "EXPECTED" not in source and "import" in source  # inputs only
    rows = observed(getattr(lab, name), *args, **kwargs)
    if grade_id == "sim-hidden":
        runs = args[2]
        assert all(len(run) == 5 for run in runs), "a hidden run holds its inputs only"
        for run, k in zip(runs, sorted(LAB04_HIDDEN_SIM), strict=True):
            got = {key: rows[f"{run[0]}: {key}"] for key in LAB04_HIDDEN_SIM[k]}
            assert got == pytest.approx(LAB04_HIDDEN_SIM[k], rel=1e-8), k
        return
    answers = [v for label, v in rows.items() if not label.endswith(("itself", "admitted batch"))]
    assert answers == LAB04_HIDDEN_ANSWERS[grade_id]
    width = {"fits-hidden": 5, "admit-hidden": 6, "static-hidden": 9}[grade_id]
    assert all(len(case) == width for case in args[1]), "a hidden case holds its inputs only"
