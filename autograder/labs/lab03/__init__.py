"""Lab 03's tests (roofline accounting): what each test cell checks, task by task.

Every test first turns your results into plain numbers (``num``: a float; ``checks.as_count``: an int where the task
says int), so an object that claims to equal anything cannot pass, checks that each graded function is your own
(written with ``def`` in the notebook), and fails if your code calls the course's cost model (``ANSWER_KEY``:
``miniengine.cost.roofline``'s counting functions, ``CostModel``, ``ForwardCost``, ``GPU.ridge_point``,
``LlamaConfig.kv_bytes_per_token`` and ``Llama.num_parameters``), under any name. The models and paper GPUs of the
worked examples (miniengine/README.md, section Cost model) are built here, in ``lab03_common``. Visible tests
compare with the worked examples, within 1% (the precision they are quoted to), or with the task's formula; hidden
tests run the same kinds of check on other models, GPUs, batches and contexts, and hold their inputs only. Where a
wrong answer is off by exactly what a usual mistake would cost, the message names that mistake ("Likely cause: ...").

A verdict never rests on this kernel's word (autograder/notebook_checks/ledger.py): besides its assertion, every check
``observe``s what it measured of your code (your counts, times and figures as plain numbers, a measured ratio, your
predictions), and the grader judges those outside the notebook, against the same observations of the course's
solution (a hidden test's right values never enter the notebook; the held-out step times neither: the grader's
judge ``lab03-heldout-mape``, autograder/grade/yardsticks.py, prices your predictions against them).

Task 1, param_count (param-count-visible/-hidden, lab03/counts.py): Llama-3-8B, 70B and 8B without GQA within 1%
  of the worked example "Model size", the tiny model exactly (what torch counts). Hidden: other shapes, exactly.
Task 2, kv_bytes_per_token (kv-bytes-visible/-hidden): the worked example "KV per token" exactly, 8-bit and int4
  values (0.5 bytes: not rounded), the 16-bit default, and a 128K-token request holding 16 GiB.
Task 3, forward_flops (flops-visible/-hidden): kipply's 2 x 12 x L x d^2 per token; the worked prefills (21.2 us
  per token at 2048 tokens, about 33 at 32K, compute-bound); then the rules: the causal mask's pairs (the second
  difference in T is one pair), one pair per cached token, the LM head only where logits are used, a batch costing
  the sum of its sequences, a tied model's head. Hidden: ragged batches, logits="all", tied and GQA models.
Task 4, forward_bytes (bytes-visible/-hidden): the weights once (one embedding row per new token), the KV history
  read and the new KV written, on Llama-3-8B; the worked decode intensity (about 1 FLOP/byte, with your
  forward_flops) and KV share (70% at batch 256); 8-bit, int4 weights with a 16-bit cache, a ragged batch, a tied
  model in float32. A failure also says when your param_count or kv_bytes_per_token is the cause.
Task 5, step_time and ridge_point (step-time-visible/-hidden, lab03/time.py): the worked ridge points and the
  bandwidth floor within 1%, then the formula max(compute, memory) + overhead exactly, with the defaults and other
  settings. seed-tables-visible prices the worked tables with your three functions: decode per token at batch 1,
  64 and 256, short and long prefills, the A100, the memory/compute crossover, and GQA.
Task 6, kv_capacity_tokens and max_batch (memory-visible/-hidden): the worked capacities on an H100 exactly,
  Llama-3-70B not fitting, the 64-fold throughput drop from context 512 to 32K, and the keyword settings passed on.
Task 7, your engine (engine-visible/-hidden): the simulator, driving the engine's scheduler, serves seeded chat
  workloads on your cost model (continuous and static batching); its last token, median TTFT and TPOT and
  throughput must match the course's figures to 1e-6.
Numbers you derive (numbers-visible/-roofline-hidden/-memory-hidden, lab03/numbers.py): each answer of the right
  kind (visible); each value within its tolerance (hidden, judged by the grader; the message names the answer that
  is off).
Design, calibrate (design-interface-visible, design-mape-visible/-hidden, lab03/calibrate.py): your cost model,
  fitted to the shipped step times (the course's CPU), prices any shape (more layers or width cost more; a near shape
  costs the same), never takes less time for more work, refuses bad input with ValueError and drives the simulator;
  fitted without some slices of the training file it predicts them (visible), and fitted on the whole file, the
  held-out configurations (hidden: the cell holds the configurations only; your predictions go to the grader, whose
  judge prices them against the held-out measurements: the message names each slice's MAPE, never a point).  Full
  points at the target MAPE, a linear share of them down to the uncalibrated baseline's MAPE, none beyond; a missed
  target does not raise in the notebook (the grader gives the share), a broken interface does.
"""
from __future__ import annotations

import importlib

from autograder.labs.lab03 import (calibrate as lab03_calibrate, common as lab03_common, counts as lab03_counts,  # noqa: E402
                                   exact as lab03_hidden, numbers as lab03_numbers, time as lab03_time)

# `pristine` reloads this file only: its parts afresh too, each one's dependencies before it.
for _part in (lab03_common, lab03_counts, lab03_hidden, lab03_time, lab03_numbers, lab03_calibrate):
    importlib.reload(_part)

from autograder.labs.lab03.calibrate import check_calibration, check_calibration_hidden, check_interface
from autograder.labs.lab03.common import A100, ANSWER_KEY, H100, H200, KIPPLY, L8, L70, MHA, PAPER_GPUS, T4, TINY
from autograder.labs.lab03.counts import check_bytes, check_flops, check_kv_bytes, check_param_count  # noqa: E402
from autograder.labs.lab03.exact import (check_bytes_exact, check_flops_exact, check_kv_bytes_exact,  # noqa: E402
                                         check_param_count_exact)
from autograder.labs.lab03.numbers import check_answer_forms, report_answer_values  # noqa: E402
from autograder.labs.lab03.time import (check_engine, check_memory, check_memory_exact, check_ridge_and_step,  # noqa: E402
                                        check_ridge_and_step_exact, check_worked_tables)

__all__ = ["ANSWER_KEY", "L8", "L70", "MHA", "TINY", "KIPPLY", "H100", "H200", "A100", "T4", "PAPER_GPUS",
           "check_param_count", "check_param_count_exact", "check_kv_bytes", "check_kv_bytes_exact", "check_flops",
           "check_flops_exact", "check_bytes", "check_bytes_exact", "check_ridge_and_step",
           "check_ridge_and_step_exact", "check_worked_tables", "check_memory", "check_memory_exact", "check_engine",
           "check_answer_forms", "report_answer_values", "check_interface", "check_calibration",
           "check_calibration_hidden"]
