"""Lab 03's shared parts: the answer key, the worked examples' models and paper GPUs, and the helpers every check uses.

Reloaded by ``autograder.labs.lab03`` before its other parts (see that module).
"""
from __future__ import annotations

import contextlib
import math

import autograder.notebook_checks as checks
from miniengine.model import LlamaConfig

# This lab's answer key: any call into it while the tests run fails them (checks.reference_forbidden).
ANSWER_KEY = {
    "miniengine.cost.roofline": ["param_breakdown", "param_count", "weight_bytes", "kv_bytes_per_token",
                                 "_layer_matmul_params", "_cost_from_totals", "forward_cost", "prefill_cost",
                                 "decode_cost", "report", "GPU.ridge_point", "ForwardCost.bytes",
                                 "ForwardCost.arithmetic_intensity", "CostModel._times", "CostModel.step_time",
                                 "CostModel.estimate", "CostModel.decode_run_times", "CostModel.kv_capacity_tokens",
                                 "CostModel.max_batch", "CostModel.ridge_point", "CostModel.effective_ridge_point"],
    "miniengine.model": ["LlamaConfig.kv_bytes_per_token", "Llama.num_parameters"],
}

# The models of the worked examples (miniengine/README.md, section Cost model), built here rather than taken from
# the notebook, so that a cell which changed the notebook's LLAMA3_8B cannot change what is graded.
L8 = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)  # Llama-3-8B
L70 = LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                  num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False)  # Llama-3-70B
MHA = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False)  # Llama-3-8B without GQA
TINY = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=6,
                   num_attention_heads=8, num_key_value_heads=8)  # the course's tiny target model (tied)
KIPPLY = LlamaConfig(vocab_size=256, hidden_size=8192, intermediate_size=21845, num_hidden_layers=64,
                     num_attention_heads=64, num_key_value_heads=64)  # kipply's 52B example (MHA, tiny vocabulary)

# The paper GPUs, as in the notebook's GPUS (dense 16-bit figures from NVIDIA's data sheets).
H100 = {"name": "H100 SXM", "peak_flops": 989e12, "bandwidth": 3.35e12, "memory": 80e9}
H200 = {"name": "H200", "peak_flops": 989e12, "bandwidth": 4.8e12, "memory": 141e9}
A100 = {"name": "A100-80GB", "peak_flops": 312e12, "bandwidth": 2.039e12, "memory": 80e9}
T4 = {"name": "T4", "peak_flops": 65e12, "bandwidth": 0.32e12, "memory": 16e9}
PAPER_GPUS = {"H100": H100, "H200": H200, "A100-80GB": A100, "T4": T4}  # by the names the engine tests use


def num(x, what):
    """A plain float, so that an object which only claims to equal the answer cannot pass."""
    try:
        return float(x)
    except (TypeError, ValueError):
        raise AssertionError(f"{what}: expected a number, got {type(x).__name__} {x!r:.60}") from None


def close(got, want, rel):
    return abs(got - want) <= rel * abs(want)


def gap(got, want) -> float:
    """How far ``got`` is from ``want``, as a share of ``want`` (0 when equal): ``close(got, want, rel)`` is
    ``gap(got, want) <= rel``.  For a relation between two of your own results, observed with its bound."""
    if got == want:
        return 0.0
    return abs(got - want) / abs(want) if want else math.inf


def observe(label, got, want=None, rel=None):
    """What an assertion compared, for the grader (autograder/notebook_checks/ledger.py): ``got`` (a plain number), with the
    figure it must equal (``want``, a visible test's) or be within ``rel`` of; a hidden test passes no ``want``,
    and the grader takes the course's solution's value."""
    checks.observe(label, got, **({} if want is None else {"expect": want}), **({} if rel is None else {"rel": rel}))


def why(got, want, causes):
    """The known mistake whose size matches the error, if any: causes are (got - want if made, what it is)."""
    for delta, text in causes:
        if delta and abs((got - want) - delta) <= 1e-3 * abs(delta):
            return " Likely cause: " + text
    return ""


@contextlib.contextmanager
def graded(what, **functions):
    """Each graded function must be the notebook's own (``def``); while inside, the answer key is forbidden."""
    for name, fn in functions.items():
        checks.require_own(fn, name)
    with checks.reference_forbidden(what, forbidden=ANSWER_KEY):
        yield
