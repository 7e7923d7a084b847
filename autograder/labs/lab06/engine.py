"""Lab 06 on the real engine: Task 2's rollback (with the course's coupled verifier) and Task 3, your engine.

``on_the_engine`` opens a test: it lends the draft model's cache the course's block manager and forbids the answer
key, and hands the test ``serve``, which runs ``LLM`` on your ``BlockManager`` with every rollback checked as it
happens (``Watch``). Reloaded by ``autograder.labs.lab06`` (see that module).

Besides its assertions, each run ``observe``s (autograder/notebook_checks/ledger.py) the tokens it compares with the golden ones
(with them as the expected values) and that its rollbacks, tables and pool held after every step; a hidden run's
tokens go to the grader through its HiddenReport instead. ``on_the_engine`` hands the observations out when its test
ends (the cells call no other check around ``serve``), so that the grader judges them outside the notebook.
"""
from __future__ import annotations

import contextlib
import functools
import json

import autograder.notebook_checks as checks
from autograder.labs import shared
from autograder.labs.lab06.blocks import check_pool, check_truncate, state
from autograder.labs.lab06.common import ANSWER_KEY
from miniengine import LLM, SamplingParams
from miniengine.kv import PagedKV


class Watch:
    """Your block manager inside the speculative engine: every rollback (truncate) is checked as it happens, and after
    every step exactly the running sequences hold tables, each covering its confirmed positions and no more."""

    def __init__(self, engine, label):
        self.engine, self.kv, self.sched, self.label = engine, engine.kv, engine.scheduler, label
        self.steps = self.truncations = self.released = self.verifications = 0
        bm = self.kv.block_manager
        yours = bm.truncate

        def checked_truncate(seq, num_tokens):
            where = (f"{self.label}, step {self.steps}: truncate(seq {seq.seq_id}, num_tokens={num_tokens}), the "
                     f"rollback after its verification")
            before = state(bm, where)
            try:
                yours(seq, num_tokens)
            except Exception as e:
                raise AssertionError(f"{where}: truncate raised {type(e).__name__}: {e}") from e
            self.released += check_truncate(before, state(bm, where), seq.seq_id, num_tokens, seq.num_tokens,
                                            self.kv.block_size, self.kv.num_blocks, where)
            self.truncations += 1

        bm.truncate = checked_truncate  # the engine reaches it through PagedKV.truncate

    def check(self):
        where = f"{self.label}, after step {self.steps}"
        self.steps += 1
        bs = self.kv.block_size
        free, refs, tables = state(self.kv.block_manager, where)
        running = {s.seq_id: s for s in self.sched.running if not s.is_finished}
        assert sorted(tables) == sorted(running), (
            f"{where}: block tables belong to sequences {sorted(tables)}, but the running sequences are "
            f"{sorted(running)}")
        check_pool(free, refs, tables, self.kv.num_blocks, where)
        for sid, s in running.items():
            want = -(-s.num_cached_tokens // bs)
            assert len(tables[sid]) == want, (
                f"{where}: sequence {sid} has {s.num_cached_tokens} confirmed positions in its cache, so after the "
                f"rollback its table should hold ceil({s.num_cached_tokens} / {bs}) = {want} block(s), but it holds "
                f"{len(tables[sid])}: the blocks taken for its rejected drafts must go back")


def step(engine, watch):
    """One engine step, then the watch's checks; an exception inside it becomes a failure that says where."""
    try:
        engine.step()
    except AssertionError:  # the checks' own failures, which say where already
        raise
    except Exception as e:
        raise AssertionError(f"{watch.label}, in step {watch.steps}: the engine raised {type(e).__name__}: {e}") from e
    watch.check()


def compare_tokens(got, want, what, seq=None):
    """Your tokens against the golden ones, as plain ints, handed to the grader too; a failure names the first
    difference in words."""
    shared.compare_tokens(got, want, what, seq, observe=True)


def engine_verifier(rejection_verify, watch):
    """Your verifier as the engine calls it (watch() is the run's Watch); an answer the engine could not go on from
    becomes a failure here."""
    def yours(target_logits, drafts, draft_probs, params, positions):
        w = watch()
        w.verifications += 1
        where = f"{w.label}, step {w.steps}: rejection_verify(drafts={list(drafts)}, positions={list(positions)})"
        try:
            out = rejection_verify(target_logits, drafts, draft_probs, params, positions)
        except Exception as e:
            raise AssertionError(f"{where} raised {type(e).__name__}: {e}") from e
        out = checks.as_tokens(out, f"{where}: its answer")
        k = len(out) - 1
        assert not (0 <= k < len(drafts) and out[:k] == list(drafts[:k]) and out[-1] == drafts[k]), (
            f"{where} returned {out}: it rejected drafts[{k}] = {drafts[k]} and drew the same token again, which the "
            f"residual normalize(max(0, p - q)) never does (a draft is rejected only where q > p, and there the "
            f"residual is 0)")
        return out

    return yours


def check_served_tokens(label, cases, forks, seqs):
    """Every case's tokens, and every completion of the fork cases, against the golden ones."""
    for case, seq in zip(cases, seqs):
        compare_tokens(seq.output_token_ids, case["token_ids"], f"{label}: {case['name']} ({case['params']})", seq)
    for case, seq in zip(forks, seqs[len(cases):]):
        assert len(seq.completions) == len(case["completions"]), (
            f"{label}: {case['name']} ({case['params']}): {len(seq.completions)} completions, expected "
            f"{len(case['completions'])}")
        for s, want in zip(seq.completions, case["completions"]):
            compare_tokens(s.output_token_ids, want["token_ids"],
                           f"{label}: {case['name']}, completion {s.child_index} ({case['params']})", s)


def serve(BlockManager, DraftBlockManager, cases, forks, num_blocks, block_size, gamma, verifier, max_num_seqs, label,
          exact=True):
    """LLM on your BlockManager drafts gamma tokens a step and serves every case (and every completion of the fork
    cases), verifying with the course's "coupled" verifier or with yours; the draft model's own cache runs on the
    course's manager (DraftBlockManager, lent to the test). With exact, the tokens are compared with the golden ones.
    Returns the run's counts, its label and the sequences (cases, then forks), whose tokens a hidden test reports."""
    label = (f"{label}γ = {gamma}, {num_blocks} blocks of {block_size}, "
             f"{'the coupled verifier' if verifier == 'coupled' else 'your rejection_verify'}")
    model = checks.load_model()
    kv_ = PagedKV(model.config, num_blocks, block_size, block_manager=BlockManager(num_blocks, block_size))
    watch = None
    llm = LLM(model=model, kv=kv_, max_num_seqs=max_num_seqs, speculative_model="draft", num_speculative_tokens=gamma,
              speculative_verifier="coupled" if verifier == "coupled" else engine_verifier(verifier, lambda: watch))
    proposer = llm.engine.spec.proposer
    proposer.kv.block_manager = DraftBlockManager(proposer.kv.num_blocks, proposer.kv.block_size)
    engine = llm.engine
    watch = Watch(engine, label)
    seqs = [engine.add_request(c["prompt_token_ids"], SamplingParams(**c["params"])) for c in cases + forks]
    while engine.has_unfinished_requests():
        step(engine, watch)
    if exact:
        check_served_tokens(label, cases, forks, seqs)
    free, refs, tables = state(kv_.block_manager, label)
    assert not tables and len(free) == num_blocks, (
        f"{label}: every request has finished, yet sequences {sorted(tables)} still hold tables and "
        f"{num_blocks - len(free)} of the {num_blocks} blocks are not on the free list")
    spec = engine.spec
    assert watch.truncations and watch.released and spec.rejected, (
        f"{label}: {watch.truncations} rollbacks released {watch.released} blocks over {spec.rejected} rejecting "
        f"verifications: the test expects the engine to roll back rejected drafts")
    checks.observe(f"{label}: every rollback checked as it happened, the tables after every step, the pool free at "
                   f"the end", True, expect=True)
    return {"steps": watch.steps, "rollbacks": watch.truncations, "released": watch.released,
            "preemptions": engine.scheduler.num_preemptions, "alpha": spec.alpha,
            "tokens_per_call": spec.tokens_per_call, "verifications": watch.verifications, "label": label,
            "seqs": seqs}


@contextlib.contextmanager
def on_the_engine(BlockManager, what):
    """A test on the engine: yields serve(cases, forks, num_blocks, block_size, gamma, verifier, max_num_seqs, label,
    exact=True) for your BlockManager, while the course's block manager is lent to the draft model's cache (made
    before the answer key is forbidden, so the lent copy works) and any call into the answer key fails the test."""
    try:
        with checks.course_parts_under({}, "DraftBlockManager") as parts, \
                checks.reference_forbidden(what, forbidden=ANSWER_KEY):
            yield functools.partial(serve, BlockManager, parts["DraftBlockManager"])
    finally:
        checks.ledger.flush()  # serve is no check_ function that pristine wraps: hand its observations out here


def visible_golden():
    """The visible golden file: prompts, parameters and the reference's tokens, read from disk."""
    with open(checks.VISIBLE_GOLDEN) as f:
        return json.load(f)


def of_each_kind(golden, k, forks):
    """k cases of each sampling kind of a golden file's data (from different prompts where possible), and its first
    fork cases."""
    chosen = []
    for _ in range(k):
        chosen += checks.one_case_per_kind([c for c in golden["cases"] if c not in chosen])
    return chosen, golden["fork_cases"][:forks]


def report_run(report, run, cases, forks):
    """Each request's tokens (each completion's, for the fork cases) go to the grader, which compares them with the
    reference's outside this kernel; the requests that were preempted and recomputed are named here, to help read a
    difference it reports."""
    seqs = run["seqs"]
    for case, seq in zip(cases, seqs):
        tokens = checks.as_tokens(seq.output_token_ids, f"{run['label']}: {case['name']}: token_ids")
        report.add("golden", case, "token_ids", tokens)
    for case, seq in zip(forks, seqs[len(cases):]):
        completions = [s.output_token_ids for s in sorted(seq.completions, key=lambda s: s.child_index)]
        report.add("golden", case, "completions", completions, section="fork_cases")
    preempted = [f"{c['name']} ({s.num_preemptions}x)" for c, s in zip(cases + forks, seqs)
                 if getattr(s, "num_preemptions", 0)]
    print(f"{run['label']}: {len(preempted)} of {len(seqs)} requests were preempted and recomputed"
          + (f": {', '.join(preempted)}" if preempted else ""))


def check_same_tokens(first, again, cases):
    """The coupled verifier's tokens are plain decoding's: they depend on neither γ, nor the block size, nor when a
    sequence was preempted. So a second run of the same requests must give the first run's tokens (which the grader
    compares with the reference's)."""
    for case, seq, earlier in zip(cases, again["seqs"], first["seqs"]):
        got = checks.as_tokens(seq.output_token_ids, f"{again['label']}: {case['name']}: token_ids")
        want = checks.as_tokens(earlier.output_token_ids, f"{first['label']}: {case['name']}: token_ids")
        t = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        preempted = sum(getattr(s, "num_preemptions", 0) for s in (seq, earlier))
        checks.observe(f"{again['label']}: {case['name']}: the tokens of the run before", got == want, expect=True)
        assert got == want, (
            f"{again['label']}: {case['name']}: the tokens differ from this request's tokens in the run before ("
            f"{first['label']}) at step {t} ({len(got)} and {len(want)} tokens): with the coupled verifier the tokens "
            f"cannot depend on γ or the block size, so a rollback of one of the two runs went wrong"
            + (f" (the request was preempted {preempted} time(s) in the two runs)" if preempted else ""))
