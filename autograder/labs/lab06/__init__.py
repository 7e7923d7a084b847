"""Lab 06's tests: speculative decoding. What each test cell checks, task by task.

Every test runs with this lab's answer key forbidden (``ANSWER_KEY``: the course's ``rejection_verify``, its helpers
``residual`` and ``sample_from``, and ``BlockManager.truncate``): a call into it, under any name, fails the test.
Your ``rejection_verify`` and your ``BlockManager`` class are passed in by the cells. Hidden tests run the same
checks on the cases of their own cells (other distributions, keys, prompts, positions, block sizes and γ).

A verdict never rests on this kernel's word (autograder/notebook_checks/ledger.py): besides its assertion, every check
``observe``s what it measured of your code (your tokens, your tables' sizes, a frequency's distance from the rule's
with the assertion's own bound, that an invariant held), and the grader judges those outside the notebook, against
the same observations of the course's solution. A hidden cell holds its inputs only: the keyed steps' tokens and the
scripts' table sizes it must give stay with the grader.

Task 1, ``rejection_verify`` (every answer is first made plain ints, and must be 1 to γ + 1 tokens of the
vocabulary: the accepted drafts in order, then one token of the target's; target_logits and draft_probs unchanged):
  enumeration-visible/-hidden (lab06/verifier.py): on small hand-made distributions p (target) and q (draft),
  every draft x that q can propose is verified with seeds 0 .. 999. Its acceptance frequency must be
  min(1, p(x)/q(x)), its replacements after a rejection must follow the residual normalize(max(0, p - q)), its
  bonus tokens after an acceptance the last row; and the step's distribution, summed exactly over the drafts with
  weights q(x), must be p (within 0.04). A failure names the likeliest mistake.
  keyed-visible/-hidden (lab06/verifier.py): hand-made steps of up to 4 drafts, each run three times (the same
  answer every time: keyed randomness), must give exactly the tokens pasted in the visible cell (a visible failure
  explains the first decision that went the other way, with the coin and the residual behind it); the hidden steps'
  tokens are compared by the grader.
  chisquare-visible/-hidden (lab06/chisquare.py): at one position of a golden prompt, on the real (float64) target
  and draft, keyed verifications of a draft sampled from q (seeds 0 .. n - 1) must emit first tokens that pass a
  chi-square test against p at the cell's significance, and be accepted at the rate 1 - TV(p, q) (4 standard
  errors).

Task 2, ``BlockManager.truncate`` (your class must be written in the notebook, on kv.BlockManager, with its own
truncate):
  truncate-visible/-hidden (lab06/blocks.py): scripted allocations, drafts (the course's append_slot), rollbacks
  and forks on small pools, with the course's other methods off limits while your truncate runs. After every
  operation the reference counts, the free list and the tables must agree (no leak, no block free twice or free
  while held); after every truncate the table is its first ceil(num_tokens / block_size) blocks, each released
  block's count dropped by one, only the ones no table holds any more went back on the free list, and nothing else
  changed. A failure lists the operations that led to it.
  rollback-visible/-hidden (lab06/engine.py): the course's engine on your BlockManager, verifying with the course's
  coupled verifier, serves golden requests (and n = 4 forks) in a pool small enough to preempt; every rollback is
  checked as above as it happens, after every step exactly the running sequences hold tables covering their
  confirmed positions, and at the end the pool is free again. Visible: the golden tokens. Hidden: the grader
  compares the tokens with hidden golden ones, and a second run with another γ and block size must repeat them.

Task 3, your engine (engine-visible/-hidden, lab06/engine.py): the same engine on your verifier and your truncate
  serves the greedy golden requests token for token (hidden: compared by the grader), and sampled requests checked
  for the engine's invariants only (an answer must never re-draw a rejected draft).

Design, your ``PromptLookupProposer`` (lab06/design.py):
  design-args-visible: bad constructor arguments raise ValueError naming the field.
  design-lookup-visible/-hidden: the golden prompts (hidden: other prompts), greedy, 128 tokens, through your
  proposer in the course's engine with the coupled verifier: the tokens must be plain decoding's, and the engine's
  own counts give tokens per target call (at least MIN_TOKENS_PER_CALL, partial credit down to plain decoding's 1.0)
  and rejected drafts per emitted token (at most MAX_REJECTED_PER_TOKEN). No model may run while it proposes.
Numbers (numbers): each is a finite number here; its value is compared with the right one when graded.
"""
from __future__ import annotations

import importlib

import torch

from autograder import notebook_checks as checks  # noqa: F401  (the cells reach HiddenReport through lab.checks)
from autograder.labs.lab06 import (blocks as lab06_blocks, chisquare as lab06_chisquare, common as lab06_common,  # noqa: E402
                                   design as lab06_design, engine as lab06_engine, verifier as lab06_verifier)

# `pristine` reloads this file only: its parts afresh too, each one's dependencies before it.
for _part in (lab06_common, lab06_verifier, lab06_chisquare, lab06_blocks, lab06_engine, lab06_design):
    importlib.reload(_part)

from autograder.labs.lab06.blocks import check_scripts, own_block_manager  # noqa: E402
from autograder.labs.lab06.chisquare import check_chi_square  # noqa: E402
from autograder.labs.lab06.common import ANSWER_KEY, TRUNCATE_KEY  # noqa: E402
from autograder.labs.lab06.design import (check_lookup, check_lookup_hidden, check_numbers,  # noqa: E402
                                          check_proposer_arguments, report_numbers, speculative_engine)
from autograder.labs.lab06.engine import check_same_tokens, of_each_kind, on_the_engine, report_run, visible_golden
from autograder.labs.lab06.verifier import check_enumeration, check_keyed  # noqa: E402

torch.set_num_threads(1)  # the tiny models' many small steps run fastest on one thread

__all__ = ["ANSWER_KEY", "TRUNCATE_KEY", "check_enumeration", "check_keyed", "check_chi_square", "check_scripts",
           "own_block_manager", "on_the_engine", "visible_golden", "of_each_kind", "report_run", "check_same_tokens",
           "check_proposer_arguments", "check_lookup", "check_lookup_hidden", "check_numbers", "report_numbers",
           "speculative_engine"]
