"""The golden set: its prompts and sampler kinds, where its files live, and how to read and compare them.

The visible files are under data/golden/; the hidden prompts and their golden outputs under autograder/hidden/,
which ``autograder release`` never copies to students.
"""
from __future__ import annotations

import json
from pathlib import Path

from miniengine.paths import GOLDEN, REPO_ROOT

MAX_TOKENS = 24
HIDDEN_SEED_BASE = 500_000

VISIBLE_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\ndef list_files(path):",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
    'def is_prime(n):\n    """Return True if n is prime."""',
    "with open(filename) as f:",
    "try:\n    import json\nexcept ImportError:",
    "def read_config(path):\n    config = {}",
]
# One case per sampler the course builds: greedy, plain temperature, top-k, top-p, and all three.
CASE_KINDS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.8),
    "top_k": dict(temperature=1.0, top_k=20),
    "top_p": dict(temperature=1.0, top_p=0.8),
    "combined": dict(temperature=0.7, top_k=40, top_p=0.9),
}
# What an OpenAI client adds (SamplingParams' penalties, min_p, logprobs), in a file of their own (FEATURES_FILE), so
# that the milestones' golden cases stay as they are.  Stop strings are text: the tests cut golden texts themselves.
FEATURE_KINDS = {
    "repetition": dict(temperature=0.0, repetition_penalty=1.3),
    "penalties": dict(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.8),
    "min_p": dict(temperature=1.0, min_p=0.1, logprobs=3),
    "all": dict(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.1, frequency_penalty=0.3),
}
# SamplingParams(n=FORK_N) cases: the reference runs each completion on its own, with its derived seed
# (miniengine.sampling.child_seed); an engine that forks after the prefill must match every one.
FORK_N = 4
FORK_PROMPTS = 3  # the first prompts of each file get an n > 1 case
FORK_PARAMS = dict(temperature=0.8, top_k=40)
# Quantized models (milestone 7): the reference runs the *dequantized* weights, the very numbers the
# quantized engine computes with, so exactness is tested apart from the quality the quantization costs.
QUANT_SCHEMES = ("int8", "int4")  # int4 with the engine's default group size
QUANT_KINDS = {k: CASE_KINDS[k] for k in ("greedy", "combined")}
# The GQA model converted from the target (milestone 7): golden cases of its own, from the same reference.
GQA_MODEL = "target-gqa2"
VISIBLE_FILE = GOLDEN / "visible.json"
HIDDEN_DIR = REPO_ROOT / "autograder" / "hidden"
HIDDEN_FILE = HIDDEN_DIR / "golden.json"
HIDDEN_PROMPTS_FILE = HIDDEN_DIR / "prompts.json"  # instructor-only, like the golden file built from it
FEATURES_NAME = "sampling_features.json"  # data/golden/ and autograder/hidden/


def gqa_file(hidden: bool = False) -> Path:
    return (HIDDEN_DIR if hidden else GOLDEN) / f"{GQA_MODEL.replace('target-', '')}.json"


def quant_file(scheme: str, hidden: bool = False) -> Path:
    return (HIDDEN_DIR if hidden else GOLDEN) / f"{scheme}.json"



def dumps(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


def load_golden(path: Path = VISIBLE_FILE) -> dict:
    return json.loads(Path(path).read_text())


def same(a, b, tol: float = 1e-5) -> bool:
    """Equal, except that floats may differ by ``tol`` (BLAS summation order varies across machines)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol * max(1.0, abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b))
    return a == b
