"""Lab 05's design part: your Lab 01 search for a likely completion, run on paged memory. Reloaded by
``autograder.labs.lab05``.

Your ``paged_search(session, prompt_ids, max_tokens, budget, eos_token_id)`` drives a ``SearchSession``: its
candidates are sequences whose K/V live in a paged pool (the course's PagedKV and BlockManager, float64), and it
offers ``start`` (prefill the prompt), ``fork`` (a candidate that shares every block of another, copy-on-write),
``copy`` (one with private copies of every block, as a contiguous cache would hold), ``extend`` (one token more for
each of several candidates, one batched decode step) and ``free``. What the tests measure, the same for every
student, and none of it reported by your code:

  * the passes: one candidate through the model is one pass (a prefill is one, an extend of k candidates is k),
    counted by hooks on every model of the course's class while your search runs (Lab 01's meter, which here
    accepts only the session's own steps): the pass past the budget raises instead of running;
  * the blocks: the most blocks the session's block manager held at any moment of your search (after each of its
    operations), read from the manager the harness owns; the mean over the prompts is the design target;
  * no leak: when your search returns, every candidate is freed, so the pool is whole again;
  * the completion: scored by the harness's float64 model as in Lab 01 (the mean log-probability per generated
    token, end-of-text included); it must keep Lab 01's target, so the search stays a search.
"""
from __future__ import annotations

import numpy as np
import torch

import autograder.notebook_checks as checks
from autograder.notebook_checks import ledger
from autograder.labs.lab01 import search as lab01
from miniengine.engine.sequence import Sequence
from miniengine.kv import PagedKV
from miniengine.kv.paged import PagedBackend
from miniengine.sampling import SamplingParams

BLOCK_SIZE, NUM_BLOCKS = 4, 2048  # blocks of 4 positions, so that a shared prefix is many blocks


class SearchError(AssertionError):
    """A call on the session that breaks its contract (an unknown candidate, a token out of range, ...)."""


class _SessionMeter(lab01.PassMeter):
    """Lab 01's pass meter, accepting the session's paged steps (and only those): a pass per candidate."""

    def after(self, module, args, kwargs, output=None):
        if not isinstance(module, self.model_class):
            return
        named = dict(zip(("input_ids", "positions", "backend"), args), **kwargs)
        backend = named.get("backend")
        if type(backend) is not PagedBackend or not getattr(backend, "session_step", False):
            self.depth -= 1
            raise lab01.PassRefused(f"the search ran the model itself ({type(backend).__name__}); here every pass "
                                    f"goes through the session: session.start and session.extend")
        self.depth -= 1
        self.calls += 1
        self.passes += len(backend.new_tokens)
        if self.passes > self.budget:
            raise lab01.BudgetSpent(f"the search asked for pass {self.passes} of a budget of {self.budget}")


class SearchSession:
    """Candidates on a paged pool, for ``paged_search``. Candidate handles are ints."""

    def __init__(self, model, num_blocks: int = NUM_BLOCKS, block_size: int = BLOCK_SIZE):
        self._model = model
        self._kv = PagedKV(model.config, num_blocks, block_size, dtype=model.dtype, device=model.device)
        self._seqs: dict[int, Sequence] = {}
        self._params = SamplingParams(max_tokens=model.config.max_position_embeddings)
        self.block_size, self.vocab_size = block_size, model.config.vocab_size
        self._peak = 0  # private, behind a read-only property: a search cannot lower what the harness reads

    @property
    def peak_blocks(self) -> int:
        """The most blocks held at any moment so far (after each operation of the session)."""
        return self._peak

    @property
    def blocks_in_use(self) -> int:
        return self._kv.num_blocks - self._kv.block_manager.num_free_blocks

    def _seen(self):
        self._peak = max(self._peak, self.blocks_in_use)

    def _seq(self, cand) -> Sequence:
        if isinstance(cand, bool) or not isinstance(cand, (int, np.integer)) or int(cand) not in self._seqs:
            raise SearchError(f"session: {cand!r} is not a live candidate (live: {sorted(self._seqs)})")
        return self._seqs[int(cand)]

    def _add(self, seq: Sequence) -> int:
        self._seqs[seq.seq_id] = seq
        self._seen()
        return seq.seq_id

    @torch.no_grad()
    def _step(self, seqs, fed: list[list[int]]) -> np.ndarray:
        device = self._model.device
        backend = self._kv.backend(seqs, [len(f) for f in fed])
        backend.session_step = True  # the meter counts these passes, and no others
        rows = torch.tensor([len(f) for f in fed]).cumsum(0) - 1
        logits = self._model(torch.tensor([t for f in fed for t in f], device=device), backend.positions(device),
                             backend, logits_indices=rows.to(device))
        backend.advance()
        for s, f in zip(seqs, fed):
            s.num_cached_tokens += len(f)
        return torch.log_softmax(logits.double(), dim=-1).cpu().numpy()

    def start(self, prompt_ids) -> tuple[int, np.ndarray]:
        """Prefill the prompt (one pass): a new candidate and the log-probabilities of its next token, [vocab]."""
        ids = [int(t) for t in prompt_ids]
        if not ids or not all(0 <= t < self.vocab_size for t in ids):
            raise SearchError(f"session.start: the prompt must be token ids in [0, {self.vocab_size}), got {ids[:8]}")
        seq = Sequence(ids, self._params)
        self._kv.allocate(seq)
        cand = self._add(seq)
        return cand, self._step([seq], [ids])[0]

    def fork(self, cand) -> int:
        """A new candidate with the same tokens, sharing every block of ``cand`` (no pass, no copy)."""
        parent = self._seq(cand)
        child = parent.fork(0, self._params)
        self._kv.fork(parent, child)
        return self._add(child)

    def copy(self, cand) -> int:
        """A new candidate with the same tokens and private copies of all of ``cand``'s blocks (no pass)."""
        parent = self._seq(cand)
        child = parent.fork(0, self._params)
        self._kv.allocate(child)  # a table of fresh blocks, as many as the parent's (the same tokens)
        for src, dst in zip(self._kv.table(parent), self._kv.table(child), strict=True):
            self._kv.copy_block(src, dst)
        return self._add(child)

    def extend(self, cands, tokens) -> np.ndarray:
        """Append ``tokens[i]`` to candidate ``cands[i]`` and run them as one batch (a pass each): the
        log-probabilities of each one's next token, [len(cands), vocab]."""
        cands, tokens = list(cands), [int(t) for t in tokens]
        if not cands or len(cands) != len(tokens) or len(set(int(c) for c in cands)) != len(cands):
            raise SearchError(f"session.extend: give distinct candidates and one token each, got {cands} and {tokens}")
        seqs = [self._seq(c) for c in cands]
        for s, t in zip(seqs, tokens):
            if not 0 <= t < self.vocab_size:
                raise SearchError(f"session.extend: token {t} is not in [0, {self.vocab_size})")
            s.token_ids.append(t)
            self._kv.append_slot(s)  # a shared last block is copied here (copy-on-write)
            self._seen()
        return self._step(seqs, [[t] for t in tokens])

    def tokens(self, cand) -> list[int]:
        """The candidate's tokens after the prompt."""
        return list(self._seq(cand).output_token_ids)

    def free(self, cand) -> None:
        """Drop the candidate: its blocks go back (a shared one once nobody else holds it)."""
        seq = self._seq(cand)
        self._kv.free(seq)
        del self._seqs[seq.seq_id]

    @property
    def live(self) -> list[int]:
        return sorted(self._seqs)


def student_view(session: SearchSession):
    """What the search is handed: the session's public calls, and nothing that holds state the harness reads.

    An attribute of an object the student holds can be reassigned from an answer cell (``session._peak = 0`` defines
    a private name of the cell's own, which the answer policy allows), so the harness never reads one: it keeps the
    session, and the search gets this view, whose instances take no attributes at all (``__slots__ = ()``)."""

    class SearchSessionView:
        __slots__ = ()
        start, fork, copy = staticmethod(session.start), staticmethod(session.fork), staticmethod(session.copy)
        extend, free, tokens = staticmethod(session.extend), staticmethod(session.free), staticmethod(session.tokens)
        block_size, vocab_size = session.block_size, session.vocab_size
        blocks_in_use = property(lambda self: session.blocks_in_use)
        peak_blocks = property(lambda self: session.peak_blocks)
        live = property(lambda self: session.live)

    return SearchSessionView()


def run_paged(paged_search, model, prompt, max_tokens, budget, eos, what):
    """(tokens, passes, peak blocks, blocks left held): one prompt's search on a fresh session, read from the session
    the harness keeps (the search gets a view of it)."""
    session = SearchSession(model)
    try:
        with _SessionMeter(budget) as meter:
            out = paged_search(student_view(session), list(prompt), max_tokens, budget, eos)
    except (lab01.PassRefused, SearchError) as e:
        raise AssertionError(f"{what}: {e}") from None
    tokens = lab01.as_completion(out, max_tokens, eos, model.config.vocab_size, what, list(prompt))
    return tokens, meter.passes, session.peak_blocks, session.blocks_in_use


def search_prompts(paged_search, cases, eos, blocks_target, blocks_baseline, ll_target, ll_baseline, kind):
    """Every case on its own session (the float64 model), scored: blocks, passes, leaks, log-likelihood."""
    checks.require_own(paged_search, "paged_search")
    model64 = checks.load_model(torch.float64)
    peaks, scores, passes, leaks = [], [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with checks.reference_forbidden("paged_search"):
            for case in cases:
                p = case["params"]
                tokens, n, peak, left = run_paged(paged_search, model64, case["prompt_token_ids"], p["max_tokens"],
                                                  p["budget"], eos, f"{kind} case {case['name']}")
                peaks.append(peak)
                passes.append(n)
                leaks.append(left)
                scores.append(lab01.mean_log_likelihood(model64, case["prompt_token_ids"], tokens))
    finally:
        torch.set_num_threads(threads)
    budget = min(c["params"]["budget"] for c in cases)
    print(f"{kind} prompts: {len(cases)}; peak blocks per prompt {peaks}; passes {passes} (budget {budget})")
    checks.observe(f"{kind} prompts: the most passes one search used", max(passes), at_most=budget)
    checks.observe(f"{kind} prompts: blocks still held when the searches returned", sum(leaks), expect=0)
    assert sum(leaks) == 0, (f"{kind} prompts: {sum(leaks)} blocks were still held when your search returned "
                             f"(per prompt: {leaks}); free every candidate before returning, the winner too")
    lab01.observe_mean(f"{kind} prompts: mean normalised log-likelihood over {len(cases)} prompts", scores, ll_target,
                       ll_baseline)
    mean_peak = float(np.mean(peaks))
    checks.observe(f"{kind} prompts: mean peak blocks held", mean_peak, at_most=blocks_target,
                   baseline=blocks_baseline)
    share = ledger.credit(mean_peak, at_most=blocks_target, baseline=blocks_baseline)
    print(f"{kind} prompts: mean peak blocks {mean_peak:.2f} (target at most {blocks_target:g}, the unshared layout "
          f"{blocks_baseline:g}): {share:.0%} of the points")
    return mean_peak


def check_paged_search(paged_search, blocks_target, blocks_baseline, ll_target, ll_baseline) -> float:
    """The visible prompts of Lab 01's search (data/golden/lab01_search.json)."""
    data = lab01.visible_search()
    return search_prompts(paged_search, data["cases"], data["eos_token_id"], blocks_target, blocks_baseline,
                          ll_target, ll_baseline, "visible")


def report_paged_search(paged_search, report, blocks_target, blocks_baseline, ll_target, ll_baseline) -> float:
    """The hidden prompts of Lab 01's search, from ``report`` (a HiddenReport: inputs only enter the kernel; it
    reports no outputs, since every quantity is observed here and judged by the grader)."""
    return search_prompts(paged_search, report.cases(lab01.SEARCH), report.data(lab01.SEARCH)["eos_token_id"],
                          blocks_target, blocks_baseline, ll_target, ll_baseline, "hidden")
