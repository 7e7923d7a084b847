"""Lab 05's tests: PagedAttention. What each test cell checks, task by task.

Every test runs with this lab's answer key forbidden (``ANSWER_KEY``: the course's ``blocks_needed``, every method of
its ``BlockManager``, and its ``gather_history``): a call into it, under any name, fails the test, and so does a
method your class inherits from the course's. Your ``BlockManager`` (a class of the notebook, each of its seven
methods its own) and your ``gather_history`` are passed in by the cells. Hidden tests run the same checks on the
cases of their own cells (other pools, block sizes, random seeds and prompts). Every check also observes what it
found (checks.observe): each operation's outcome, the slot each gathered key came from, the tokens, and what it
measured on the course's engine (preemptions, copies, sequences running together); the grader compares them with the
answer sheet (the course's solution's observations) outside your notebook.

Task 1, ``BlockManager`` (lab05/tracker.py). Your manager is driven the way the scheduler drives it: can_allocate
then allocate; a decode step (num_tokens + 1), can_append then append_slot, or a preemption (free) when can_append
says no; fork; free. After every operation: exactly the live sequences hold tables; ref_count[b] is the number of
tables that hold b; the free list holds every free block once and no held block; free blocks and held blocks make up
the whole pool (no leak); each table holds ceil(num_tokens / block_size) blocks; num_free_blocks is the free list's
length; and the operation changed no other sequence's table. can_allocate and can_append must give True or False,
and the right one. allocate takes free blocks only. append_slot returns None when the position starts a new block
(the table grows by one free block) or lies in a block the sequence holds alone (the table stays); in a shared block
it must copy-on-write: return (src, dst), the shared block and a free one that replaces it in this table only;
either way the block holding the new position is then held once. fork gives the child a list of its own with the
parent's blocks and takes none. free puts back every block the sequence held alone, and only those. A failure lists
the operations that led to it.
  blocks-visible/-hidden: scripted operations without forks (check_scripts).
  cow-visible/-hidden: scripted operations with forks and copies-on-write (check_scripts).
  invariants-visible/-hidden: seeded random operations, mostly decode steps, then every sequence freed (check_random).

Task 2, ``gather_history`` (gather-visible/-hidden, check_gather): on a random pool and hand-built block tables, the
result must be a tensor of shape [B, num_keys, kv_heads, head_dim] and the cache's dtype, whose entry [b, j] is
cache[block_tables[b, j // block_size], j % block_size]; the cache must not change. A failure says which slot a
wrong key came from.

Task 3, your engine (lab05/engine.py; after every step of the engine, exactly the running sequences hold tables,
each covering its cached positions, and the pool adds up; at the end every block is free again):
  engine-visible/-hidden (check_pressure): LLM on your BlockManager and your gather serves golden requests (visible:
  two of each sampling kind, and an n = 4 request whose prompt ends part-way through a block, so that its completions
  part inside a shared block) in a pool a quarter of the size they would reserve. Visible: each request's tokens must
  be the golden ones; hidden: the grader compares them. Something must have been preempted.
  sharing-visible/-hidden (check_sharing, with the course's gather lent in place of yours): a request with n
  completions shares its prompt's blocks; completion 1 decodes alone first and must get a private copy of the
  shared last block, holding the prompt's K/V, while the parent's blocks keep theirs in every layer; then every
  completion's tokens are compared (hidden: by the grader). And in kv_tokens positions, more requests must run
  together than contiguous reservation ever fits, kv_tokens // min(prompt + max_tokens), token for token.

Task 4, the design part (design-paged-visible/-hidden, lab05/search.py): your paged_search on Lab 01's search prompts
(visible: data/golden/lab01_search.json; hidden: its hidden twin, inputs only), each on a fresh SearchSession (the
course's paged pool in float64, blocks of 4). The harness counts the passes (at most the budget), reads the peak
blocks from the session's own block manager (the mean over the prompts is the target, with the unshared layout's
value as the baseline), checks that no block is held when the search returns, and scores the completions with the
float64 model against Lab 01's target (greedy decoding's value as the baseline). The smallest share of the two
targets is the share of the points.

Numbers (numbers, check_numbers): FORK_BLOCKS and SAVED_SHARE, each a number here; their values are compared with the
right ones by the grader, within the cell's tolerance.
"""
from __future__ import annotations

import importlib

import numpy as np
import torch

from autograder import notebook_checks as checks  # the cells reach HiddenReport through lab.checks
from autograder.labs.lab05 import (common as lab05_common, engine as lab05_engine, search as lab05_search,
                                   tracker as lab05_tracker)

# `pristine` reloads this file only: its parts afresh too, each one's dependencies before it.
for _part in (lab05_common, lab05_tracker, lab05_engine, lab05_search):
    importlib.reload(_part)

from autograder.labs.lab05.common import ANSWER_KEY, own_block_manager  # noqa: E402
from autograder.labs.lab05.engine import (check_fork, check_more_than_contiguous, golden_cases, golden_fork_case,  # noqa: E402
                                          report_tokens, serve)
from autograder.labs.lab05.search import SearchSession, check_paged_search, report_paged_search  # noqa: E402
from autograder.labs.shared import check_numbers, report_numbers  # noqa: E402
from autograder.labs.lab05.tracker import check_random, check_scripts  # noqa: E402

VISIBLE_GOLDEN = checks.VISIBLE_GOLDEN  # data/golden/visible.json: the visible prompts and their golden tokens

__all__ = ["ANSWER_KEY", "VISIBLE_GOLDEN", "check_scripts", "check_random", "check_gather", "golden_cases",
           "golden_fork_case", "check_pressure", "check_sharing"]


def check_gather(gather_history, cases, label):
    """Each case: random K values in a pool, block tables, num_keys; the result must follow the formula
    result[b, j] = cache[block_tables[b, j // block_size], j % block_size]. Observed for the grader: the cache left
    unchanged, the result's shape and dtype, and the slot of the cache each key came from (a hidden case, label
    "hidden ...", without the expected ones: the grader holds them). Returns how many cases passed."""
    checks.require_own(gather_history, "gather_history")
    hidden = label.startswith("hidden")
    with checks.reference_forbidden("gather_history", forbidden=ANSWER_KEY):
        for what, num_blocks, block_size, heads, dim, tables, num_keys, dtype, seed in cases:
            name = f"{label}{what}"  # the observations' labels; the messages say the whole case
            what = (f"{label}{what} (cache [{num_blocks}, {block_size}, {heads}, {dim}] {str(dtype)[6:]}, "
                    f"block_tables {tables}, num_keys={num_keys})")
            g = torch.Generator().manual_seed(seed)
            cache = torch.randn(num_blocks, block_size, heads, dim, generator=g, dtype=torch.float64).to(dtype)
            before = cache.clone()
            try:
                got = gather_history(cache, torch.tensor(tables, dtype=torch.long), num_keys)
            except Exception as e:
                raise AssertionError(f"{what}: gather_history raised {type(e).__name__}: {e}") from e
            assert isinstance(got, torch.Tensor), f"{what}: expected a tensor, got {type(got).__name__}"
            unchanged = torch.equal(cache, before)
            checks.observe(f"{name}: the cache unchanged", unchanged, expect=True)
            assert unchanged, f"{what}: gather_history changed the cache; it must only read it"
            shape = tuple(int(s) for s in got.shape)
            want_shape = (len(tables), num_keys, heads, dim)
            checks.observe(f"{name}: shape", list(shape), **({} if hidden else {"expect": list(want_shape)}))
            assert hidden or shape == want_shape, (f"{what}: expected shape {want_shape} = [B, num_keys, kv_heads, "
                                                   f"head_dim], got {shape}")
            assert shape == want_shape, f"{what}: got shape {shape}, which is not [B, num_keys, kv_heads, head_dim]"
            checks.observe(f"{name}: dtype", str(got.dtype), expect=str(dtype))  # the cache's, an input
            assert got.dtype == dtype, f"{what}: expected the cache's dtype {dtype}, got {got.dtype}"
            got, pool = got.detach().cpu().numpy(), cache.numpy()
            checks.observe(f"{name}: the slot each key came from", slots(got, pool),
                           **({} if hidden else {"expect": formula_slots(tables, num_keys, block_size)}))
            wrong_key(got, pool, tables, num_keys, block_size, what, hidden)
    return len(cases)


def slots(got, pool):
    """[b][j]: the [block, offset] of the cache slot key j of sequence b holds, or None when it is in no slot."""
    where = {pool[x, y].tobytes(): [x, y] for x in range(pool.shape[0]) for y in range(pool.shape[1])}
    return [[where.get(row.astype(pool.dtype).tobytes()) for row in seq] for seq in got]


def formula_slots(tables, num_keys, block_size):
    """[b][j]: the slot the formula names, [block_tables[b][j // block_size], j % block_size]."""
    return [[[table[j // block_size], j % block_size] for j in range(num_keys)] for table in tables]


def wrong_key(got, pool, tables, num_keys, block_size, what, hidden=False):
    """Every key by the formula; the first wrong one names the slot it came from, if it came from one (and, in a
    visible case, the slot it should come from)."""
    num_blocks = pool.shape[0]
    for b, table in enumerate(tables):
        for j in range(num_keys):
            block, offset = table[j // block_size], j % block_size
            if np.array_equal(got[b, j], pool[block, offset]):
                continue
            found = [(int(x), int(y)) for x in range(num_blocks) for y in range(block_size)
                     if np.array_equal(got[b, j], pool[x, y])]
            holds = (f"cache[{found[0][0]}, {found[0][1]}]" if found else "values that are in no slot of the cache")
            if hidden:
                raise AssertionError(f"{what}: key {j} of sequence {b} holds {holds}, not the slot the formula "
                                     f"result[b, j] = cache[block_tables[b, j // block_size], j % block_size] names")
            raise AssertionError(
                f"{what}: key {j} of sequence {b} should be cache[{block}, {offset}] (its table's block "
                f"{j // block_size} is {block}, offset {j} % {block_size} = {offset}), but it holds {holds}")


def check_pressure(BlockManager, gather_history, cases, block_size, max_num_seqs, label, report=None, forks=()):
    """LLM on your BlockManager and your gather serves the cases, and the n > 1 ``forks`` (their completions share
    the prompt's blocks, the last one part full), in a quarter of the positions they would reserve; something must
    be preempted. Visible (no report): the golden tokens. Hidden: the tokens go to the report."""
    own_block_manager(BlockManager)
    checks.require_own(gather_history, "gather_history")
    cases = list(cases) + list(forks)
    need = sum(len(c["prompt_token_ids"]) + c["params"]["max_tokens"] * c["params"].get("n", 1) for c in cases)
    num_blocks = need // 4 // block_size  # a quarter of what the requests would reserve
    label = (f"{label}{len(cases)} {'golden' if report is None else 'hidden'} requests, {num_blocks} blocks of "
             f"{block_size} ({num_blocks * block_size} positions, a quarter of the {need} they would reserve), "
             f"{max_num_seqs} sequences a step")
    with checks.reference_forbidden("your engine's KV parts", forbidden=ANSWER_KEY):
        sched, watch, seqs = serve(BlockManager, gather_history, cases, num_blocks, block_size, max_num_seqs, label,
                                   report)
    if report is not None:
        report_tokens(report, cases, seqs, label)
    # Counted by the course's scheduler, whenever can_append said no and it freed a sequence to recompute it later.
    checks.observe(f"{label}: preemptions", int(sched.num_preemptions), at_least=1)
    assert sched.num_preemptions > 0, (
        f"{label}: nothing was preempted, although the pool holds a quarter of what the requests would reserve: "
        f"can_append must say False when the next position needs a block and none is free")
    return len(cases), sched.num_preemptions, watch.steps


def check_sharing(BlockManager, ns, forks, concurrency, label, report=None):
    """Your BlockManager on the engine, with the course's gather_history lent in the notebook's namespace ``ns`` in
    place of yours (a mistake in your gather costs only Task 2 and engine-*): copy-on-write on each fork case,
    (case, block_size, num_blocks), then more sequences than contiguous reservation on each (cases, kv_tokens,
    block_size). Returns the copies-on-write made, and (most running, contiguous bound) per concurrency case."""
    own_block_manager(BlockManager)
    with checks.course_parts_under(ns, "gather_history") as lent, \
            checks.reference_forbidden("your BlockManager on the engine", forbidden=ANSWER_KEY):
        gather = lent["gather_history"]
        copies = sum(check_fork(BlockManager, gather, *f, label, report=report) for f in forks)
        running = [check_more_than_contiguous(BlockManager, gather, *c, label, report=report) for c in concurrency]
    return copies, running
