"""Lab 04's tests (continuous batching): what each test cell checks, task by task.

Every test checks that what it grades is your own (``fits`` written with ``def``; ``ContinuousBatching`` and
``StaticBatching`` written with ``class`` in the notebook, each with its own ``admit``), and fails if your code calls
the course's policies (``ANSWER_KEY``: ``miniengine.engine.policy``'s ``fits``, ``FCFSPolicy.admit`` and
``StaticBatching``), under any name. Answers are read as plain values first: ``fits`` must return a real bool, and
``admit``'s answer is read as the positions in the queue of the sequences it returned (by identity: returning
anything else, or a sequence twice, fails). Where a policy calls ``fits`` by name, the course's ``fits`` is lent in
its place while the test runs (``checks.course_parts_under``), so that a mistake in ``fits`` costs only Task 1.
Every check also observes what it found (checks.observe: your answers, tokens and figures as plain values), and the
grader compares that with the answer sheet outside your notebook. Hidden cells hold their cases' inputs only: the
right answers stay with the grader (the course's solution's, on the same inputs); where they need the reference's
tokens, they only report yours, and the grader compares them with the hidden golden files.

Task 1, fits (fits-visible/-hidden, lab04/admit.py): a seat left, the prompt within the tokens left (the boundary
  included), KV memory for it, asked of can_allocate with the sequence itself.
Task 2, ContinuousBatching.admit (admit-visible/-hidden): small queues built by hand: the answer must be the longest
  run from the head of the queue that fits the seats, tokens and KV memory left (a later, smaller request must not
  overtake: the message names the overtaking), with the budget already counting the running decodes.
Task 3, ContinuousBatching on the engine (replay-visible/-hidden, lab04/engine.py): the real engine, on a virtual
  clock, replays two golden cases of each kind as a seeded Poisson trace, and a burst of long prompts first, under
  small budgets. After every step the scheduler's invariants must hold: nobody queued twice, lost or still queued
  once finished; at most max_num_seqs sequences and max_num_batched_tokens tokens; prefills admitted in queue
  order; KV reservations matching the running requests. Every request must be served, with its golden tokens
  (hidden: the two runs must agree, and the grader compares the burst's tokens).
Task 4, ContinuousBatching on the simulator (sim-visible/-hidden): Llama-3-8B on a paper GPU serves a seeded burst
  of chat requests; the serving report (goodput, SLO attainment, throughput, TTFT P99, TPOT P50) must match the
  course's figures to 1e-6 (visible: pasted in the cell; hidden: held by the grader).
Task 5, StaticBatching.admit (static-visible/-hidden, lab04/admit.py): nobody while a batch runs; a full batch, or
  a partial one once its oldest request has waited timeout_s; within the seats and tokens, in order; the admitted
  batch kept in self.batch.
Task 6, your engine (engine-visible/-hidden, lab04/engine.py): LLM with your ContinuousBatching (and your fits)
  serves every golden case, token for token (hidden: compared by the grader).
Design, SLOAwarePolicy (design-policy-visible/-hidden, design-engine-visible, lab04/design.py): the harness builds
  seeded overload traces, runs the simulator with your policy and computes goodput from the timelines; the mean
  ratio to FCFS's goodput earns full points at 1.15, none at 1.0, partial credit between; nobody who waited 5 s may
  be overtaken, every request must be served; on the real engine, every golden case token for token.
Numbers (numbers, lab04/design.py): three figures from the simulator, checked only when graded.
"""
from __future__ import annotations

import importlib

from autograder import notebook_checks as checks  # noqa: F401  (the cells reach HiddenReport through lab.checks)
from autograder.labs.lab04 import (admit as lab04_admit, common as lab04_common, design as lab04_design,  # noqa: E402
                                   engine as lab04_engine)

# `pristine` reloads this file only: its parts afresh too, each one's dependencies before it.
for _part in (lab04_common, lab04_admit, lab04_engine, lab04_design):
    importlib.reload(_part)

from autograder.labs.lab04.admit import check_continuous, check_fits, check_static  # noqa: E402
from autograder.labs.lab04.common import ANSWER_KEY  # noqa: E402
from autograder.labs.lab04.design import check_design_engine, check_numbers, check_policy, report_numbers  # noqa: E402
from autograder.labs.lab04.engine import check_engine, check_replay, check_sim, report_engine, report_replay  # noqa: E402

VISIBLE_GOLDEN = checks.VISIBLE_GOLDEN  # data/golden/visible.json: the visible golden runs

__all__ = ["ANSWER_KEY", "VISIBLE_GOLDEN", "check_fits", "check_continuous", "check_static", "check_replay",
           "report_replay", "check_sim", "check_engine", "report_engine", "check_policy", "check_design_engine", "check_numbers",
           "report_numbers"]
