"""Expected values typed into lab test cells stay equal to what the course's own implementation computes.

Lab 03's "your engine" tests compare a simulated serving run on the student's cost model with figures pasted
into the cells (the kernel never computes the expected side, which a student could patch).  Here the same
runs are simulated on miniengine.cost.roofline.CostModel, which tests/test_roofline.py pins to the worked examples.
"""
import ast
import dataclasses
import json

import pytest

from miniengine.serving import metrics, simulator as sim
from miniengine.engine import FCFSPolicy, StaticBatching
from miniengine.model import LlamaConfig
from miniengine.paths import REPO_ROOT
from miniengine.cost.roofline import GPUS, CostModel

LAB03 = REPO_ROOT / "labs" / "lab03_roofline" / "lab03_roofline.ipynb"
LLAMA3_8B = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)
RUNS = {  # the same runs as the cells: model, GPU, workload, policy, seats
    "visible": (LLAMA3_8B, "H100", (40, 2.0, 0), FCFSPolicy, 16),
    "visible_static": (LLAMA3_8B, "H100", (30, 3.0, 1), lambda: StaticBatching(8), 256),
    "hidden_continuous": (dataclasses.replace(LLAMA3_8B, num_key_value_heads=32), "A100-80GB", (30, 1.5, 7), FCFSPolicy, 8),
    "hidden_static": (LLAMA3_8B, "H200", (30, 4.0, 11), lambda: StaticBatching(8), 256),
}


def pasted_expectations() -> dict:
    found = {}
    for cell in json.loads(LAB03.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id", "").startswith("engine-"):
            tree = ast.parse("".join(cell["source"]))
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXPECTED":
                    found.update(ast.literal_eval(node.value))
    return found


@pytest.mark.parametrize("name", sorted(RUNS))
def test_lab03_engine_expectations_match_the_course_cost_model(name):
    cfg, gpu, (n, rate, seed), make_policy, seats = RUNS[name]
    run = sim.simulate(sim.chat_workload(n, rate, seed), make_policy(), CostModel(cfg, GPUS[gpu]), max_num_seqs=seats)
    s = metrics.summarize(run.timelines)
    got = {"last_token_s": max(t.token_times[-1] for t in run.timelines), "ttft_p50_s": s["ttft_p50_s"],
           "tpot_p50_s": s["tpot_p50_s"], "throughput_tok_s": s["throughput_tok_s"]}
    want = pasted_expectations()[name]
    assert set(want) == set(got)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-8), (name, key)


def test_lab03_numbers_match_the_course_cost_model():
    """Lab 03's hidden "numbers you derive" values, computed here with the course's counting and cost model."""
    from miniengine.cost import counting

    found = {}
    for cell in json.loads(LAB03.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id", "").startswith("numbers-") and "HIDDEN" in "".join(cell["source"]):
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "check_answer_values":
                    found.update({k: v[1] for k, v in ast.literal_eval(node.args[1]).items()})
    mha, h100 = dataclasses.replace(LLAMA3_8B, num_key_value_heads=32), GPUS["H100"]

    def limit(cfg, ctx):  # what one more decode sequence adds: FLOPs over bytes
        one, two = counting.decode_cost(cfg, 1, ctx), counting.decode_cost(cfg, 2, ctx)
        return (two.flops - one.flops) / (two.bytes - one.bytes)

    model = CostModel(LLAMA3_8B, h100)
    bound = lambda b, ctx: model.decode(b, ctx).bound == "compute"
    l70 = counting.llama3_70b()
    spec, one = counting.forward_cost(LLAMA3_8B, [5], [1024], logits="all"), counting.forward_cost(LLAMA3_8B, [1], [1024])
    want = {"decode_intensity_limit": limit(LLAMA3_8B, 1024), "decode_intensity_limit_mha": limit(mha, 1024),
            "compute_bound_batch_128": next(b for b in range(1, 1000) if bound(b, 128)),
            "compute_bound_batch_1024": None,  # the limit is under the ridge point with the efficiencies:
            "spec_extra_bytes": spec.bytes - one.bytes,
            "spec_time_ratio": model.step_time(spec) / model.step_time(one),
            "max_batch_70b_int4": CostModel(l70, h100, bytes_per_param=0.5).max_batch(4096),
            "kv_bytes_70b_mha": counting.kv_bytes_per_token(dataclasses.replace(l70, num_key_value_heads=64))}
    assert limit(LLAMA3_8B, 1024) < model.effective_ridge_point and not bound(100_000, 1024)
    assert set(found) == set(want)
    for name, value in want.items():
        assert found[name] == (None if value is None else pytest.approx(value, rel=1e-12)), name


# Lab 04's simulator tests compare a serving run with the student's ContinuousBatching against figures pasted into
# the cells; here the same runs use the course's ContinuousBatching.
LAB04 = REPO_ROOT / "labs" / "lab04_continuous_batching" / "lab04_continuous_batching.ipynb"
LAB04_RUNS = {  # the same runs as the cells: workload (n, rate, seed), GPU, seats, tokens per step
    "visible": ((60, 200.0, 0), "H100", 64, 2304),
    "hidden_a100": ((60, 150.0, 4), "A100-80GB", 32, 3072),
    "hidden_h200": ((60, 200.0, 6), "H200", 64, 2400),
}


def lab04_expectations() -> dict:
    found = {}
    for cell in json.loads(LAB04.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id", "").startswith("sim-"):
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXPECTED":
                    found.update(ast.literal_eval(node.value))
    return found


@pytest.mark.parametrize("name", sorted(LAB04_RUNS))
def test_lab04_simulator_expectations_match_the_course_policy(name):
    from miniengine.engine import ContinuousBatching
    from miniengine.cost.roofline import llama3_8b

    work, gpu, seats, tokens = LAB04_RUNS[name]
    run = sim.simulate(sim.chat_workload(*work), ContinuousBatching(), CostModel(llama3_8b(), GPUS[gpu]),
                       max_num_seqs=seats, max_num_batched_tokens=tokens)
    s = metrics.summarize(run.timelines)
    want = lab04_expectations()[name]
    for key in want:
        assert s[key] == pytest.approx(want[key], rel=1e-8), (name, key)


# Lab 07's GQA engine tests compare the student-converted model's tokens with the float64 reference's tokens on
# gqa.convert(target, 2) (mean-pooled, not uptrained), pasted into the cells.  Here they are computed again, with
# the same screening as the golden files, from the course's conversion.
LAB07 = REPO_ROOT / "labs" / "lab07_gqa_and_quantization" / "lab07_gqa_and_quantization.ipynb"


def lab07_converted() -> dict:
    found = {}
    for cell in json.loads(LAB07.read_text())["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id", "")
        if gid.startswith("engine-"):
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CONVERTED":
                    found[gid] = ast.literal_eval(node.value)
    return found


# The hidden engine test no longer holds reference tokens (hidden outputs stay out of the kernel); it checks the
# student's converted weights are the group means instead, and the course's engine makes the tokens from them.
@pytest.mark.parametrize("grade_id", ["engine-visible"])
def test_lab07_converted_tokens_are_the_references(grade_id, target):
    from miniengine.course import golden
    from miniengine.gqa import convert
    from miniengine.tokenizer import load_tokenizer
    from miniengine.paths import TARGET

    pasted = lab07_converted()[grade_id]
    hidden = grade_id.endswith("hidden")
    prompts = json.loads(golden.HIDDEN_PROMPTS_FILE.read_text())["prompts"] if hidden else golden.VISIBLE_PROMPTS
    cases = golden.build_cases(convert(target, 2), load_tokenizer(TARGET), prompts, target.config.eos_token_id,
                               seed_base=golden.HIDDEN_SEED_BASE if hidden else 0, kinds=golden.QUANT_KINDS)
    fresh = {c["name"]: (c["prompt_token_ids"], c["token_ids"]) for c in cases}
    assert len(pasted) >= 12
    for name, prompt, params, tokens in pasted:
        assert fresh[name] == (prompt, tokens), name


# Lab 01: the bigram cases pasted into beam_search's test cells are the design reference's beams, and the graded
# numbers' hidden values are what their formulas give for the target model.
LAB01 = REPO_ROOT / "labs" / "lab01_naive_decode" / "lab01_naive_decode.ipynb"


class _Recorder:
    """Stands in for `lab` when a test cell is run here: records every call made through it."""

    def __init__(self, calls, name=""):
        self.calls, self.name = calls, name

    def __getattr__(self, attr):
        return _Recorder(self.calls, f"{self.name}.{attr}".lstrip("."))

    def __call__(self, *args, **kwargs):
        self.calls.append((self.name, args, kwargs))
        return _Recorder(self.calls, self.name + "()")


def lab01_calls(grade_id: str) -> list:
    cell = next(c for c in json.loads(LAB01.read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    source = "".join(ln for ln in cell["source"] if "importlib" not in ln)  # the harness: the recorder instead
    calls: list = []
    exec(source, {"lab": _Recorder(calls), "beam_search": None, "globals": lambda: {}})
    return calls


def lab01_solution(grade_id: str, namespace: dict) -> dict:
    """Run the lab's own answer cell ``grade_id`` (its solution) in ``namespace``; returns the namespace."""
    cell = next(c for c in json.loads(LAB01.read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    exec("".join(cell["source"]), namespace)
    return namespace


def test_lab01_visible_bigram_beams_are_the_references():
    from autograder.design.lab01 import beam_search
    from autograder.labs.lab01_beams import BigramModel

    (_, (_, cases), _), = [c for c in lab01_calls("design-beams-visible") if c[0] == "check_beams_bigram"]
    assert len(cases) >= 4
    for table, prompt, p, want in cases:
        got = beam_search(BigramModel(table), prompt, p["beam_width"], p["max_tokens"], p["length_penalty"],
                          p["eos_token_id"])
        assert [ids for ids, _ in got] == [ids for ids, _ in want], (prompt, p)
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6), (prompt, p)


def test_lab01_hidden_bigram_beams_of_the_solution_are_the_references():
    """The hidden cell holds inputs only; the answer sheet takes its beams from the lab's solution, so the solution
    must give the float64 reference's beams on them (autograder/sheets.py)."""
    import numpy as np
    import torch

    from autograder.design.lab01 import beam_search as reference
    from autograder.labs.lab01_beams import BigramModel
    from miniengine.attention import NoCacheBackend

    (_, (_, cases), kwargs), = [c for c in lab01_calls("design-beams-hidden") if c[0] == "check_beams_bigram"]
    assert kwargs == {"hidden": True} and len(cases) >= 4 and all(len(c) == 3 for c in cases)
    solution = lab01_solution("design-beam-search", {"torch": torch, "np": np, "NoCacheBackend": NoCacheBackend})
    for table, prompt, p in cases:
        args = (BigramModel(table), prompt, p["beam_width"], p["max_tokens"], p["length_penalty"], p["eos_token_id"])
        want, got = reference(*args), solution["beam_search"](*args)
        assert [ids for ids, _ in got] == [ids for ids, _ in want], (prompt, p)
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6), (prompt, p)


def test_lab01_numbers_of_the_solution_are_what_their_formulas_give():
    """The hidden numbers test reports the student's values; the sheet takes the right ones from the solution."""
    from miniengine.model import load_model
    from miniengine.paths import TARGET

    model = load_model(TARGET)
    (_, (_, tolerances), _), = [c for c in lab01_calls("numbers") if c[0] == "report_numbers"]
    got = lab01_solution("numbers-answers", {"model": model})
    assert {name: got[name] for name in tolerances} == {
        "tokens_naive": sum(100 + t for t in range(1000)), "tokens_once": 100 + 999,
        "kv_bytes_per_token": model.config.kv_bytes_per_token(4), "beam_tokens": 10 + 4 * sum(10 + t for t in range(1, 16))}
