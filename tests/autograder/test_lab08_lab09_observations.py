"""Labs 08 and 09: what the hidden cells observe of the solution is what the course's own parts give.

Their hidden cells hold inputs only (seeds, sizes, labels), and the answer sheet takes each hidden observation's
expected value from the solution's run (autograder/grade/sheets.py).  Here the harness's hidden checks run on the
solution's functions (read from the lab's source notebook) and on the course's reference (miniengine), on the very
inputs of the hidden cells, and must observe the same values: a wrong solution would make a wrong sheet.  A hidden
observation carries no expected value (only a property's True, or a bound); a visible one always does.
"""
import ast
import json

import pytest
import torch

from autograder.notebook_checks import ledger
from miniengine.paths import REPO_ROOT

LAB08 = REPO_ROOT / "labs" / "lab08_prefix_caching_and_chunked_prefill" / "lab08_prefix_caching_and_chunked_prefill.ipynb"
LAB09 = REPO_ROOT / "labs" / "lab09_tensor_parallelism" / "lab09_tensor_parallelism.ipynb"


def cells(path) -> dict[str, str]:
    return {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") or c.get("id"): "".join(c["source"])
            for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"}


def solution(path, answers) -> dict:
    """The namespace of the lab's imports cell (the first that imports miniengine) and its answer cells."""
    src = cells(path)
    ns = {"__name__": "__main__"}
    setup = next(s for s in src.values() if s.startswith("import") and "from miniengine" in s)
    for code in [setup] + [src[a] for a in answers]:
        exec(compile(code, "<cell>", "exec"), ns)
    return ns


def hidden_call(path, gid, name):
    """The positional and keyword arguments (evaluated; names other than torch left as their name) of the hidden
    cell's call of lab.<name>."""
    tree = ast.parse(cells(path)[gid])
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == name)

    def value(node):
        if isinstance(node, ast.Name):
            return node.id
        return eval(compile(ast.Expression(node), "<arg>", "eval"), {"torch": torch})

    return [value(a) for a in call.args], {k.arg: value(k.value) for k in call.keywords}


def observed(fn, *args, **kwargs) -> list[dict]:
    del ledger._rows[:]
    getattr(fn, "__wrapped__", fn)(*args, **kwargs)  # the unwrapped check: outside a kernel, flush drops the rows
    rows = ledger.pending()
    del ledger._rows[:]
    return rows


def values(rows) -> list:
    return [(r["label"], r["value"]) for r in rows]


def no_expected_values(rows):
    """A hidden observation states no expected value, except a property's True."""
    assert rows
    leaks = [r for r in rows if "expect" in r and r["expect"] is not True]
    assert not leaks, leaks[:3]


@pytest.fixture(scope="module")
def lab08():
    import importlib

    import autograder.labs

    lab = importlib.reload(autograder.labs).pristine("lab08")
    return lab, solution(LAB08, ("block_keys", "PrefixCache", "chunk"))


@pytest.fixture(scope="module")
def lab09():
    import importlib

    import autograder.labs

    lab = importlib.reload(autograder.labs).pristine("lab09")
    return lab, solution(LAB09, ("split", "ring"))


def test_lab08_hidden_keys_of_the_solution_are_the_courses(lab08):
    from miniengine.kv import prefix_cache as course

    lab, ns = lab08
    (_, _, cases), kw = hidden_call(LAB08, "keys-hidden", "check_block_keys")
    for seed, bs, length in cases:
        label = f"{kw['prefix']}{length} tokens, blocks of {bs}"
        mine = observed(lab.check_keys, ns["block_key"], ns["block_keys"], seed, bs, length, label, hidden=True)
        no_expected_values(mine)
        assert values(mine) == values(observed(lab.check_keys, course.block_key, course.block_keys, seed, bs, length,
                                               label, hidden=True))


def test_lab08_hidden_cache_answers_of_the_solution_are_the_courses(lab08):
    import random

    from miniengine.kv.prefix_cache import PrefixCachingBlockManager

    lab, ns = lab08
    (_, seed), kw = hidden_call(LAB08, "cache-hidden", "check_prefix_cache")
    assert kw["hidden"] is True

    def run(cls):
        rng = random.Random(seed)
        rows = observed(lab.reuse_scenario, cls, [rng.randrange(4096) for _ in range(80)], *kw["reuse"], hidden=True)
        rows += observed(lab.lru_scenario, cls, [rng.randrange(4096) for _ in range(80)], *kw["lru"], hidden=True)
        for r in kw["random_runs"]:
            rows += observed(lab.random_ops, cls, *r, hidden=True)
        return rows

    mine = run(ns["PrefixCache"])
    no_expected_values(mine)
    assert values(mine) == values(run(PrefixCachingBlockManager))


def test_lab08_hidden_chunk_rule_of_the_solution_is_the_courses(lab08):
    from miniengine.engine.scheduler import chunk_to_fit

    lab, ns = lab08
    (_, _), kw = hidden_call(LAB08, "chunk-hidden", "report_chunks")
    for m in kw["max_chunks"]:
        label = f"hidden case: max_chunk={m}"
        mine = observed(lab.check_rule, ns["chunk"], label, m, hidden=True)
        no_expected_values(mine)
        course = observed(lab.check_rule, lambda seq, left, mc: min(chunk_to_fit(seq, left), mc), label, m, hidden=True)
        assert values(mine) == values(course)


def test_lab09_hidden_splits_of_the_solution_are_the_courses(lab09):
    import miniengine.distributed as tp

    lab, ns = lab09
    (_, _), kw = hidden_call(LAB09, "split-hidden", "check_shards")
    assert kw["hidden"] is True
    for seed, out_f, in_f, p in kw["splits"]:
        label = f"{kw['label']} {seed}"
        mine = observed(lab.check_split, ns["column_shard"], ns["row_shard"], seed, out_f, in_f, p, label, True)
        no_expected_values(mine)
        assert values(mine) == values(observed(lab.check_split, tp.column_shard, tp.row_shard, seed, out_f, in_f, p,
                                               label, True))


def test_lab09_hidden_rings_of_the_solution_are_the_courses(lab09):
    import miniengine.distributed as tp

    lab, ns = lab09
    (_, cases, label), kw = hidden_call(LAB09, "ring-hidden", "check_rings")
    assert kw["hidden"] is True
    for seed, p, shape, dtype in cases:
        what = f"{label} {seed}: {p} ranks, shape {list(shape)}, {dtype}"
        mine = observed(lab.check_ring, ns["ring_all_reduce"], seed, p, shape, dtype, what, True)
        no_expected_values(mine)
        course = observed(lab.check_ring, tp.ring_all_reduce, seed, p, shape, dtype, what, True)
        exact = [(k, v) for k, v in values(mine) if "distance" not in k]  # rounding may differ, within the bound
        assert exact == [(k, v) for k, v in values(course) if "distance" not in k]
        assert [r["label"] for r in mine] == [r["label"] for r in course]


def test_lab08_lab09_visible_observations_state_what_they_expect(lab08, lab09):
    lab, ns = lab08
    rows = observed(lab.check_keys, ns["block_key"], ns["block_keys"], 0, 4, 40, "visible")
    rows += observed(lab.check_rule, ns["chunk"], "visible", 3)
    lab, ns = lab09
    rows += observed(lab.check_split, ns["column_shard"], ns["row_shard"], 1, 8, 6, 2, "visible")
    rows += observed(lab.check_ring, ns["ring_all_reduce"], 11, 3, (4, 8), torch.float32, "visible")
    bare = [r for r in rows if not {"expect", "at_most", "at_least"} & set(r)]
    assert not bare, bare[:3]
    assert all(r["value"] == r["expect"] for r in rows if "expect" in r)
