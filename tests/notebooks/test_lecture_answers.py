"""Lectures never print a lab's answer: no getsource of, no re-definition of, and no import of what a lab asks for.

Three checks on the lectures' JSON, no kernel needed: no code cell shows source code through ``inspect``; no
lecture defines a function or class under a name that a lab's solution region defines (a lecture that writes out
``kv_bytes_per_token`` hands Lab 2's first task to whoever reads it); and no lecture imports or calls a lab's
answer key (the course's own version of a graded function, whose results are what the lab grades). A lecture
shows what the course's engine does, and says in prose or a trace how.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LECTURES = sorted((REPO / "lectures").glob("*.ipynb"))
DEFINES = re.compile(r"^(?:async\s+)?(?:def|class)\s+(\w+)", re.M)  # top level only: methods are not answers by name
# Same name, different thing: these lectures' greedy(max_tokens) builds SamplingParams; Lab 1's greedy(logits)
# picks a token.
SAME_NAME_ONLY = {("05_paged_attention.ipynb", "greedy"), ("08_prefix_caching_and_chunked_prefill.ipynb", "greedy")}


def code_cells(path: Path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def lab_solution_names() -> dict[str, list[str]]:
    """Name -> labs, for every def/class in a lab's ``### BEGIN SOLUTION`` cells (none in the student edition)."""
    names: dict[str, list[str]] = {}
    for path in sorted((REPO / "labs").glob("*/*.ipynb")):
        for _, source in code_cells(path):
            if "### BEGIN SOLUTION" in source:
                for name in DEFINES.findall(source):
                    names.setdefault(name, []).append(path.parent.name)
    return names


@pytest.mark.parametrize("path", LECTURES, ids=[p.name for p in LECTURES])
def test_no_lecture_prints_source_code(path):
    shown = [i for i, source in code_cells(path) if re.search(r"\bgetsource(lines)?\s*\(", source)]
    assert not shown, (f"{path.name}: cells {shown} (counting from 0) print source code with inspect; rule 7 says a "
                       f"lecture never prints a lab's answer: describe what the code does, or trace its behaviour")


@pytest.mark.parametrize("path", LECTURES, ids=[p.name for p in LECTURES])
def test_no_lecture_writes_out_a_labs_graded_definition(path):
    graded = lab_solution_names()
    clashes = [(i, name, graded[name]) for i, source in code_cells(path) for name in DEFINES.findall(source)
               if name in graded and (path.name, name) not in SAME_NAME_ONLY]
    assert not clashes, "; ".join(
        f"{path.name}, cell {i}: defines {name}, which {' and '.join(sorted(set(labs)))} ask(s) students to write: "
        f"call the course's version instead (or rename it if it is something else)" for i, name, labs in clashes)


# ---------------------------------------------------------------- answer keys
#
# A lab's answer key is what its harness forbids while a student's code runs (the dicts named ANSWER_KEY in
# autograder/labs/*/, and notebook_checks' FORBIDDEN): the course's own version of what the lab asks students to
# write. A lecture that imports one teaches the reader to call it, and prints what it returns, which is what the lab
# grades (issue 32: Lecture 1 imported Lab 3's counting, miniengine.cost.counting.forward_cost). The check reads the
# lectures' JSON, no kernel: it resolves every import from miniengine, every attribute reached through an imported
# module or class, and every later use of an imported name, to the object it names, so a re-export
# (miniengine.cost.counting.forward_cost is miniengine.cost.roofline.forward_cost) or an alias is caught too. A
# method called on an instance (paper.max_batch(...)) is out of a syntax tree's reach; a lecture that must not show a
# result has to be read for it.

# The course's decoders, run whole by a lecture to show what they do (tokens, tokens processed, timings): their code
# is never shown, and the decoders are what the lectures compare against (Lecture 2's float64 reference beside the
# cached engine). An entry is a lecture and the answer key it may run.
RUNS_THE_COURSE = {
    ("01_inference_workload.ipynb", "miniengine.reference.naive_generate"),
    ("02_kv_cache.ipynb", "miniengine.reference.naive_generate"),
    ("02_kv_cache.ipynb", "miniengine.course.cached_decode.cached_generate"),
    ("03_gpu_view_and_metrics.ipynb", "miniengine.course.cached_decode.cached_generate"),
}
# Issue 32 reviewed lectures 01-03; these are the answer keys lectures 04-09 used when it did. The list only shrinks:
# an entry that no longer occurs fails test_answer_key_exceptions_are_all_used, so delete it with the use.
NOT_YET_REVIEWED = {
    ("05_paged_attention.ipynb", "miniengine.kv.paged.gather_history"),
    ("06_speculative_decoding.ipynb", "miniengine.cost.roofline.weight_bytes"),
    ("06_speculative_decoding.ipynb", "miniengine.sampling.sample_token"),
    ("06_speculative_decoding.ipynb", "miniengine.spec.verify.rejection_verify"),
    ("06_speculative_decoding.ipynb", "miniengine.spec.verify.residual"),
    ("07_gqa_and_quantization.ipynb", "miniengine.cost.roofline.param_count"),
    ("07_gqa_and_quantization.ipynb", "miniengine.course.quant_viz.formats.fake_quant"),
    ("07_gqa_and_quantization.ipynb", "miniengine.gqa.mean_pool_kv"),
    ("07_gqa_and_quantization.ipynb", "miniengine.layers.quant.pack_int4"),
    ("07_gqa_and_quantization.ipynb", "miniengine.layers.quant.unpack_int4"),
    ("08_prefix_caching_and_chunked_prefill.ipynb", "miniengine.engine.scheduler.chunk_to_fit"),
    ("08_prefix_caching_and_chunked_prefill.ipynb", "miniengine.kv.prefix_cache.block_key"),
    ("08_prefix_caching_and_chunked_prefill.ipynb", "miniengine.kv.prefix_cache.block_keys"),
    ("09_parallelism_and_disaggregation.ipynb", "miniengine.cost.roofline.kv_bytes_per_token"),
    ("09_parallelism_and_disaggregation.ipynb", "miniengine.cost.roofline.param_count"),
    ("09_parallelism_and_disaggregation.ipynb", "miniengine.cost.roofline.weight_bytes"),
    ("09_parallelism_and_disaggregation.ipynb", "miniengine.distributed.column_shard"),
    ("09_parallelism_and_disaggregation.ipynb", "miniengine.distributed.row_shard"),
}
EXCEPTIONS = RUNS_THE_COURSE | NOT_YET_REVIEWED
MISSING = object()


def _qualified(key: tuple[str, str]) -> str:
    return f"{key[0]}.{key[1]}"


def _normal(obj):
    """A property as its getter, a static or class method as its function: what both sides of a comparison hold."""
    if isinstance(obj, property):
        return obj.fget
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


def _attribute(obj, name: str):
    """``obj.name`` for a module (a submodule not yet imported included) or a class (the attribute as defined)."""
    if inspect.ismodule(obj):
        found = getattr(obj, name, MISSING)
        if found is MISSING:
            try:
                found = importlib.import_module(f"{obj.__name__}.{name}")
            except ImportError:
                return MISSING
        return found
    if inspect.isclass(obj):
        return inspect.getattr_static(obj, name, MISSING)
    return MISSING


@functools.lru_cache(maxsize=None)
def answer_key_objects() -> dict[int, tuple[str, str]]:
    """id of the object each answer key names -> the key (module, name or Class.method)."""
    from autograder.answer_policy.context import answer_keys

    found = {}
    for module, dotted in sorted(answer_keys()):
        obj = importlib.import_module(module)
        for part in dotted.split("."):
            obj = _attribute(obj, part)
        if obj is not MISSING:  # a key that names nothing is the harness's error, caught by the harness's own tests
            found[id(_normal(obj))] = (module, dotted)
    return found


@functools.lru_cache(maxsize=None)
def key_owners() -> dict[tuple[str, str], list[str]]:
    """Answer key -> where it is listed: the labs' folders under autograder/labs/, or the notebook checks' FORBIDDEN."""
    from autograder.notebook_checks.guard import FORBIDDEN

    owners: dict[tuple[str, str], list[str]] = {}
    for module, names in FORBIDDEN.items():
        for name in names:
            owners.setdefault((module, name), []).append("lab01 (notebook_checks FORBIDDEN)")
    labs = REPO / "autograder" / "labs"
    for path in sorted(labs.rglob("*.py")):
        owner = path.relative_to(labs).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and node.keys and all(
                    isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.startswith("miniengine.")
                    for k in node.keys):
                try:
                    value = ast.literal_eval(node)
                except ValueError:
                    continue
                for module, names in value.items():
                    for name in names if isinstance(names, list) else []:
                        if owner not in owners.setdefault((module, name), []):
                            owners[(module, name)].append(owner)
    return owners


def _chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """``a.b.c`` as ("a", ["b", "c"]); None when the chain does not start at a plain name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def answer_key_uses(path: Path) -> list[tuple[int, tuple[str, str], str]]:
    """(cell index, answer key, what the cell does with it) for every import or use of an answer key in a lecture."""
    from autograder.answer_policy.context import _bindings, parse

    keys = answer_key_objects()
    bound: dict[str, object] = {}  # notebook globals bound to a miniengine module, class or function, cell by cell
    found = []
    for index, source in code_cells(path):
        try:
            tree = parse(source)
        except SyntaxError:
            continue
        seen = set()

        def hit(obj, how):
            key = keys.get(id(_normal(obj)))
            if key is not None and key not in seen:
                seen.add(key)
                found.append((index, key, how))

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "miniengine":
                        top = alias.asname or alias.name.split(".")[0]
                        bound[top] = importlib.import_module(alias.name if alias.asname else "miniengine")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "miniengine" and not node.level:
                module = importlib.import_module(node.module)
                for alias in node.names:
                    obj = _attribute(module, alias.name)
                    if obj is not MISSING:
                        bound[alias.asname or alias.name] = obj
                        hit(obj, f"imports {alias.name} from {node.module}")
        names, imported, _ = _bindings(tree)
        for name in names - set(imported):  # rebound by the cell itself (a def, an assignment): no longer the key
            bound.pop(name, None)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (chain := _chain(node)) and chain[0] in bound:
                obj = bound[chain[0]]
                for depth, attr in enumerate(chain[1]):
                    obj = _attribute(obj, attr)
                    if obj is MISSING:
                        break
                    hit(obj, f"uses {'.'.join([chain[0], *chain[1][:depth + 1]])}")
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in bound:
                hit(bound[node.id], f"calls {node.id}")
    return found


def _allowed(path: Path, key: tuple[str, str]) -> bool:
    return (path.name, _qualified(key)) in EXCEPTIONS


@pytest.mark.parametrize("path", LECTURES, ids=[p.name for p in LECTURES])
def test_no_lecture_imports_or_calls_a_labs_answer_key(path):
    owners = key_owners()
    uses = [(i, key, how) for i, key, how in answer_key_uses(path) if not _allowed(path, key)]
    assert not uses, (
        f"{path.name} uses a lab's answer key, the course's version of what a lab asks students to write (a lecture "
        f"that calls it prints what the lab grades): "
        + "; ".join(f"cell {i} (counting from 0) {how}, which is {_qualified(key)}, the answer key of "
                    f"{' and '.join(owners.get(key, ['a lab']))}" for i, key, how in uses)
        + ". Show what the course's engine does instead, or describe the function in prose")


def test_the_answer_key_check_sees_aliases_modules_and_classes(tmp_path):
    cells = ["from miniengine.cost.counting import forward_cost as count",  # a re-export, under another name
             "import miniengine.cost.roofline as roof\nroof.param_count(None)",  # through a module
             "from miniengine.cost.roofline import CostModel\nCostModel.max_batch",  # a method, through its class
             "count(None)",  # a later cell that calls the alias
             "def count(c):\n    return 0\ncount(None)",  # rebound: no longer the key
             "count(None)"]
    notebook = tmp_path / "lecture.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "source": c} for c in cells]}), encoding="utf-8")
    found = {(i, _qualified(key)) for i, key, _ in answer_key_uses(notebook)}
    assert found == {(0, "miniengine.cost.roofline.forward_cost"), (1, "miniengine.cost.roofline.param_count"),
                     (2, "miniengine.cost.roofline.CostModel.max_batch"), (3, "miniengine.cost.roofline.forward_cost")}


def test_answer_key_exceptions_are_all_used():
    used = {(path.name, _qualified(key)) for path in LECTURES for _, key, _ in answer_key_uses(path)}
    stale = sorted(EXCEPTIONS - used)
    assert not stale, (f"these exceptions no longer occur in their lecture; delete them from "
                       f"tests/notebooks/test_lecture_answers.py so the rule covers them again: {stale}")
