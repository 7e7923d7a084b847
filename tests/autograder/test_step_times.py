"""The measured step times behind Lab 03's design part: the files, their split, and the threshold's power.

data/step_times/cpu.csv (shipped, training) and autograder/hidden/step_times_heldout.csv (instructors only) are one
measured grid split by whole slices (autograder/qa/design/lab03.py).  Here: the CSV round trip, the split (no overlap,
the whole grid, the held-out slices only), the hidden cell's configurations equal to the held-out file's, in the
order the grader's judge reads them (the cell holds no measured time: the judge, outside the kernel, reads them from
the file), the shipped file never naming the held-out slices, every honest design under the threshold with margin and
the course's baseline at or beyond its zero-credit MAPE, and the lab's own solution and planted bugs run through the
harness in-process and judged as the grader judges them, partial credit included (what verify and a grader do in
minutes, in a second).
"""
from __future__ import annotations

import ast
import json

import pytest

from autograder.qa.design import lab03 as design
from miniengine.course import step_times
from miniengine.paths import REPO_ROOT

LAB = REPO_ROOT / "labs" / "lab03_roofline" / "lab03_roofline.ipynb"
KEY = ("phase", "model", "batch", "context")


def cells() -> dict[str, str]:
    return {c["id"]: "".join(c["source"]) for c in json.loads(LAB.read_text(encoding="utf-8"))["cells"]}


def call_keywords(source: str, name: str) -> dict:
    """The literal keyword arguments (and a HELD_OUT assignment) of the harness call ``lab.<name>(...)`` in a cell."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == name:
            found.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "HELD_OUT":
            found["HELD_OUT"] = ast.literal_eval(node.value)
    return found


def test_read_csv_round_trip(tmp_path):
    rows = step_times.read_csv(step_times.STEP_TIMES)
    path = tmp_path / "copy.csv"
    step_times.write_csv(rows, path, "first line\nsecond line")
    assert step_times.read_csv(path) == rows
    assert step_times.read_notes(path) == ["first line", "second line"]
    point = step_times.Point("decode", "tiny", 2, 70, 9.38041)
    step_times.write_csv([point], path, "one point")
    assert step_times.read_csv(path) == [point.row() | {"step_ms": 9.3804}]


def test_a_row_gives_back_the_shape_and_the_pass_it_timed():
    for r in step_times.read_csv(step_times.STEP_TIMES):
        assert step_times.row_config(r) == step_times.SHAPES[r["model"]]
        new, ctx = step_times.row_batch(r)
        B, c = r["batch"], r["context"]
        assert (new, ctx) == (([1] * B, [c] * B) if r["phase"] == "decode" else ([c] * B, [0] * B))
    with pytest.raises(ValueError, match="phase"):
        step_times.row_batch({"phase": "verify", "batch": 1, "context": 1})


def test_the_split_holds_out_whole_slices_and_nothing_else():
    train, held = design.load()
    keys = lambda rows: [tuple(r[k] for k in KEY) for r in rows]
    assert not set(keys(train)) & set(keys(held)), "a point is both trained on and held out"
    assert len(set(keys(train))) == len(train) and len(set(keys(held))) == len(held)
    grid = len(step_times.SHAPES) * (len(step_times.DECODE_BATCHES) * len(step_times.DECODE_CONTEXTS)
                                     + len(step_times.PREFILL_BATCHES) * len(step_times.PREFILL_LENGTHS))
    assert len(train) + len(held) == grid == 153
    assert all(design.in_slices(r, design.HELD_OUT) for r in held)
    assert not any(design.in_slices(r, design.HELD_OUT) for r in train)
    every = {(m, p) for m in step_times.SHAPES for p in ("decode", "prefill")}
    assert {(r["model"], r["phase"]) for r in held} == every
    # The training file says how it was measured, and that slices are held out, never which (it ships).
    notes = " ".join(step_times.read_notes(step_times.STEP_TIMES))
    for fact in ("one torch thread", "median", "torch 2.13", "AMD EPYC", "slices held out"):
        assert fact.lower() in notes.lower(), fact
    for named in ("batch 24", "context 262", "128-token", "prompts of 128"):
        assert named not in notes, f"the shipped training file names a held-out slice: {named!r}"


def test_the_hidden_cell_holds_the_held_out_configurations_in_the_judge_s_order_and_the_cells_the_threshold():
    from autograder.grade import yardsticks

    _, held = design.load()
    source = cells()
    hidden = call_keywords(source["design-mape-hidden"], "check_calibration_hidden")
    listed = [(phase, *p) for name, (phase, pts) in hidden["HELD_OUT"].items() for p in pts]
    assert all(len(p) == 4 for p in listed), "the hidden cell holds configurations only, never a measured time"
    # The judge reads the held-out file, slice by slice in the cell's order: prediction i is priced against row i.
    assert yardsticks.LAB03_SLICES == design.HELD_OUT
    judged = yardsticks.lab03_heldout_rows()
    assert listed == [tuple(r[k] for k in KEY) for r in judged]
    point = lambda r: tuple(r[k] for k in KEY)  # noqa: E731
    assert sorted(judged, key=point) == sorted(held, key=point)  # the rows read_csv gives, in the judge's order
    for name, (phase, pts) in hidden["HELD_OUT"].items():
        assert {design.slice_name(design_row(phase, (*p, 1.0))) for p in pts} == {name}
    assert [yardsticks.lab03_slice_name(r) for r in judged] == [design.slice_name(r) for r in judged]
    visible = call_keywords(source["design-mape-visible"], "check_calibration")
    assert [tuple(s) for s in visible["held_out"]] == list(design.VISIBLE)
    assert visible["max_mape"] == hidden["max_mape"] == design.THRESHOLD
    assert visible["baseline"] == design.BASELINE_MAPE["design-mape-visible"]
    assert hidden["baseline"] == design.BASELINE_MAPE["design-mape-hidden"]
    assert f"{100 * design.THRESHOLD:.0f}%" in source["design-intro"]


def design_row(phase, point):
    from autograder.labs.lab03.calibrate import point_row

    return point_row(phase, *point)


def test_every_honest_design_passes_with_margin_and_the_baseline_earns_nothing():
    from autograder.qa.design.lab03_designs import designs

    found = design.report(out=lambda line: None)  # (train, visible, held out) MAPE of each fit
    honest = list(designs(None, None, None))
    assert len(honest) >= 3
    for name in honest:  # 4 points of margin: one measurement's repeat noise moves a MAPE by 1 to 2
        assert max(found[name][1:]) <= design.THRESHOLD - 0.04, (name, found[name])
    baseline = found["baseline: " + design.BASELINE_NAME]
    assert baseline[1] >= design.BASELINE_MAPE["design-mape-visible"] >= design.THRESHOLD + 0.15, baseline
    assert baseline[2] >= design.BASELINE_MAPE["design-mape-hidden"] >= design.THRESHOLD + 0.15, baseline
    assert found["nearest training row (a lookup)"][2] > design.THRESHOLD


# ---------------------------------------------------------------- the lab's solution and planted bugs, in-process

TASKS = ("param_count", "kv_bytes_per_token", "forward_flops", "forward_bytes", "step_time", "design-calibrate")


def notebook_namespace(**edits) -> dict:
    """The lab's solution cells run as a notebook runs them (``__main__``), with ``old -> new`` source edits."""
    import dataclasses  # noqa: F401  (the setup cell's imports)

    import numpy as np

    ns = {"__name__": "__main__", "np": np, "step_times": step_times, "math": __import__("math")}
    source = cells()
    for cell in TASKS:
        text = source[cell]
        for old, new in edits.get(cell.replace("-", "_"), []):
            assert old in text, old
            text = text.replace(old, new)
        exec(compile(text, f"<cell {cell}>", "exec"), ns)
    return ns


VISIBLE_TARGET = dict(max_mape=design.THRESHOLD, baseline=design.BASELINE_MAPE["design-mape-visible"])
HIDDEN_TARGET = dict(max_mape=design.THRESHOLD, baseline=design.BASELINE_MAPE["design-mape-hidden"])


def judged_visible(lab, calibrate) -> tuple[object, str]:
    """design-mape-visible as the grader judges it: (verdicts.compare's answer on its MAPE row, what the cell
    printed); a missed target does not raise in the kernel."""
    import contextlib
    import io

    from autograder.grade import verdicts
    from autograder.notebook_checks import ledger

    del ledger._rows[:]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        lab.check_calibration.__wrapped__(calibrate, held_out=list(design.VISIBLE), **VISIBLE_TARGET)
    (row,) = [r for r in ledger.pending() if r["label"].startswith("MAPE")]
    del ledger._rows[:]
    return verdicts.compare(row["value"], row, hidden=False), out.getvalue()


def held_out_cases():
    return call_keywords(cells()["design-mape-hidden"], "check_calibration_hidden")["HELD_OUT"]


def judged_hidden(lab, calibrate):
    """design-mape-hidden as a grading run makes it: the harness's observation of calibrate's predictions on the
    cell's configurations (in-process, not handed out), judged as the grader judges it: None, or (the share of the
    points, the message)."""
    from autograder.grade import yardsticks
    from autograder.notebook_checks import ledger

    del ledger._rows[:]
    lab.check_calibration_hidden.__wrapped__(calibrate, held_out_cases(), **HIDDEN_TARGET)
    rows = [r for r in ledger.pending() if r.get("judge")]
    del ledger._rows[:]
    (row,) = rows
    assert row["judge"] == "lab03-heldout-mape" and row["at_most"] == design.THRESHOLD
    assert row["baseline"] == design.BASELINE_MAPE["design-mape-hidden"]
    assert len(row["value"]) == sum(len(pts) for _, pts in held_out_cases().values())
    return yardsticks.JUDGES[row["judge"]](row["value"], row)


@pytest.fixture(scope="module")
def lab():
    import importlib

    import autograder.labs

    return importlib.reload(autograder.labs).pristine("lab03")


def test_the_lab_solution_passes_every_design_check(lab, capsys):
    calibrate = notebook_namespace()["calibrate"]
    lab.check_interface(calibrate)
    verdict, printed = judged_visible(lab, calibrate)
    assert verdict is None and "earns full points" in printed, printed
    assert judged_hidden(lab, calibrate) is None


def test_the_judge_names_the_slices_and_no_measured_time():
    from autograder.grade import yardsticks

    rows = yardsticks.lab03_heldout_rows()
    row = {"label": "held-out", "at_most": design.THRESHOLD, "judge": "lab03-heldout-mape"}
    assert yardsticks.lab03_heldout_mape([r["step_ms"] for r in rows], row) is None  # the measurements themselves
    off = [1.4 * r["step_ms"] for r in rows]  # 40% off everywhere
    message = yardsticks.lab03_heldout_mape(off, row)
    assert message.startswith("held-out: MAPE 40.0%, over the 25% allowed; by slice: decode at batch 24 40.0% "
                              "(15 points), decode at context 262 40.0% (18 points), prefill of 128-token prompts "
                              "40.0% (12 points).")
    assert not any(f"{r['step_ms']}" in message or f"{1.4 * r['step_ms']:.1f}" in message for r in rows)
    # With the baseline's MAPE, a share between the target and it: (54 - 40) / (54 - 25) of the points.
    share, words = yardsticks.lab03_heldout_mape(off, dict(row, baseline=0.54))
    assert share == pytest.approx(14 / 29) and "48% of the points" in words and "decode at batch 24 40.0%" in words
    far = [0.3 * r["step_ms"] for r in rows]  # 70% off: beyond the baseline's MAPE, nothing
    assert yardsticks.lab03_heldout_mape(far, dict(row, baseline=0.54))[0] == 0.0
    assert "expected 45 predictions" in yardsticks.lab03_heldout_mape(off[:-1], row)
    assert "positive, finite" in yardsticks.lab03_heldout_mape(off[:-1] + ["nan"], row)


FIT = "L, d = config.num_hidden_layers, config.hidden_size"
BUGS = {  # planted bug: (edits of the solution's calibrate cell, words the messages hold, the most it earns visible,
    #                      hidden): a missed target earns a share of the points, measured here
    "milliseconds, not seconds": ([('measured = np.array([r["step_ms"] / 1e3', 'measured = np.array([r["step_ms"]')],
                                  "about 1000x too long", 0.0, 0.0),
    "a prompt priced as one token": ([(FIT, FIT + "\n        new_tokens = [1] * len(new_tokens)")],
                                     "prefill of", 0.0, 0.75),  # 76% off on 64-token prompts, 33% over all held out
    "the batch priced as one sequence": ([(FIT, FIT + "\n        new_tokens, context = new_tokens[:1], context[:1]")],
                                         "decode at batch", 0.0, 0.25),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_bug_earns_at_most_its_share_with_a_cause(lab, bug):
    edits, words, visible_most, hidden_most = BUGS[bug]
    calibrate = notebook_namespace(design_calibrate=edits)["calibrate"]
    verdict, printed = judged_visible(lab, calibrate)  # no exception: the grader gives the share
    assert verdict is not None and verdict[0] <= visible_most, verdict  # (share, message): a target missed
    assert "MAPE" in printed and words in printed and "of the points" in printed, printed
    hidden_share, message = judged_hidden(lab, calibrate)  # the kernel cannot tell: it has no measured time
    assert hidden_share <= hidden_most, (hidden_share, message)
    assert message.startswith("hidden case ") and words in message and "decode at batch 24" in message
    from autograder.grade import yardsticks

    assert not any(f"{r['step_ms']}" in message for r in yardsticks.lab03_heldout_rows())


def test_a_table_of_the_training_rows_is_refused(lab):
    ns = {"__name__": "__main__"}
    exec(compile('''
def calibrate(rows):
    """A lookup: the nearest training row of the same shape and phase."""
    if not rows:
        raise ValueError("rows: none")
    class Step:
        def __init__(self, s):
            self.step_time_s = s
    def cost_model(config):
        class Lookup:
            def forward(self, new_tokens, context):
                phase = "prefill" if context[0] == 0 and new_tokens[0] > 1 else "decode"
                length = new_tokens[0] if phase == "prefill" else context[0]
                same = [r for r in rows if r["phase"] == phase and r["hidden_size"] == config.hidden_size
                        and r["num_layers"] == config.num_hidden_layers]
                best = min(same, key=lambda r: abs(r["batch"] - len(new_tokens)) + abs(r["context"] - length) / 12)
                return Step(best["step_ms"] / 1e3)
        return Lookup()
    return cost_model
''', "<cell design-calibrate>", "exec"), ns)
    with pytest.raises(AssertionError, match="must price any shape"):  # an unmeasured shape has no rows
        lab.check_calibration(ns["calibrate"], held_out=list(design.VISIBLE), max_mape=design.THRESHOLD)
    refused = r"^hidden case held-out .*: your cost model raised ValueError; a cost model must price any shape"
    with pytest.raises(AssertionError, match=refused) as hidden:
        lab.check_calibration_hidden(ns["calibrate"], held_out_cases(), max_mape=design.THRESHOLD)
    assert "empty sequence" not in str(hidden.value)  # the text of your exception is not shown in a hidden test
