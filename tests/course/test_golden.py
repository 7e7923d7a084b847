"""The golden files: screened, reproducible, and hidden prompts kept out of what students receive."""
import subprocess

import pytest

from miniengine.course import golden as golden_mod
from miniengine.paths import REPO_ROOT
from miniengine.sampling import SamplingParams


@pytest.mark.slow  # a whole benchmark or regeneration: make test runs it, make quick does not
def test_shipped_golden_files_equal_a_fresh_regeneration():
    fresh = golden_mod.build()
    for path, data in fresh.items():
        assert golden_mod.same(data, golden_mod.load_golden(path)), f"{path} is stale: run python -m miniengine golden"


def test_every_case_clears_the_screening_margins(golden, hidden_golden):
    for data in (golden, hidden_golden):
        assert data["cases"], "no golden cases"
        for c in data["cases"]:
            m = c["min_margins"]
            assert m["gap"] >= golden_mod.GAP, c["name"]
            SamplingParams(**c["params"])  # well-formed


def test_quantized_and_fork_cases_clear_the_margins_too(golden, hidden_golden):
    import json
    files = [golden_mod.quant_file(s, hidden=h) for s in golden_mod.QUANT_SCHEMES for h in (False, True)]
    for path in files:
        data = json.loads(path.read_text())
        assert data["quantization"] in golden_mod.QUANT_SCHEMES and len(data["cases"]) >= 12, path
        for c in data["cases"]:
            assert c["min_margins"]["gap"] >= golden_mod.GAP, (path.name, c["name"])
    for data in (golden, hidden_golden):
        assert len(data["fork_cases"]) == golden_mod.FORK_PROMPTS
        for c in data["fork_cases"]:
            assert c["min_margins"]["gap"] >= golden_mod.GAP and len(c["completions"]) == golden_mod.FORK_N


def test_visible_golden_covers_every_sampler(golden):
    kinds = {c["name"].split("-", 1)[1] for c in golden["cases"]}
    assert kinds == set(golden_mod.CASE_KINDS)


def test_hidden_prompts_are_absent_from_student_facing_files(hidden_golden):
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=REPO_ROOT).stdout.split()
    student_facing = [p for p in tracked if not p.startswith("autograder/hidden/")]
    hidden = {c["prompt"] for c in hidden_golden["cases"]}
    for path in student_facing:
        try:
            text = (REPO_ROOT / path).read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for prompt in hidden:
            assert prompt not in text, f"hidden prompt {prompt!r} appears in {path}"
