"""Lab 07, Task 2: Int4GroupWise, checked against the lab's quantizer written out as a formula (scales, codes,
dequantize, the error bound, the row lookup), and its group sizes. Reloaded by ``autograder.labs.lab07``.

Besides its assertions, each check ``observe``s what it measured of your scheme (autograder/notebook_checks/ledger.py), for the
grader to judge outside the notebook: the state's layout, then how many scales, codes, dequantized entries and looked-up
rows break the formula (none may) and the largest error in steps (a code may round either way at a tie, so counts, not
the codes themselves); the group sizes your class keeps, and that each bad one raised the ValueError asked for. A
hidden case states no expected layout or size: the grader has the course's solution's."""
from __future__ import annotations

import numpy as np
import torch

import autograder.notebook_checks as checks
from autograder.labs.lab07.common import ANSWER_KEY, as_tensor, call, first, own_scheme, want_codes


def want_int4(w, G):
    """The lab's quantizer, by the formula, in float32: one scale per group of G inputs of a row,
    scale = absmax / 7 (1 for a group of zeros), code = round(w / scale) (half to even), clamped to [-7, 7]."""
    w = np.asarray(w, dtype=np.float32)
    out_f, in_f = w.shape
    groups = w.reshape(out_f, in_f // G, G)
    absmax = np.abs(groups).max(axis=2)
    scale = (absmax / np.float32(7)).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    ratio = groups / scale[..., None]
    return np.clip(np.round(ratio), -7, 7).reshape(out_f, in_f).astype(np.int64), scale, ratio.reshape(out_f, in_f), absmax


def scale_problem(s, s_want, absmax, w, G, what):
    """Why the scales differ from absmax / 7, in words: the diagnosis first, then the first wrong group."""
    r, j = first(~np.isclose(s, s_want, rtol=1e-6, atol=0))
    where = f"row {r}, group {j} (inputs {j * G}..{(j + 1) * G - 1}) has absmax {absmax[r, j]:.6g}, so its scale"
    where += (" should be 1 (a group of zeros: any scale represents it, and 0 would divide zero by zero)"
              if absmax[r, j] == 0 else f" should be absmax / 7 = {s_want[r, j]:.6g}") + f", got {s[r, j]:.6g}"
    live = absmax > 0
    row_max = np.abs(np.asarray(w, dtype=np.float32)).max(axis=1)
    rows = row_max > 0
    if np.allclose(s[live], absmax[live] / 8, rtol=1e-5, atol=0):
        return (f"{what}: your scales are absmax / 8, the asymmetric range [-8, 7]. This lab's convention is symmetric, "
                f"scale = absmax / 7 and codes in [-7, 7], so that +absmax and -absmax are both exact: {where}")
    if np.allclose(s[rows], np.broadcast_to((row_max / 7)[:, None], s.shape)[rows], rtol=1e-5, atol=0):
        return (f"{what}: your scales are the absmax of the whole row / 7, one scale per row. The lab asks for one scale "
                f"per group of {G} inputs, from the group's own absmax: {where}")
    if np.allclose(s[live], 7 / absmax[live], rtol=1e-5, atol=0):
        return f"{what}: your scales are 7 / absmax; store the step, absmax / 7: {where}"
    return f"{what}: {where}"


def state_tensors(state, out_f, in_f, G, what, hidden=False):
    """quantize's state must be {"packed": uint8 [out, in / 2], "scale": float32 [out, in / G]}; returns both."""
    n_groups = in_f // G
    assert isinstance(state, dict) and "packed" in state and "scale" in state, (
        f"{what}: quantize must return a dict {{'packed': ..., 'scale': ...}}, got {type(state).__name__} "
        f"{sorted(state) if isinstance(state, dict) else ''}")
    packed = as_tensor(state["packed"], f"{what}: state['packed']")
    scale = as_tensor(state["scale"], f"{what}: state['scale']")
    checks.observe(f"{what}: the state's dtypes and shapes", [str(packed.dtype), list(packed.shape), str(scale.dtype),
                                                            list(scale.shape)],
                   **({} if hidden else {"expect": ["torch.uint8", [out_f, in_f // 2], "torch.float32",
                                                    [out_f, n_groups]]}))
    assert packed.dtype == torch.uint8, f"{what}: state['packed'] must be uint8 (two codes per byte), got {packed.dtype}"
    assert tuple(packed.shape) == (out_f, in_f // 2), (
        f"{what}: state['packed'] must have shape [{out_f}, {in_f // 2}] = [out, in / 2], got {list(packed.shape)}")
    assert scale.dtype == torch.float32, f"{what}: state['scale'] must be float32, got {scale.dtype}"
    if tuple(scale.shape) in ((out_f,), (out_f, 1)) and n_groups > 1:
        raise AssertionError(f"{what}: state['scale'] has shape {list(scale.shape)}: one scale per row. The lab asks for "
                             f"one scale per group of {G} inputs: shape [{out_f}, {n_groups}] = [out, in / group_size]")
    assert tuple(scale.shape) == (out_f, n_groups), (
        f"{what}: state['scale'] must have shape [{out_f}, {n_groups}] = [out, in / group_size], got {list(scale.shape)}")
    return packed, scale


def check_scales(s, s_want, absmax, w, G, what):
    """Positive, finite scales first (a group of zeros gets 1), then absmax / 7, with a diagnosis when not."""
    checks.observe(f"{what}: scales that are not absmax / 7 (1 for a group of zeros)",
                   int((~np.isclose(s, s_want, rtol=1e-6, atol=0)).sum()), at_most=0)
    if not (np.isfinite(s).all() and (s > 0).all()):
        r, j = first(~(np.isfinite(s) & (s > 0)))
        raise AssertionError(
            f"{what}: the scale of row {r}, group {j} is {s[r, j]}: scales must be positive and finite" +
            (". That group is all zeros: give it the scale 1 (any scale represents zeros exactly; 0 would make "
             "w / scale = 0 / 0 = NaN)" if absmax[r, j] == 0 else ""))
    if not np.allclose(s, s_want, rtol=1e-6, atol=0):
        raise AssertionError(scale_problem(s, s_want, absmax, w.numpy(), G, what))


def check_codes(codes, q_want, ratio, s_want, w, G, what):
    """The packed codes (read with the lab's packing) must be round(w / scale) in [-7, 7]; a weight whose w / scale
    lies within rounding noise of a half may round either way."""
    out_f, in_f = codes.shape
    if (codes < -7).any():
        r, c = first(codes < -7)
        raise AssertionError(f"{what}: w[{r}, {c}] = {float(w[r, c]):.6g} got the code {codes[r, c]}: codes must stay in "
                             f"[-7, 7] (symmetric); with scale = absmax / 7, round(w / scale) is -7 at the lowest")
    wrong = codes != q_want
    tie = np.abs(np.abs(ratio - np.floor(ratio)) - 0.5) < 1e-4  # w / scale within rounding noise of a half: either way
    bad = wrong & ~(tie & (np.abs(codes - q_want) == 1))
    checks.observe(f"{what}: codes that are not round(w / scale) in [-7, 7]", int((bad | (codes < -7)).sum()),
                   at_most=0)
    if bad.any():
        r, c = first(bad)
        swapped = codes.reshape(out_f, -1, 2)[:, :, ::-1].reshape(out_f, in_f)
        said = (f"w[{r}, {c}] = {float(w[r, c]):.6g} lies in group {c // G} (scale {s_want[r, c // G]:.6g}), so its code "
                f"is round({ratio[r, c]:.4f}) = {q_want[r, c]}, but state['packed'] holds {codes[r, c]} there (read with "
                f"the lab's packing: code 2i in the low nibble of byte i, two's complement)")
        if np.array_equal(swapped, q_want):
            raise AssertionError(f"{what}: state['packed'] holds the right codes with the nibbles swapped: {said}")
        raise AssertionError(f"{what}: {said}")


def check_dequantized(scheme, state, codes, s, w, G, what):
    """dequantize(state) must be code * scale, and so within half a step of w. Returns it and the errors in steps."""
    out_f, in_f = w.shape
    deq = as_tensor(call(scheme.dequantize, f"{what}: dequantize(state)", state), f"{what}: dequantize(state)")
    assert tuple(deq.shape) == (out_f, in_f), f"{what}: dequantize(state) must have shape [{out_f}, {in_f}], got {list(deq.shape)}"
    assert deq.is_floating_point(), f"{what}: dequantize(state) must be a float tensor, got {deq.dtype}"
    d = deq.detach().cpu().double().numpy()
    step = s.astype(np.float64).repeat(G, axis=1)
    want_d = codes * step
    err = np.abs(d - w.numpy().astype(np.float64)) / step
    checks.observe(f"{what}: entries of dequantize(state) that are not code * scale",
                   int((~np.isclose(d, want_d, rtol=1e-6, atol=0)).sum()), at_most=0)
    checks.observe(f"{what}: the largest error of dequantize(state), in steps", float(err.max()), at_most=0.5 + 1e-4)
    if not np.allclose(d, want_d, rtol=1e-6, atol=0):
        r, c = first(~np.isclose(d, want_d, rtol=1e-6, atol=0))
        raise AssertionError(f"{what}: dequantize(state)[{r}, {c}] should be the code times its group's scale, "
                             f"{codes[r, c]} * {s[r, c // G]:.6g} = {want_d[r, c]:.6g}, got {d[r, c]:.6g}")
    if err.max() > 0.5 + 1e-4:
        r, c = first(err == err.max())
        raise AssertionError(f"{what}: w[{r}, {c}] = {float(w[r, c]):.6g} came back as {d[r, c]:.6g}, {err[r, c]:.3f} steps "
                             f"away: rounding to the nearest code keeps every weight within half a step")
    return d, err


def check_rows(scheme, state, d, rows, in_f, what):
    """dequantize(state, rows=ids) must be those rows of the whole matrix, in that order (the embedding's lookup)."""
    ids = torch.tensor(rows, dtype=torch.long)
    sub = as_tensor(call(scheme.dequantize, f"{what}: dequantize(state, rows={rows})", state, rows=ids),
                    f"{what}: dequantize(state, rows={rows})")
    assert tuple(sub.shape) == (len(rows), in_f), (
        f"{what}: dequantize(state, rows={rows}) must have shape [{len(rows)}, {in_f}] (those rows, in that order), "
        f"got {list(sub.shape)}")
    got = sub.detach().cpu().double().numpy()
    checks.observe(f"{what}: rows of dequantize(state, rows={rows}) that are not those of the whole matrix",
                   int((~np.isclose(got, d[rows], rtol=1e-6, atol=0).all(axis=1)).sum()), at_most=0)
    if not np.allclose(got, d[rows], rtol=1e-6, atol=0):
        k = first(~np.isclose(got, d[rows], rtol=1e-6, atol=0).all(axis=1, keepdims=True))[0]
        raise AssertionError(f"{what}: dequantize(state, rows={rows}) must give rows {rows} of the whole matrix, in "
                             f"that order (the embedding looks token ids up this way); entry {k} is not row {rows[k]}")


def check_scheme(Int4GroupWise, w, G, label, rows=None, hidden=False):
    """Your Int4GroupWise(G) on the matrix w: the state's layout, the scales, the codes (read with the lab's packing),
    dequantize (the whole matrix, and the rows an embedding lookup asks for), and the error bound.
    Returns the largest error in steps (at most 0.5)."""
    w = torch.as_tensor(w, dtype=torch.float32)
    out_f, in_f = w.shape
    what = f"{label}Int4GroupWise({G}) on [{out_f}, {in_f}]"
    scheme = call(Int4GroupWise, f"{what}: Int4GroupWise({G})", G)
    before = w.clone()
    state = call(scheme.quantize, f"{what}: quantize", w)
    assert torch.equal(w, before), f"{what}: quantize changed the weight it was given"
    packed, scale = state_tensors(state, out_f, in_f, G, what, hidden)
    q_want, s_want, ratio, absmax = want_int4(w.numpy(), G)
    s = scale.detach().cpu().numpy().astype(np.float32)
    check_scales(s, s_want, absmax, w, G, what)
    codes = want_codes(packed.detach().cpu().numpy())  # read with the lab's packing
    check_codes(codes, q_want, ratio, s_want, w, G, what)
    d, err = check_dequantized(scheme, state, codes, s, w, G, what)
    if rows is not None:
        check_rows(scheme, state, d, rows, in_f, what)
    return float(err.max())


def special_weight(seed, out_f, in_f, G):
    """Random rows of sizes from 0.001 to 10, with the groups a quantizer gets wrong: a group of zeros, a row whose
    groups differ by a factor of 1000, a group whose largest weight is negative."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) * torch.logspace(-3, 1, out_f)[:, None]
    w[0, :G] = 0
    w[1, G:] *= 1000
    w[2, :G] = w[2, :G].abs()
    w[2, G // 2] = -1.5 * float(w[2, :G].max())
    return w


def target_weight(name):
    """One weight matrix of the shipped target (float32)."""
    return checks.load_model().state_dict()[name].detach().clone()


def check_schemes(Int4GroupWise, cases, label, ns, hidden=False):
    """Task 2: your Int4GroupWise on every (what, weight, group size, rows to look up) case. Your quantize and
    dequantize call pack_int4 and unpack_int4 by name in the notebook ``ns``: the course's versions are lent there
    while this runs, so that a mistake of Task 1 is not counted again here. hidden: no expected layout is stated (the
    grader has the solution's). Returns (cases, largest error in steps)."""
    own_scheme(Int4GroupWise)
    worst = 0.0
    with checks.course_parts_under(ns, "pack_int4", "unpack_int4"), \
            checks.reference_forbidden("Int4GroupWise", forbidden=ANSWER_KEY):
        for what, w, G, rows in cases:
            worst = max(worst, check_scheme(Int4GroupWise, w, G, f"{label}{what}: ", rows, hidden))
    return len(cases), worst


def check_bad_size(Int4GroupWise, g, label):
    """A group size that is not an even integer >= 2 must fail in __init__, with a ValueError naming it."""
    what = f"{label}Int4GroupWise(group_size={g!r})"
    try:
        Int4GroupWise(g)
    except ValueError as e:
        assert "group_size" in str(e) and repr(g) in str(e), (
            f"{what} raised ValueError({str(e)!r}): right, but the message should name group_size and the "
            f"value it got, {g!r}, so that the caller sees what to fix")
        checks.observe(f"{what} raises ValueError naming group_size and {g!r}", True, expect=True)
        return
    except Exception as e:
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}; the lab asks for a ValueError that names "
                             f"group_size and the value it got") from e
    raise AssertionError(f"{what} was accepted, but a group size must be an even integer >= 2 (a bool or a float "
                         f"is not one): raise a ValueError in __init__")


def check_bad_layer(Int4GroupWise, g, out_f, in_f, label):
    """A group size that does not divide the layer's inputs must fail in quantize, naming both numbers."""
    scheme = call(Int4GroupWise, f"{label}Int4GroupWise({g})", g)
    what = f"{label}Int4GroupWise({g}).quantize of a [{out_f}, {in_f}] weight"
    try:
        scheme.quantize(torch.zeros(out_f, in_f))
    except ValueError as e:
        assert str(g) in str(e) and str(in_f) in str(e), (
            f"{what} raised ValueError({str(e)!r}): right, but the message should name the group size ({g}) "
            f"and the layer's {in_f} input features")
        checks.observe(f"{what} raises ValueError naming {g} and {in_f}", True, expect=True)
        return
    except Exception as e:
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}; the lab asks for a ValueError that names "
                             f"the group size and the layer's input features") from e
    raise AssertionError(f"{what} returned a state, but {g} does not divide {in_f}: the last group would be "
                         f"partial. Raise a ValueError")


def check_group_sizes(Int4GroupWise, bad, bad_layers, good, label, hidden=False):
    """Bad group sizes fail at construction, and a group size that does not divide a layer's inputs fails in quantize,
    each with a ValueError whose message names the problem; good ones are kept as self.group_size, 64 by default.
    hidden: the sizes kept are compared by the grader."""
    own_scheme(Int4GroupWise)
    with checks.reference_forbidden("Int4GroupWise", forbidden=ANSWER_KEY):
        for g in bad:
            check_bad_size(Int4GroupWise, g, label)
        for g, (out_f, in_f) in bad_layers:
            check_bad_layer(Int4GroupWise, g, out_f, in_f, label)
        for g in good:
            scheme = call(Int4GroupWise, f"{label}Int4GroupWise({g})", g)
            kept = checks.as_count(getattr(scheme, "group_size", None), f"{label}Int4GroupWise({g}).group_size")
            checks.observe(f"{label}Int4GroupWise({g}).group_size", kept, **({} if hidden else {"expect": g}))
            assert kept == g, f"{label}Int4GroupWise({g}).group_size should be {g}, got {kept}"
        default = checks.as_count(getattr(call(Int4GroupWise, f"{label}Int4GroupWise()"), "group_size", None),
                                  f"{label}Int4GroupWise().group_size")
        checks.observe(f"{label}Int4GroupWise().group_size", default, **({} if hidden else {"expect": 64}))
        assert default == 64, f"{label}Int4GroupWise() should default to groups of 64, got {default}"
    return len(bad) + len(bad_layers) + len(good)
