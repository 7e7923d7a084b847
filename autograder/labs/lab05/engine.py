"""Lab 05 on the real engine: Task 3 (your engine under memory pressure) and copy-on-write on the engine.

``serve`` runs ``LLM`` on a ``PagedKV`` with your ``BlockManager`` and a gather, with your manager checked after
every step (``Watch``). Visible tests compare the tokens with the golden file's here; hidden tests hand them to
the grader (``report``), which compares them outside the kernel. Every check also observes what it found for the
grader (checks.observe): the visible tokens, the properties it verified, and the quantities it measured on the
course's engine (preemptions, copies made, sequences running together) with their bounds. Reloaded by
``autograder.labs.lab05``.
"""
from __future__ import annotations

import json

import torch

import autograder.notebook_checks as checks
from autograder.labs.lab05.common import check_pool, state
from autograder.labs.shared import compare_tokens
from miniengine import LLM, SamplingParams
from miniengine.kv import PagedKV


class Watch:
    """Checks your block manager inside the engine after every step: exactly the running sequences hold tables,
    each covering the positions it has cached and no more, and the reference counts and the free list add up."""

    def __init__(self, engine, label):
        self.engine, self.kv, self.sched, self.label = engine, engine.kv, engine.scheduler, label
        self.steps = self.max_running = 0
        self.also_running = []  # sequences a test took out of the running list for one step
        postprocess = self.sched.postprocess

        def checked_postprocess(batch, tokens):
            self.max_running = max(self.max_running, len(batch.seqs))
            done = postprocess(batch, tokens)
            self.check()
            return done

        self.sched.postprocess = checked_postprocess

    def check(self):
        where = f"{self.label}, after step {self.steps}"
        self.steps += 1
        bs, nb = self.kv.block_size, self.kv.num_blocks
        free, refs, tables = state(self.kv.block_manager, where)
        running = {s.seq_id: s for s in list(self.sched.running) + self.also_running if not s.is_finished}
        assert sorted(tables) == sorted(running), (
            f"{where}: block tables belong to sequences {sorted(tables)}, but the running sequences are "
            f"{sorted(running)}: a finished or preempted sequence gives its table back (free), and only admitted "
            f"sequences hold one")
        check_pool(free, refs, tables, nb, where)
        for sid, s in running.items():
            want = -(-s.num_cached_tokens // bs)
            assert len(tables[sid]) == want, (
                f"{where}: sequence {sid} has {s.num_cached_tokens} positions cached, so its table should hold "
                f"ceil({s.num_cached_tokens} / {bs}) = {want} block(s), but it holds {len(tables[sid])}")


def step(engine, watch):
    """One engine step; an exception inside it becomes a failure that says where it happened."""
    try:
        engine.step()
    except AssertionError:  # the watch's own checks, which say where already
        raise
    except Exception as e:
        raise AssertionError(f"{watch.label}, in step {watch.steps}: the engine raised {type(e).__name__}: {e}") from e


def golden_cases(golden_path, k=2):
    """k golden cases of each sampling kind, from a golden file's "cases"."""
    with open(golden_path) as f:
        cases = json.load(f)["cases"]
    chosen = []
    for _ in range(k):
        chosen += checks.one_case_per_kind([c for c in cases if c not in chosen])
    return chosen


def golden_fork_case(golden_path, name):
    """The golden file's n > 1 case of that name, from its "fork_cases"."""
    with open(golden_path) as f:
        return next(c for c in json.load(f)["fork_cases"] if c["name"] == name)


def _completions(seq) -> list:
    """A request's completions in index order (one, unless it asked for n > 1)."""
    return sorted(seq.completions, key=lambda c: c.child_index)


def report_tokens(report, cases, seqs, label):
    """Each case's tokens go to the grader, which compares them with the reference's outside this kernel (an n > 1
    case: every completion's); the requests that were preempted and recomputed are named here, to help read a
    difference it reports."""
    for case, seq in zip(cases, seqs):
        if case["params"].get("n", 1) > 1:  # a fork case (a hidden case holds no outputs to tell it by)
            report.add("golden", case, "completions", [checks.as_tokens(s.output_token_ids, f"{label}, {case['name']}, "
                                                                        f"completion {s.child_index}")
                                                       for s in _completions(seq)], section="fork_cases")
        else:
            report.add("golden", case, "token_ids", checks.as_tokens(seq.output_token_ids,
                                                                      f"{label}, {case['name']}: token_ids"))
    preempted = [f"{c['name']} ({s.num_preemptions}x)" for c, s in zip(cases, seqs) if getattr(s, "num_preemptions", 0)]
    print(f"{label}: {len(preempted)} of {len(cases)} requests were preempted and recomputed"
          + (f": {', '.join(preempted)}" if preempted else ""))


def paged_engine(BlockManager, gather, model, num_blocks, block_size, max_num_seqs, label):
    """The engine on your BlockManager and the gather given (yours, or the course's), watched after every step."""
    kv = PagedKV(model.config, num_blocks, block_size, block_manager=BlockManager(num_blocks, block_size),
                 gather=gather)
    llm = LLM(model=model, kv=kv, max_num_seqs=max_num_seqs)
    return llm, Watch(llm.engine, label)


def all_free(kv, where):
    """Every request finished: no table left, the whole pool on the free list."""
    free, refs, tables = state(kv.block_manager, where)
    assert not tables and len(free) == kv.num_blocks, (
        f"{where}: every request has finished, yet sequences {sorted(tables)} still hold tables and "
        f"{kv.num_blocks - len(free)} of the {kv.num_blocks} blocks are not on the free list")


def serve(BlockManager, gather, cases, num_blocks, block_size, max_num_seqs, label, report=None):
    """LLM on your parts serves every case; returns the engine's scheduler, the watch and each case's sequence.
    Without a report, each case's tokens must be its golden ones; with one, the caller reports them."""
    llm, watch = paged_engine(BlockManager, gather, checks.load_model(), num_blocks, block_size, max_num_seqs, label)
    seqs = [llm.engine.add_request(c["prompt_token_ids"], SamplingParams(**c["params"])) for c in cases]
    while llm.engine.has_unfinished_requests():
        step(llm.engine, watch)
    checks.observe(f"{label}: the block tables held after every step", True, expect=True)
    if report is None:
        for case, seq in zip(cases, seqs):
            wants = [c["token_ids"] for c in case["completions"]] if case["params"].get("n", 1) > 1 else [case["token_ids"]]
            for s, want in zip(_completions(seq), wants, strict=True):
                name = case["name"] + (f", completion {s.child_index}" if len(wants) > 1 else "")
                checks.observe(f"{label}, {name}: tokens", checks.as_tokens(s.output_token_ids, name), expect=want)
                compare_tokens(s.output_token_ids, want, f"{label}, {name} ({case['params']})", s)
    all_free(llm.engine.kv, label)
    checks.observe(f"{label}: every block free at the end", True, expect=True)
    return llm.engine.scheduler, watch, seqs


def decode_child_alone(engine, watch, sched, child):
    """The child's first decode, alone: its write comes before the parent's. The others wait out this step."""
    waiting_room = list(sched.running)
    sched.running[:] = [child]
    watch.also_running = [s for s in waiting_room if s is not child]
    try:
        step(engine, watch)
    finally:
        sched.running[:] = [s for s in waiting_room if not s.is_finished]
        watch.also_running = []


def check_fork(BlockManager, gather, case, block_size, num_blocks, label, report=None):
    """A request with n completions: they share the prompt's blocks; one child decodes alone first: it must get a
    private copy of the shared last block, and the K/V in the parent's blocks must not change, in any layer. Then
    every completion must produce its golden tokens (the reference ran each alone, with its own seed); with a
    report, the completions' tokens go to the grader instead, which compares them outside this kernel."""
    name, n = case["name"], case["params"]["n"]
    prompt = case["prompt_token_ids"]
    Lp = len(prompt)
    label = f"{label}{name}, n={n}, a {Lp}-token prompt, blocks of {block_size}"
    llm, watch = paged_engine(BlockManager, gather, checks.load_model(), num_blocks, block_size, 8, label)
    engine, kv = llm.engine, llm.engine.kv
    bm, sched = kv.block_manager, engine.scheduler
    root = engine.add_request(prompt, SamplingParams(**case["params"]))
    step(engine, watch)  # the prefill; then the scheduler forks the other completions, which share the prompt's blocks
    seqs = root.completions
    assert len(seqs) == n, f"{label}: after the prefill, the request should have {n} completions, it has {len(seqs)}"
    free, refs, tables = state(bm, label)
    shared = tables[root.seq_id]
    for s in seqs[1:]:
        assert tables[s.seq_id] == shared, (f"{label}: after fork, completion {s.child_index} should hold the "
                                            f"prompt's blocks {shared}, it holds {tables[s.seq_id]}")
    assert len(free) == num_blocks - len(shared), (
        f"{label}: the {n} completions should hold the prompt's {len(shared)} blocks once (shared), but "
        f"{num_blocks - len(free)} blocks are in use")
    checks.observe(f"{label}: after the prefill, the completions share the prompt's blocks", True, expect=True)

    def blocks(pool):  # [layers, num_blocks, block_size, kv_heads, head_dim]
        return pool.view(pool.shape[0], num_blocks, block_size, *pool.shape[2:])

    before = {name_: blocks(pool)[:, shared].clone() for name_, pool in (("K", kv.pool_k), ("V", kv.pool_v))}
    child = seqs[1]
    decode_child_alone(engine, watch, sched, child)
    where = f"{label}, after completion 1 decoded position {Lp} alone"
    free, refs, tables = state(bm, where)
    assert tables[root.seq_id] == shared, (f"{where}: the parent's table changed from {shared} to "
                                           f"{tables[root.seq_id]}; a copy-on-write changes only the writer's table")
    for name_, pool in (("K", kv.pool_k), ("V", kv.pool_v)):
        now = blocks(pool)[:, shared]
        if not torch.equal(now, before[name_]):
            layer, j, offset = (int(x) for x in (now != before[name_]).any(-1).any(-1).nonzero()[0])
            raise AssertionError(
                f"{where}: the child's decode changed the {name_} of block {shared[j]} (offset {offset}, layer "
                f"{layer}), which the parent still reads. Position {Lp} lies in block {shared[j]}, shared by all "
                f"{n} completions: append_slot must give the writer a private copy (copy-on-write) and return "
                f"(src, dst), so that PagedKV copies the K/V before the step writes")
    checks.observe(f"{label}: the parent's table and K/V unchanged by the child's decode", True, expect=True)
    i, used = Lp // block_size, Lp % block_size
    mine = tables[child.seq_id]
    assert mine[:i] == shared[:i] and mine[i] not in shared, (
        f"{where}: the child's table should be the parent's full blocks {shared[:i]} and then a private copy of "
        f"block {shared[i]}, got {mine}")
    for name_, pool in (("K", kv.pool_k), ("V", kv.pool_v)):
        assert torch.equal(blocks(pool)[:, mine[i], :used], before[name_][:, i, :used]), (
            f"{where}: the child's copy, block {mine[i]}, does not hold the {name_} of the positions block {shared[i]} "
            f"held: append_slot must return (src, dst) = ({shared[i]}, {mine[i]}), the shared block first, so that "
            f"PagedKV copies it into the new one")
    checks.observe(f"{label}: the child's private copy holds the prompt's K/V", True, expect=True)
    while engine.has_unfinished_requests():
        step(engine, watch)
    checks.observe(f"{label}: the block tables held after every step", True, expect=True)
    if report is None:
        for s in seqs:
            want = case["completions"][s.child_index]["token_ids"]
            checks.observe(f"{label}, completion {s.child_index}: tokens",
                           checks.as_tokens(s.output_token_ids, f"completion {s.child_index}"), expect=want)
            compare_tokens(s.output_token_ids, want, f"{label}, completion {s.child_index}", s)
    else:
        report.add("golden", case, "completions", [s.output_token_ids for s in sorted(seqs, key=lambda s: s.child_index)],
                   section="fork_cases")
    all_free(kv, label)
    checks.observe(f"{label}: every block free at the end", True, expect=True)
    # Counted by the course's PagedKV each time it copies a block's K/V (a pair append_slot returned).
    checks.observe(f"{label}: copies-on-write made", int(kv.copies), at_least=1)
    return kv.copies


def check_more_than_contiguous(BlockManager, gather, cases, kv_tokens, block_size, label, report=None):
    """At equal memory, paged blocks must run more of the requests at once than contiguous reservation ever could:
    kv_tokens // min(prompt + max_tokens) of them. With a report, their tokens go to the grader."""
    bound = kv_tokens // min(len(c["prompt_token_ids"]) + c["params"]["max_tokens"] for c in cases)
    label = (f"{label}{len(cases)} {'golden' if report is None else 'hidden'} requests in {kv_tokens} positions "
             f"({kv_tokens // block_size} blocks of {block_size})")
    sched, watch, seqs = serve(BlockManager, gather, cases, kv_tokens // block_size, block_size, len(cases), label,
                               report)
    if report is not None:
        report_tokens(report, cases, seqs, label)
    # Measured on the course's scheduler: the sequences of the largest step (Watch), beyond contiguous reservation's.
    checks.observe(f"{label}: the most sequences running together", watch.max_running, at_least=bound + 1)
    assert watch.max_running > bound, (
        f"{label}: at most {watch.max_running} sequences ran together, but contiguous reservation already fits "
        f"{bound} (each reserves prompt + max_tokens): paged memory takes a block only when a position needs one")
    return watch.max_running, bound
