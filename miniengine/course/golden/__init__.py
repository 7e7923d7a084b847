"""Golden outputs: the reference's tokens on screened prompts, which every milestone is tested against.

    python -m miniengine golden            # rewrite data/golden/visible.json and autograder/hidden/golden.json
    python -m miniengine golden --check    # exit 1 if the shipped files differ from a fresh regeneration

Screening (miniengine/README.md, The invariant) keeps near-ties out, so that any correct float32
implementation matches token for token:
  * greedy: at every step the top-1 and top-2 logits differ by at least GAP;
  * sampled: the top-1 and top-2 Gumbel-perturbed scores differ by at least GAP,
    and no token within CUTOFF of the top-k or top-p boundary (whose fate a
    float32 implementation could decide differently) wins or comes within GAP.
A sampled case that fails is retried with the next seed; a case that still
fails is cut just before its first near-tie (and dropped if that leaves fewer
than MIN_TOKENS tokens).

The hidden prompts are for the autograder's hidden tests.  They, and their
golden file, live under autograder/hidden/, which ``autograder release`` never
copies to students; without that folder only the visible file is built.

One module per concept, every name importable from the package itself (``golden.GAP``, ``golden.build()``):
:mod:`.dataset` (the prompts, sampler kinds and files; reading and comparing them), :mod:`.screening` (the
margins of one step, GAP and CUTOFF), :mod:`.cases` (the reference's screened cases, and every file built from
them) and :mod:`.command` (``python -m miniengine golden``).
"""
from __future__ import annotations

from miniengine.course.golden.cases import build, build_cases, build_fork_cases, model_sha256
from miniengine.course.golden.command import add_arguments, run
from miniengine.course.golden.dataset import (CASE_KINDS, FEATURE_KINDS, FEATURES_NAME, FORK_N, FORK_PARAMS, FORK_PROMPTS, GQA_MODEL, HIDDEN_DIR,
                                              HIDDEN_FILE, HIDDEN_PROMPTS_FILE, HIDDEN_SEED_BASE, MAX_TOKENS,
                                              QUANT_KINDS, QUANT_SCHEMES, VISIBLE_FILE, VISIBLE_PROMPTS, dumps,
                                              gqa_file, load_golden, quant_file, same)
from miniengine.course.golden.screening import CUTOFF, GAP, MIN_TOKENS, SEED_TRIES, first_unsafe_step, step_margins

__all__ = [
    "GAP", "CUTOFF", "MIN_TOKENS", "SEED_TRIES", "step_margins", "first_unsafe_step",
    "MAX_TOKENS", "HIDDEN_SEED_BASE", "VISIBLE_PROMPTS", "CASE_KINDS", "FEATURE_KINDS", "FEATURES_NAME", "FORK_N", "FORK_PROMPTS", "FORK_PARAMS",
    "QUANT_SCHEMES", "QUANT_KINDS", "GQA_MODEL", "VISIBLE_FILE", "HIDDEN_DIR", "HIDDEN_FILE", "HIDDEN_PROMPTS_FILE",
    "gqa_file", "quant_file", "dumps", "load_golden", "same",
    "model_sha256", "build_cases", "build_fork_cases", "build",
    "run", "add_arguments",
]
