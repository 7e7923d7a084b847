"""Lab 02's design part, the low-bit KV cache: its texts, the literals of its test cells, its measuring code, and the
power of its thresholds (the lab's solution passes them, the baseline and the planted bugs fail where they should).

The texts and the table of schemes come from autograder/qa/design/lab02.py (instructors only); the measuring code is the
lab's harness (autograder/labs/lab02/lowbit.py, lab02/ppl.py), which ships.
"""
from __future__ import annotations

import functools
import inspect
import json
import re
import textwrap

import numpy as np
import pytest
import torch
from autograder_support import REPO

from autograder.labs import lab02
from autograder.labs.lab02 import lowbit as lab02_lowbit, ppl as lab02_ppl
from autograder.qa.design import lab02 as design, lab02_schemes as schemes
from miniengine.kv.contiguous import KVCache

SOURCE = REPO / "labs" / "lab02_kv_cache" / "lab02_kv_cache.ipynb"
TARGET = lab02.target_config()  # a bare config: what fill() and Task 1 take
ENGINE = lab02.engine_config()   # the engine's own LlamaConfig of the target model: what the design tests take


def cell(grade_id: str) -> str:
    cells = json.loads(SOURCE.read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def literal(grade_id: str) -> float:
    return float(re.search(r"float32_ppl=([0-9.]+)", cell(grade_id)).group(1))


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return design.model_and_tokenizer()[0]


@pytest.fixture(scope="module")
def texts():
    return {name: json.loads(path.read_text()) for name, path in (("visible", design.VISIBLE_FILE),
                                                                    ("hidden", design.HIDDEN_FILE))}


@pytest.fixture(scope="module")
def solution():
    return design.solution_classes()


# ---------------------------------------------------------------- the texts and the literals

def test_the_texts_are_windows_of_the_model_s_own_writing(texts):
    for name, data, count in (("visible", texts["visible"], design.WINDOWS), ("hidden", texts["hidden"], design.WINDOWS)):
        assert len(data["cases"]) == count and data["window"] == design.WINDOW and data["chunk"] == lab02_lowbit.CHUNK
        for case in data["cases"]:
            assert case["name"].startswith(name) and len(case["prompt_token_ids"]) == design.WINDOW
            assert case["params"]["temperature"] == 1.0 and case["params"]["ignore_eos"]
        assert data["float32_perplexity"] == pytest.approx(lab02_ppl.perplexity(data["float32_window_nlls"]), rel=1e-12)
    visible = {tuple(c["prompt_token_ids"]) for c in texts["visible"]["cases"]}
    assert not visible & {tuple(c["prompt_token_ids"]) for c in texts["hidden"]["cases"]}


def test_the_first_visible_window_regenerates(texts):
    first = design.write_windows(design.VISIBLE_HEADERS[:1], design.VISIBLE_SEED, "visible", per_header=1)[0]
    assert first["prompt_token_ids"] == texts["visible"]["cases"][0]["prompt_token_ids"]


def test_the_visible_cell_holds_the_file_s_float32_perplexity_and_the_hidden_one_none(texts):
    """The hidden cell holds inputs only: its float32 perplexity is measured by the harness (the next test checks
    that the measurement gives the file's figure), never typed into the notebook."""
    assert literal("design-kv-ppl-visible") == pytest.approx(texts["visible"]["float32_perplexity"], rel=1e-6)
    assert f"{texts['visible']['float32_perplexity']:.2f}" in json.dumps(json.loads(SOURCE.read_text())["cells"])
    hidden = cell("design-kv-ppl-hidden")
    assert "float32_ppl" not in hidden and f"{texts['hidden']['float32_perplexity']:.2f}" not in hidden
    assert f"{texts['hidden']['float32_perplexity']:.2f}" not in json.dumps(json.loads(SOURCE.read_text())["cells"])


def test_the_float32_perplexities_reproduce(model, texts):
    """The design's float32 cache gives the files' figures on the first windows of each text: the visible one is
    typed into its test cell, the hidden one is the grader's yardstick (autograder/grade/yardsticks.py)."""
    for name, first in (("visible", 8), ("hidden", 8)):  # the first windows: the path reproduces the files
        windows = [c["prompt_token_ids"] for c in texts[name]["cases"][:first]]
        nlls = lab02_ppl.window_nlls(schemes.FloatCache, schemes.SchemeAttention, model, windows, "float32")
        assert nlls == pytest.approx(texts[name]["float32_window_nlls"][:first], abs=1e-6)


# ---------------------------------------------------------------- the measuring code

class Held:
    __slots__ = ("codes", "extra")


def test_held_bytes_counts_every_storage_once_and_whole():
    big = torch.zeros(10, 4, dtype=torch.float16)  # 80 bytes
    holder = type("Cache", (), {})()
    holder.view, holder.same, holder.parts = big[:2], big, [big[5], {"np": np.zeros(3, dtype=np.float32)}]
    holder.slotted = Held()
    holder.slotted.codes, holder.slotted.extra = torch.zeros(7, dtype=torch.uint8), bytearray(5)
    assert lab02_lowbit.held_bytes(holder) == 80 + 12 + 7 + 5
    holder.numbers = list(range(2000))
    with pytest.raises(AssertionError, match="Python numbers"):
        lab02_lowbit.held_bytes(holder)


def test_the_walk_counts_what_the_caches_reach_through_their_classes_and_code():
    """held_bytes: what one cache object holds (a tensor's own attributes, a default of a function it holds);
    reachable_bytes: also its class's attributes, and what the code of its class reads: a global, an attribute of a
    class or of a module that the code names. Each storage once."""
    ns = {"__name__": "__main__", "torch": torch}
    exec(textwrap.dedent("""
        POOL = [torch.zeros(100)]                   # 400 bytes in a global the code reads
        UNREAD = torch.zeros(1000)                  # a global no code reads: not counted
        class Shelf:
            store = torch.zeros(10)                 # 40 bytes on a class the code names
        torch._lab02_test_pool = torch.zeros(5)     # 20 bytes on a module the code names
        class Cache:
            table = torch.zeros(3)                  # 12 bytes: a class attribute
            def __init__(self):
                self.codes = torch.zeros(8, dtype=torch.uint8)     # 8
                self.codes.copy = torch.zeros(4)                   # 16, hung on a tensor
                self.fn = lambda hidden=torch.zeros(2): hidden     # 8, a default of a function it holds
                self.view = POOL[0][:10]                           # a view of the pool: the pool, once
            def write(self):
                return POOL, Shelf.store, torch._lab02_test_pool, self.codes
    """), ns)
    try:
        one, two = ns["Cache"](), ns["Cache"]()
        assert lab02_lowbit.held_bytes(one) == 8 + 16 + 8 + 400
        assert lab02_lowbit.reachable_bytes([one]) == 8 + 16 + 8 + 400 + 40 + 20 + 12
        assert lab02_lowbit.reachable_bytes([one, two]) == 2 * (8 + 16 + 8) + 400 + 40 + 20 + 12
    finally:
        del torch._lab02_test_pool


def test_the_walk_stops_at_the_model_s_own_parameters(model):
    holder = type("Cache", (), {})()
    holder.model, holder.codes = model, torch.zeros(8, dtype=torch.uint8)
    model.rope_tables(torch.float32, "cpu")  # built by the model's first forward pass: the model's own, not counted
    assert lab02_lowbit.held_bytes(holder) == 8
    model.register_buffer("pool", torch.zeros(10))  # not one of the model's own parameters: counted
    try:
        assert lab02_lowbit.held_bytes(holder) == 8 + 40
    finally:
        del model._buffers["pool"]


def test_the_float32_cache_is_exact_and_costs_one_x():
    kv, seqs = lab02_lowbit.fill(schemes.SchemeAttention, schemes.FloatCache, TARGET, [40], "float32", tolerance=1e-5)
    assert lab02_lowbit.held_bytes(seqs[0].kv) == lab02_lowbit.float32_bytes(TARGET, 40)
    assert lab02_lowbit.reachable_bytes([seqs[0].kv], schemes.SchemeAttention) == lab02_lowbit.float32_bytes(TARGET, 40)


def test_measuring_rejects_bad_arguments(model, solution):
    with pytest.raises(ValueError, match="chunk"):
        lab02_ppl.window_nlls(*solution, model, [[1, 2, 3]], "x", chunk=0)
    with pytest.raises(ValueError, match="windows"):
        lab02_ppl.measure_lowbit(*solution, windows=0)
    with pytest.raises(ValueError, match="bits"):
        lab02_ppl.measure_lowbit(functools.partial(solution[0], bits=3), solution[1], windows=1)


# ---------------------------------------------------------------- the thresholds have power

@pytest.mark.slow  # a whole measurement (make quick leaves it out)
def test_the_solution_passes_every_design_test(solution, texts, monkeypatch):
    cache, backend = solution
    ratio = lab02.check_lowbit_bytes(cache, backend, ENGINE, [256, 37], "the tiny model's shape",
                                     text=lab02.visible_text(16))
    assert ratio == pytest.approx(0.15625)
    lab02.check_lowbit_bytes(cache, backend, lab02.engine_config(3, 8, 2, 64), [100, 7], "GQA", hidden=True)
    windows = [c["prompt_token_ids"] for c in texts["visible"]["cases"]]
    _, increase = lab02.check_lowbit_ppl(cache, backend, windows, texts["visible"]["float32_perplexity"], "visible")
    assert 0 < increase < lab02_lowbit.PPL_LIMIT / 2, increase  # half the target: a margin far above the texts' spread
    # The hidden cell's way: the perplexity leaves the kernel, and the grader's judge compares it with the file's.
    from autograder.grade.yardsticks import JUDGES

    rows = []
    # the harness's own notebook_checks, however reloaded, and whether or not pristine has wrapped the check
    checks = inspect.unwrap(lab02.check_lowbit_ppl).__globals__["checks"]
    monkeypatch.setattr(checks, "observe", lambda label, value, **how: rows.append(dict(how, label=label, value=value)))
    ppl, none = lab02.check_lowbit_ppl(cache, backend, [c["prompt_token_ids"] for c in texts["hidden"]["cases"]],
                                       what="kv_text", hidden=True)
    (row,) = [r for r in rows if r.get("judge") == "lab02-hidden-ppl"]
    increase = ppl / texts["hidden"]["float32_perplexity"] - 1
    assert none is None and row["value"] == ppl and 0 < increase < lab02_lowbit.PPL_LIMIT / 2, increase
    assert row["at_most"] == lab02_lowbit.PPL_LIMIT and row["baseline"] == lab02_lowbit.PPL_BASELINE
    assert JUDGES["lab02-hidden-ppl"](row["value"], row) is None
    share, words = JUDGES["lab02-hidden-ppl"](texts["hidden"]["float32_perplexity"] * 1.0125, row)  # halfway
    assert share == pytest.approx(0.5) and "+1.25% over the float32 cache's perplexity" in words
    assert "over the +1.0% target: 50% of the points (none from +1.5%)" in words
    assert JUDGES["lab02-hidden-ppl"](texts["hidden"]["float32_perplexity"] * 1.02, row)[0] == 0


def test_the_bytes_are_counted_on_the_engine_s_config_only():
    with pytest.raises(AssertionError, match="LlamaConfig"):
        lab02.check_lowbit_bytes(*design.solution_classes(), TARGET, [8], "a bare config")


def baseline_classes():
    from autograder.qa.design.lab02 import BASELINE

    scope = {"__name__": "__main__", "torch": torch, "causal_attention": design.causal_attention}
    exec(compile(cell("CachedAttention"), "<CachedAttention>", "exec"), scope)
    exec(compile(BASELINE["design-lowbit-kv"], "<baseline>", "exec"), scope)
    return scope["LowBitKVCache"], scope["LowBitAttention"]


def observed_shares(run, monkeypatch) -> dict[str, float]:
    """What a check observed with a scaled target, as {label: the share of the points it earns} (ledger.credit)."""
    from autograder.notebook_checks.ledger import row_credit

    rows = []
    checks = inspect.unwrap(lab02.check_lowbit_ppl).__globals__["checks"]
    monkeypatch.setattr(checks, "observe", lambda label, value, **how: rows.append(dict(how, label=label, value=value)))
    run()
    monkeypatch.undo()
    return {r["label"]: row_credit(r["value"], r) for r in rows if "baseline" in r and "judge" not in r}


def test_the_baseline_earns_no_bytes_points_and_every_perplexity_point(texts, monkeypatch, capsys):
    cache, backend = baseline_classes()
    shares = observed_shares(lambda: lab02.check_lowbit_bytes(cache, backend, ENGINE, [256, 37], "the tiny model's shape"),
                             monkeypatch)
    assert len(shares) == 3 and set(shares.values()) == {0.0}, shares
    assert "0.281x (target at most 0.200x, none from 0.281x): 0% of the points" in capsys.readouterr().out
    windows = [c["prompt_token_ids"] for c in texts["visible"]["cases"][:16]]
    f32 = lab02_ppl.perplexity(texts["visible"]["float32_window_nlls"][:16])
    shares = observed_shares(lambda: lab02.check_lowbit_ppl(cache, backend, windows, f32, "the visible text"), monkeypatch)
    assert list(shares.values()) == [1.0], shares


def test_int3_and_int8_land_on_the_wrong_side_of_a_target(model, texts):
    """Symmetric int3 in groups of 16 misses the perplexity target (the first 16 visible windows), int8 the bytes one."""
    windows = [c["prompt_token_ids"] for c in texts["visible"]["cases"][:16]]
    int3 = schemes.scheme(bits=3, granularity=16)
    nlls = lab02_ppl.window_nlls(int3, schemes.SchemeAttention, model, windows, "int3")
    increase = lab02_ppl.perplexity(nlls) / lab02_ppl.perplexity(texts["visible"]["float32_window_nlls"][:16]) - 1
    assert increase > lab02_lowbit.PPL_LIMIT, increase
    int8 = schemes.scheme(bits=8, granularity="token_head", scale_dtype=torch.float32)
    _, seqs = lab02_lowbit.fill(schemes.SchemeAttention, int8, TARGET, [64], "int8")
    ratio = lab02_lowbit.held_bytes(seqs[0].kv) / lab02_lowbit.float32_bytes(TARGET, 64)
    assert ratio == pytest.approx(9 / 32, abs=1e-3) and ratio >= lab02_lowbit.BYTES_BASELINE > lab02_lowbit.BYTES_LIMIT


# ---------------------------------------------------------------- the planted bugs (tests/autograder/fixtures/lab02/)

def _make_fixtures():
    import importlib.util

    path = REPO / "tests" / "autograder" / "fixtures" / "lab02" / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("lab02_make_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIXTURES = _make_fixtures().FIXTURES


def bug_classes(change):
    solution_source = "\n".join(ln for ln in cell("design-lowbit-kv").splitlines() if "### " not in ln)
    scope = {"__name__": "__main__", "torch": torch, "causal_attention": design.causal_attention}
    exec(compile(cell("CachedAttention"), "<CachedAttention>", "exec"), scope)
    exec(compile(change(solution_source), "<planted bug>", "exec"), scope)
    return scope["LowBitKVCache"], scope["LowBitAttention"]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_a_planted_bug_loses_the_design_points_it_should(name, texts, monkeypatch):
    """A bug either fails a test outright (an assertion: a wrong output) or misses a target, and then earns only the
    share the grader would give (ledger.credit); the tests FIXTURES names lose points, every other earns them all."""
    what, change, fails = FIXTURES[name]
    cache, backend = bug_classes(change)
    first16 = lab02_ppl.perplexity(texts["visible"]["float32_window_nlls"][:16])
    share = {}
    for kind, run in (("bytes", lambda: lab02.check_lowbit_bytes(cache, backend, ENGINE, [256, 37], "visible")),
                      ("ppl", lambda: lab02.check_lowbit_ppl(cache, backend, lab02.visible_text(16), first16,
                                                             "the first 16 visible windows"))):
        try:
            share[kind] = min(observed_shares(run, monkeypatch).values())
        except AssertionError as e:
            share[kind] = str(e)
    for kind in ("bytes", "ppl"):
        loses = f"design-kv-{kind}-visible" in fails
        assert (share[kind] != 1.0) == loses, (name, what, kind, share[kind])
