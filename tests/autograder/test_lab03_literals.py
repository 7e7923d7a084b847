"""Lab 03: expected values typed into its test cells stay equal to what the course's own implementation computes.

Its "your engine" tests compare a simulated serving run on the student's cost model with figures pasted
into the visible cell (the kernel never computes the expected side, which a student could patch).  Here the same
runs are simulated on miniengine.cost.roofline.CostModel, which tests/engine/test_roofline.py pins to the worked examples.
Lab 03's hidden cells hold their inputs only (the answer sheet takes the expected values from the solution,
autograder/grade/sheets.py): here the solution's observations on those inputs, made by the harness as a grading run makes
them, are compared with the same course cost model.
"""
import dataclasses
import json

import pytest
from lab_literals import LLAMA3_8B, cell_calls, observed

from miniengine.cost.roofline import GPUS, CostModel
from miniengine.paths import REPO_ROOT
from miniengine.serving import metrics, simulator as sim

LAB03 = REPO_ROOT / "labs" / "lab03_roofline" / "lab03_roofline.ipynb"
# Lab 03's answer cells, run in this order after the setup cell to give the solution's functions and answers.
LAB03_ANSWERS = ("param_count", "kv_bytes_per_token", "forward_flops", "forward_bytes", "step_time", "ridge_point",
                 "kv_capacity_tokens", "max_batch", "numbers")
ENGINE_KEYS = ("last_token_s", "ttft_p50_s", "tpot_p50_s", "throughput_tok_s")


def lab03_sources() -> dict[str, str]:
    return {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") or c.get("id"): "".join(c["source"])
            for c in json.loads(LAB03.read_text())["cells"]}


@pytest.fixture(scope="module")
def lab03():
    """(the harness, the solution's namespace: the setup cell and the answer cells of the lab, run here)."""
    import importlib

    import autograder.labs

    lab = importlib.reload(autograder.labs).pristine("lab03")
    sources, ns = lab03_sources(), {"__name__": "__main__"}
    for gid in ("setup",) + LAB03_ANSWERS:
        exec(compile(sources[gid], f"<cell {gid}>", "exec"), ns)
    return lab, ns


def lab03_calls(lab03, grade_id: str) -> list:
    """The harness calls test cell ``grade_id`` makes, its names bound to the solution's (the cell's own inputs)."""
    lab, ns = lab03
    return cell_calls(lab, ns, lab03_sources()[grade_id])


def course_run(cfg, gpu: str, work: dict, policy, seats: int) -> dict:
    run = sim.simulate(sim.chat_workload(work["n"], work["rate"], work["seed"]), policy, CostModel(cfg, GPUS[gpu]),
                       max_num_seqs=seats)
    s = metrics.summarize(run.timelines)
    return {"last_token_s": max(t.token_times[-1] for t in run.timelines), "ttft_p50_s": s["ttft_p50_s"],
            "tpot_p50_s": s["tpot_p50_s"], "throughput_tok_s": s["throughput_tok_s"]}


@pytest.mark.parametrize("grade_id", ["engine-visible", "engine-hidden"])
def test_lab03_engine_figures_are_the_course_cost_model(lab03, grade_id):
    """The visible cell's pasted figures, and the solution's figures on the hidden cell's runs (the sheet's expected
    values: the hidden cell holds its runs only), are the same runs simulated on the course's CostModel."""
    lab, _ = lab03
    (name, (ff, fb, st, runs), _), = lab03_calls(lab03, grade_id)
    assert name == "check_engine" and len(runs) == 2
    hidden = grade_id.endswith("hidden")
    assert all(len(run) == (6 if hidden else 7) for run in runs), "a hidden run holds its inputs only"
    solution = observed(lab.check_engine, ff, fb, st, runs)
    assert len(solution) == 4 * len(runs)
    fresh = lab03_calls(lab03, grade_id)[0][1][3]  # the same runs, with policies that have served nothing yet
    for label, cfg, gpu, work, policy, seats, *want in fresh:
        course = course_run(cfg, gpu, work, policy, seats)
        for key in ENGINE_KEYS:
            assert solution[f"{label}: {key}"] == pytest.approx(course[key], rel=1e-8), (label, key)
            if want:
                assert want[0][key] == pytest.approx(course[key], rel=1e-8), (label, key)


def test_lab03_numbers_of_the_solution_match_the_course_cost_model(lab03):
    """Lab 03's hidden "numbers you derive" cells hold tolerances only; the sheet takes the right values from the
    solution's answer cell, which must give what the course's counting and cost model give."""
    from miniengine.cost import counting

    lab, ns = lab03
    got = {}
    for gid in ("numbers-roofline-hidden", "numbers-memory-hidden"):
        (name, (namespace, tolerances), _), = lab03_calls(lab03, gid)
        assert name == "report_answer_values" and all(len(t) == 2 for t in tolerances.values()), gid
        values = observed(lab.report_answer_values, namespace, tolerances)
        got |= {label.split(" ")[0]: value for label, value in values.items()}
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
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name] == (None if value is None else pytest.approx(value, rel=1e-12)), name


def _gpu(d: dict):
    from miniengine.cost.hardware import GPU

    return GPU(d["name"], d["peak_flops"], d["bandwidth"], d["memory"])


def _course_figures(name: str, args: tuple) -> list:
    """What the course's cost model gives on a hidden cell's inputs, in the order the harness observes them."""
    from types import SimpleNamespace

    from miniengine.cost import counting

    if name == "check_param_count_exact":
        return [counting.param_count(cfg) for _, cfg in args[1]]
    if name == "check_kv_bytes_exact":
        return [counting.kv_bytes_per_token(cfg, bpv) for _, cfg, bpv in args[1]]
    if name == "check_flops_exact":
        return [counting.forward_cost(cfg, new, ctx, logits=lg).flops for _, cfg, new, ctx, lg in args[1]]
    if name == "check_bytes_exact":
        return [counting.forward_cost(cfg, new, ctx, bytes_per_param=bpp, bytes_per_value=bpv).bytes
                for _, cfg, new, ctx, bpp, bpv in args[1]]
    if name == "check_ridge_and_step_exact":
        ridges, times, passes = args[4:]
        ideal = dict(compute_eff=1.0, bandwidth_eff=1.0)
        return ([CostModel(LLAMA3_8B, _gpu(g), **(ideal | kw)).effective_ridge_point for g, kw in ridges]
                + [float(CostModel(LLAMA3_8B, _gpu(g), **kw).step_time(SimpleNamespace(flops=F, bytes=B)))
                   for F, B, g, kw in times]
                + [CostModel(cfg, _gpu(g), **kw).forward(new, ctx).step_time_s for _, cfg, g, new, ctx, kw in passes])
    if name == "check_memory_exact":
        return [x for _, cfg, g, kw, ctx in args[2]
                for model in [CostModel(cfg, _gpu(g), **kw)] for x in (model.kv_capacity_tokens, model.max_batch(ctx))]
    raise AssertionError(f"no course figures for {name}")


@pytest.mark.parametrize("grade_id", ["param-count-hidden", "kv-bytes-hidden", "flops-hidden", "bytes-hidden",
                                      "step-time-hidden", "memory-hidden"])
def test_lab03_hidden_cells_hold_inputs_and_the_solution_gives_the_course_figures(lab03, grade_id):
    """Lab 03's other hidden cells hold their cases' inputs only; the sheet takes the expected values from the
    solution, whose observations on those inputs must be the course's cost model's figures."""
    lab, _ = lab03
    (name, args, kwargs), = lab03_calls(lab03, grade_id)
    solution = list(observed(getattr(lab, name), *args, **kwargs).values())
    course = _course_figures(name, args if not kwargs else args + tuple(kwargs.values()))
    assert len(solution) == len(course) > 0
    for got, want in zip(solution, course):
        if isinstance(want, int):  # a count: exactly (a float where the harness takes one: kv_bytes_per_token)
            assert got == want
        else:
            assert got == pytest.approx(want, rel=1e-9)
