"""Lab 02: the hidden cells of kv_bytes_per_token and of the numbers hold their inputs only (the answer sheet takes the
expected values from the solution): the solution's answers on them are what the course's LlamaConfig computes.
"""
import json

import pytest
from lab_literals import LLAMA3_8B, Harness

from miniengine.model import LlamaConfig
from miniengine.paths import REPO_ROOT

LAB02 = REPO_ROOT / "labs" / "lab02_kv_cache" / "lab02_kv_cache.ipynb"


def lab02_cell(grade_id: str) -> str:
    return next("".join(c["source"]) for c in json.loads(LAB02.read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def lab02_calls(grade_id: str) -> list:
    """The harness calls test cell ``grade_id`` makes, with the harness's own configs (its other calls recorded)."""
    import importlib

    import autograder.labs

    real = importlib.reload(autograder.labs).pristine("lab02")
    calls: list = []
    harness = Harness(real, calls)
    source = "".join(ln for ln in lab02_cell(grade_id).splitlines(True) if "importlib" not in ln)
    exec(source, {"lab": harness, "kv_bytes_per_token": None, "globals": lambda: {}})
    return calls


def lab02_solution() -> dict:
    """The solution's kv_bytes_per_token and numbers cells, run on the target model's config."""
    from types import SimpleNamespace

    from miniengine.model import load_config
    from miniengine.paths import TARGET

    ns = {"__name__": "__main__", "cfg": load_config(TARGET), "SimpleNamespace": SimpleNamespace}
    for gid in ("kv_bytes_per_token", "numbers"):
        exec(lab02_cell(gid), ns)
    return ns


def test_lab02_hidden_kv_bytes_cases_are_inputs_and_the_solution_gives_the_course_figures():
    (name, (_, cases), kwargs), = lab02_calls("kv-bytes-hidden")
    assert name == "check_kv_bytes" and kwargs == {"hidden": True} and len(cases) >= 4
    solution = lab02_solution()["kv_bytes_per_token"]
    for what, c, bpv, *rest in cases:
        assert not rest, f"{what}: a hidden case holds its inputs only"
        course = LlamaConfig(hidden_size=c.num_attention_heads * c.head_dim, num_hidden_layers=c.num_hidden_layers,
                             num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads)
        assert solution(c, bpv) == course.kv_bytes_per_token(bpv), what


def test_lab02_numbers_of_the_solution_are_what_the_course_computes():
    """The hidden numbers test reports the student's values; the sheet takes the right ones from the solution."""
    from miniengine.model import load_config
    from miniengine.paths import TARGET

    (name, (_, tolerances), _), = lab02_calls("numbers-hidden")
    assert name == "report_numbers" and all(isinstance(t, (int, float)) for t in tolerances.values())
    got = lab02_solution()
    tiny = load_config(TARGET)
    llama3_8b = LLAMA3_8B
    llama3_70b = LlamaConfig(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8)
    stored = 50 + 60 - 1  # a 50-token prompt, 60 generated: every token but the last is fed, so stored
    flops = 2 * 8.0e9 * 8192
    want = {"positions_stored": stored, "reserved_fraction_used": stored / 500,
            "unused_bytes_tiny": (500 - stored) * tiny.kv_bytes_per_token(4),
            "unused_bytes_llama3_8b": (500 - stored) * llama3_8b.kv_bytes_per_token(2),
            "llama3_8b_sequence_gb": 8192 * llama3_8b.kv_bytes_per_token(2) / 1e9, "recompute_flops": flops,
            "recompute_seconds_h100": flops / 989e12, "llama3_70b_kv_bytes_per_token": llama3_70b.kv_bytes_per_token(2)}
    assert set(tolerances) == set(want)
    assert {name: got[name] for name in want} == pytest.approx(want, rel=1e-12)
    assert want["unused_bytes_tiny"] == 4804608 and want["llama3_70b_kv_bytes_per_token"] == 327680  # the old literals
