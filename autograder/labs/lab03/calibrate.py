"""Lab 03, the design part: the checks of ``calibrate(rows)``, a cost model fitted to step times measured on the
course's CPU.

``calibrate(rows)`` gets rows of ``miniengine.course.step_times.read_csv`` and returns ``cost_model``;
``cost_model(config)`` (any ``LlamaConfig``) returns an object with ``forward(new_tokens, context).step_time_s``, in
seconds: the plug point ``miniengine.plugs.ForwardCostModel`` that the simulator calls once per engine step.  Graded
by mean absolute percentage error (MAPE) on points ``calibrate`` never saw: whole slices of the grid (a batch size, a
context, a prompt length).  Full points at most the target MAPE, a linear share of them between the target and the
MAPE of the course's baseline (the uncalibrated paper model), none beyond: a missed target does not raise here, the
grader gives the share (autograder/notebook_checks/ledger.py, ``credit``).  A cost model is a function of the shape,
not a table of the three shapes measured, so every check also prices shapes no row was measured on, which must cost
more with more layers or more width.

What each check measured is also handed to the grader (autograder/notebook_checks/ledger.py), which judges it outside the
notebook: the MAPE on the visible slices, the invariants' margins (the smallest ratio of a costlier step to a
cheaper one, the largest change for a near shape) and, for the hidden test, your predicted step times on the
held-out configurations, in the cell's order: the cell holds the configurations only, and the grader's judge
(``lab03-heldout-mape``, autograder/grade/yardsticks.py) reads the measured times from the instructors' held-out file.

Reloaded by ``autograder.labs.lab03`` (see that module); the test cells call these through ``lab03``.
"""
from __future__ import annotations

import dataclasses
import math
import statistics

import autograder.notebook_checks as checks
from autograder.labs.lab03.common import graded, num
from miniengine.course import step_times
from miniengine.model import LlamaConfig

# Shapes no row was measured on: an 8-layer model of width 320 (MHA, tied), and a GQA model with an untied head.
UNMEASURED = {
    "an unmeasured 8-layer model of width 320": LlamaConfig(
        vocab_size=4096, hidden_size=320, intermediate_size=896, num_hidden_layers=8, num_attention_heads=10,
        num_key_value_heads=10, max_position_embeddings=512),
    "an unmeasured GQA model with an untied LM head": LlamaConfig(
        vocab_size=8192, hidden_size=384, intermediate_size=1024, num_hidden_layers=5, num_attention_heads=12,
        num_key_value_heads=4, max_position_embeddings=1024, tie_word_embeddings=False),
}
PROBES = [("decode of 8 at context 128", [1] * 8, [128] * 8), ("a prefill of 2 x 64 tokens", [64, 64], [0, 0]),
          ("a ragged step: a 40-token prompt beside 3 decodes", [40, 1, 1, 1], [0, 30, 200, 90])]


def training_rows() -> list[dict]:
    """The shipped training file, read afresh for every check (a calibrate that changes its rows changes no other)."""
    return step_times.read_csv(step_times.STEP_TIMES)


def model_of(cost_model, config, what: str):
    from miniengine import plugs

    model = cost_model(config)
    assert isinstance(model, plugs.ForwardCostModel), (
        f"cost_model({what}) returned {type(model).__name__}, which has no forward(new_tokens, context): the simulator "
        f"calls model.forward(new_tokens, context).step_time_s once per step")
    return model


def seconds(model, new_tokens, context, what: str) -> float:
    """One step's time as a plain float, positive and finite."""
    step = model.forward(list(new_tokens), list(context))
    assert hasattr(step, "step_time_s"), (f"{what}: forward returned {type(step).__name__}, which has no step_time_s "
                                          f"(seconds)")
    t = num(step.step_time_s, f"{what}: step_time_s")
    assert math.isfinite(t) and t > 0, f"{what}: step_time_s must be a positive number of seconds, got {t!r}"
    return t


def check_shapes(cost_model, prefix: str = "", quote: bool = True):
    """Unmeasured shapes are priced; twice the layers or twice the width costs more; a one-row change costs ~nothing.
    ``quote``: show the text of an exception your code raised (not in a hidden test, where only its type is shown)."""
    shapes = dict(UNMEASURED, **{f"the measured '{name}' shape": cfg for name, cfg in step_times.SHAPES.items()})
    for name, cfg in shapes.items():
        try:
            costlier, near = priced(cost_model, name, cfg, prefix)
            checks.observe(f"{name}: twice the layers or the width over the shape as it is, the smallest time ratio",
                           costlier, at_least=1.0)
            checks.observe(f"{name}: one row larger, the largest relative change of a time", near, at_most=0.01)
        except AssertionError:
            raise
        except Exception as e:
            said = f"{type(e).__name__}: {e!s:.100}" if quote else type(e).__name__
            raise AssertionError(f"{prefix}{name}: your cost model raised {said}; a cost model must price any shape, "
                                 f"not only the three measured") from None


def priced(cost_model, name, cfg, prefix):
    """One shape: each probe priced, a deeper and a wider shape costlier, a shape one row larger the same.  Returns
    the margins, for the grader: (the smallest ratio of a deeper or wider shape's time to the shape's, the largest
    relative change of a time for a shape one row larger)."""
    model = model_of(cost_model, cfg, name)
    ratios, changes = [], []
    for probe, new, ctx in PROBES:
        t = seconds(model, new, ctx, f"{prefix}{name}, {probe}")
        bigger = {"twice the layers": dataclasses.replace(cfg, num_hidden_layers=2 * cfg.num_hidden_layers),
                  "twice the width": dataclasses.replace(cfg, hidden_size=2 * cfg.hidden_size,
                                                         intermediate_size=2 * cfg.intermediate_size)}
        for change, big in bigger.items():
            t_big = seconds(model_of(cost_model, big, change), new, ctx, f"{prefix}{name}, {change}")
            ratios.append(t_big / t)
            assert t_big > t, (
                f"{prefix}{name} with {change}: {probe} must take longer than with the shape as it is; a cost "
                f"model is a function of the shape, not a table of the three shapes measured")
        near = dataclasses.replace(cfg, vocab_size=cfg.vocab_size + 1, intermediate_size=cfg.intermediate_size + 1)
        t_near = seconds(model_of(cost_model, near, "a near shape"), new, ctx, f"{prefix}{name} plus one row")
        changes.append(abs(t_near - t) / t)
        assert abs(t_near - t) <= 0.01 * t, (
            f"{prefix}{name}: {probe} changes by {100 * abs(t_near - t) / t:.1f}% when vocab_size and "
            f"intermediate_size grow by one; near shapes must take near times (no table keyed on the shape)")
    return min(ratios), max(changes)


def errors(cost_model, points) -> list[tuple[float, float, dict]]:
    """(predicted ms, measured ms, row) for each row, priced by cost_model on the row's shape."""
    models, found = {}, []
    for r in points:
        cfg = step_times.row_config(r)
        if r["model"] not in models:
            models[r["model"]] = model_of(cost_model, cfg, f"the '{r['model']}' shape")
        new, ctx = step_times.row_batch(r)
        found.append((1e3 * seconds(models[r["model"]], new, ctx, f"{r['model']}, {r['phase']}"), r["step_ms"], r))
    return found


def mape(found) -> float:
    return statistics.fmean(abs(p - m) / m for p, m, _ in found)


def likely_cause(found) -> str:
    ratio = statistics.median(p / m for p, m, _ in found)
    if ratio > 200:
        return " Likely cause: your times are about 1000x too long: step_time_s is in seconds, step_ms in milliseconds."
    if ratio < 0.005:
        return " Likely cause: your times are about 1000x too short: step_time_s is in seconds, not kiloseconds."
    decode = {}
    for p, _, r in found:
        if r["phase"] == "decode":
            decode.setdefault((r["model"], r["batch"]), []).append(p)
    if decode and all(max(v) - min(v) <= 1e-9 * max(v) for v in decode.values() if len(v) > 1):
        return (" Likely cause: your decode times do not change with the context, yet every step reads every cached "
                "token's K and V.")
    return ""


def by_slice(found, name_of) -> str:
    groups = {}
    for p, m, r in found:
        groups.setdefault(name_of(r), []).append((p, m, r))
    return ", ".join(f"{name} {100 * mape(g):.1f}% ({len(g)} points)" for name, g in groups.items())


def visible_slice_name(r: dict, slices) -> str:
    phase, field, value = next(s for s in slices if r["phase"] == s[0] and r[s[1]] == s[2])
    return f"{phase} at {field} {value}" if phase == "decode" else f"prefill of {value}-token prompts"


def point_row(phase: str, model: str, batch: int, context: int, step_ms: float) -> dict:
    """A row as read_csv gives it, for a point of one of step_times.SHAPES."""
    c = step_times.SHAPES[model]
    return {"phase": phase, "model": model, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_layers": c.num_hidden_layers, "num_heads": c.num_attention_heads, "vocab_size": c.vocab_size,
            "batch": batch, "context": context, "step_ms": step_ms}


def non_decreasing(model, steps, what: str) -> float:
    """steps: (label, new_tokens, context) in the order of more work; each must take at least as long as the last.
    Returns the smallest ratio of a step's time to the last one's (at least 1 - 1e-9 when it holds)."""
    last, smallest = None, math.inf
    for label, new, ctx in steps:
        t = seconds(model, new, ctx, f"{what}, {label}")
        assert last is None or t >= last[1] * (1 - 1e-9), (
            f"{what}: {label} takes {1e3 * t:.3f} ms, less than {last[0]} ({1e3 * last[1]:.3f} ms); more work "
            f"must never take less time")
        if last is not None:
            smallest = min(smallest, t / last[1])
        last = (label, t)
    return smallest


def raises_value_error(fn, names: tuple[str, ...], what: str):
    """fn must raise ValueError naming one of names; observed as what was raised and whether it names the field."""
    try:
        fn()
    except ValueError as e:
        named = any(n in str(e) for n in names)
        checks.observe(f"{what}: the exception raised, and whether it names {' or '.join(names)}",
                       [type(e).__name__, named], expect=["ValueError", True])
        assert named, f"{what}: raised ValueError({str(e)!r:.80}), which does not name {' or '.join(names)}"
        return
    raise AssertionError(f"{what} must raise ValueError naming {' or '.join(names)}; it did not")


def check_interface(calibrate):
    """calibrate on every training row; its cost model on the three measured and two unmeasured shapes: positive
    seconds, never less for more work, costlier for deeper or wider shapes, bad input refused with ValueError, and the
    simulator serving a short workload on it."""
    from miniengine.engine import FCFSPolicy
    from miniengine.serving import simulator as sim

    with graded("your calibrate", calibrate=calibrate):
        raises_value_error(lambda: calibrate([]), ("rows",), "calibrate([]) (no rows to fit)")
        cost_model = calibrate([dict(r) for r in training_rows()])
        assert callable(cost_model), f"calibrate must return cost_model, a function of a config; got {cost_model!r:.60}"
        check_shapes(cost_model)
        shapes = dict(step_times.SHAPES, **UNMEASURED)
        for name, cfg in shapes.items():
            model, what = model_of(cost_model, cfg, name), f"the {name!r} shape" if name in step_times.SHAPES else name
            ratios = []
            for s in (16, 128, 384):
                ratios.append(non_decreasing(model, [(f"decode of {b} at context {s}", [1] * b, [s] * b)
                                                     for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)], what))
            for b in (1, 8, 32):
                ratios.append(non_decreasing(model, [(f"decode of {b} at context {s}", [1] * b, [s] * b)
                                                     for s in (0, 16, 64, 128, 256, 384, 512)], what))
            for b in (1, 4):
                ratios.append(non_decreasing(model, [(f"a prefill of {b} x {t} tokens", [t] * b, [0] * b)
                                                     for t in (1, 16, 64, 256)], what))
            ratios.append(non_decreasing(model, [(f"a prefill of {b} x 64 tokens", [64] * b, [0] * b)
                                                 for b in (1, 2, 4, 8)], what))
            for probe, new, ctx in PROBES:
                more = (probe + " and one more decode", new + [1], ctx + [50])
                ratios.append(non_decreasing(model, [(probe, new, ctx), more], what))
            checks.observe(f"{what}: more work over less (a larger batch, context, prompt or step), the smallest time "
                           f"ratio", min(ratios), at_least=1 - 1e-9)
        model = model_of(cost_model, step_times.SHAPES["tiny"], "the 'tiny' shape")
        raises_value_error(lambda: model.forward([1, 1], [5]), ("new_tokens", "context"),
                           "forward([1, 1], [5]) (one context for two sequences)")
        raises_value_error(lambda: model.forward([0], [5]), ("new_tokens",),
                           "forward([0], [5]) (a sequence feeding 0 tokens)")
        raises_value_error(lambda: model.forward([1], [-1]), ("context",), "forward([1], [-1]) (a negative context)")
        run = sim.simulate(sim.chat_workload(12, 40.0, seed=0, prompt_mean=64, output_mean=16), FCFSPolicy(), model,
                           max_num_seqs=8)
        end = max(t.token_times[-1] for t in run.timelines)
        checks.observe("the simulator on your cost model: requests served", len(run.timelines), expect=12)
        checks.observe("the simulator on your cost model: the last token's time (s)", float(end), at_least=1e-9)
        assert math.isfinite(end) and end > 0, f"the simulator on your cost model ended at {end!r} s"
    print(f"calibrate: interface and invariants hold; the simulator served 12 requests in {end:.2f} simulated s")


def share_words(m: float, max_mape: float, baseline: float | None) -> str:
    """What a MAPE earns, in words: the target met, or the share of the points between the target and the course
    baseline's MAPE (autograder/notebook_checks/ledger.py, ``credit``: full at the target, none at the baseline)."""
    from autograder.notebook_checks.ledger import credit

    if m <= max_mape:
        return f"at most {100 * max_mape:.0f}% earns full points"
    if baseline is None:
        return f"over the {100 * max_mape:.0f}% allowed"
    return (f"over the {100 * max_mape:.0f}% target: {credit(m, at_most=max_mape, baseline=baseline):.0%} of the "
            f"points (full at {100 * max_mape:.0f}%, none from the uncalibrated baseline's {100 * baseline:.0f}%)")


def check_calibration(calibrate, held_out, max_mape, baseline=None):
    """calibrate on the training file less the held_out slices ((phase, field, value)); the MAPE on those slices earns
    full points at most max_mape, a share of them up to the baseline's MAPE.  A missed target does not raise (the
    grader gives the share); a broken interface does.  Shows the worst point: it is in the shipped file."""
    rows = training_rows()
    hidden = [r for r in rows if any(r["phase"] == p and r[f] == v for p, f, v in held_out)]
    fit = [dict(r) for r in rows if r not in hidden]
    with graded("your calibrate", calibrate=calibrate):
        cost_model = calibrate(fit)
        assert callable(cost_model), f"calibrate must return cost_model, a function of a config; got {cost_model!r:.60}"
        check_shapes(cost_model)
        found = errors(cost_model, hidden)
    m = mape(found)
    checks.observe(f"MAPE on the {len(found)} rows calibrate did not see", m, at_most=max_mape, baseline=baseline)
    slices = by_slice(found, lambda r: visible_slice_name(r, held_out))
    p, w, r = max(found, key=lambda f: abs(f[0] - f[1]) / f[1])
    print(f"calibrate, fitted on {len(fit)} training rows: MAPE {100 * m:.1f}% on the {len(found)} rows it did not see "
          f"({slices}); {share_words(m, max_mape, baseline)}."
          + ("" if m <= max_mape else
             f" Worst: {r['model']}, {r['phase']} at batch {r['batch']}, context {r['context']}: predicted {p:.1f} ms, "
             f"measured {w:.1f} ms." + likely_cause(found)))


def check_calibration_hidden(calibrate, held_out: dict, max_mape, baseline=None):
    """calibrate on the whole training file; its predictions on the held-out configurations ({slice: (phase,
    [(shape, batch, context)])}), in that order, go to the grader, whose judge (``lab03-heldout-mape``) compares them
    with the held-out measurements, which never enter the notebook: the MAPE over all the points earns full points at
    most max_mape, a share of them up to the baseline's.  Messages name the slices and the MAPE, never a point."""
    points = [point_row(phase, shape, batch, context, math.nan)
              for phase, pts in held_out.values() for shape, batch, context, *_ in pts]
    head = f"hidden case held-out step times ({len(points)} points, {len(held_out)} slices)"
    with graded("your calibrate", calibrate=calibrate):
        try:
            cost_model = calibrate([dict(r) for r in training_rows()])
            assert callable(cost_model), "calibrate must return cost_model, a function of a config"
            check_shapes(cost_model, quote=False)
            predicted = [p for p, _, _ in errors(cost_model, points)]
        except AssertionError as e:
            raise AssertionError(f"{head}: {e}") from None
        except Exception as e:
            raise AssertionError(f"{head}: your calibrate or cost model raised {type(e).__name__}") from None
    checks.observe(f"{head}: your predicted step_ms, in the cell's order", predicted, at_most=max_mape,
                   baseline=baseline, judge="lab03-heldout-mape")
    print(f"{head}: your {len(predicted)} predictions are handed to the grader, which computes the MAPE (at most "
          f"{100 * max_mape:.0f}% earns full points, a share of them up to the uncalibrated baseline's MAPE)")
