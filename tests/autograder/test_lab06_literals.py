"""Lab 06: the hidden keyed steps hold their inputs only (the answer sheet takes the tokens from the lab's solution);
the tokens they must give, computed once with the task's keys, are kept here, and the solution must give them.
"""
import ast
import json

from miniengine.paths import REPO_ROOT

LAB06 = REPO_ROOT / "labs" / "lab06_speculative_decoding" / "lab06_speculative_decoding.ipynb"
LAB06_HIDDEN_KEYED = {"step 1: 1 draft": [3, 1], "step 2: 2 drafts": [2, 2, 2], "step 3: 2 drafts": [3],
                      "step 4: 3 drafts": [3], "step 5: 3 drafts": [4, 3], "step 6: 4 drafts": [1, 3, 0],
                      "step 7: greedy, 2 drafts": [1], "step 8: greedy, 3 drafts": [0, 4],
                      "step 9: top-k 3 at temperature 0.7, 2 drafts": [1, 3],
                      "step 10: top-k 3 at temperature 0.7, 3 drafts": [4, 0, 3]}


def lab06_cell(grade_id: str) -> str:
    return next("".join(c["source"]) for c in json.loads(LAB06.read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def test_lab06_hidden_keyed_steps_are_inputs_and_the_solution_gives_the_references():
    import numpy as np

    from miniengine.sampling import SamplingParams
    from miniengine.spec.verify import rejection_verify as course

    assign, = [n for n in ast.walk(ast.parse(lab06_cell("keyed-hidden")))
               if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "CASES"]
    cases = ast.literal_eval(assign.value)
    assert all(len(c) == 6 for c in cases), "a hidden keyed step holds its inputs only"
    assert [c[0] for c in cases] == list(LAB06_HIDDEN_KEYED)
    ns: dict = {"__name__": "__main__"}  # the names the solution cell uses, then the solution
    exec("import numpy as np\nfrom miniengine.sampling import STREAM_ACCEPT, STREAM_RESIDUAL, gumbel_noise, "
         "keyed_uniform, sample_token\nfrom miniengine.spec.verify import probs", ns)
    exec(lab06_cell("rejection_verify"), ns)
    for what, p20, q20, drafts, params, first in cases:
        with np.errstate(divide="ignore"):
            logits = np.log(np.asarray(p20, dtype=np.float64) / 20)
        qs = [np.asarray(q, dtype=np.float64) / 20 for q in q20]
        positions = list(range(first, first + len(drafts) + 1))
        for verify in (course, ns["rejection_verify"]):
            got = verify(logits, list(drafts), qs, SamplingParams(**params), positions)
            assert got == LAB06_HIDDEN_KEYED[what], what
