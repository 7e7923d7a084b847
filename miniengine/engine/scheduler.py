"""The scheduler: which sequences run in this step, and what happens to them after it.

``schedule()`` returns this step's batch: every running sequence decodes one
token, and the policy admits waiting ones to prefill, within the step's
sequence budget (``max_num_seqs``), token budget (``max_num_batched_tokens``)
and the KV memory left.  ``postprocess()`` appends the sampled tokens, forks
the completions of an ``n > 1`` request after its prefill, and applies the
engine's one stop rule.  Neither knows how long a request will run: only the
simulator may know that in advance.

Memory pressure (a KV layout that grows sequences block by block, such as the
paged one, has ``can_append``/``append_slot``): before a decode step every
running sequence needs a slot for the token it feeds.  When no block is free,
the most recently admitted running sequence is preempted by recompute: its
blocks are freed, and it goes back to the front of the waiting queue (ahead of
every request never admitted, in arrival order with other preempted ones), to be
prefilled again later over its prompt *and* the tokens it had generated
(vLLM's default; Kwon et al., 2023, section 4.5).  Its keyed sampling noise
makes the recomputed run choose the same tokens.

Chunked prefill (``chunk_prefill``, off by default): a prompt longer than what is
left of the step's token budget is prefilled over several steps, a chunk at a
time, beside the running decodes, as in Sarathi-Serve (Agrawal et al., OSDI 2024,
https://arxiv.org/abs/2403.02310).  Decodes go first, then the prefills already
under way, then new requests.  A sequence samples its first token only in the
step that feeds its prompt's last chunk.
"""
from __future__ import annotations

from collections import deque

from miniengine import plugs
from miniengine.plugs.conformance import check
from miniengine.sampling import child_params
from miniengine.engine.batch import ScheduledBatch, emitted_tokens
from miniengine.engine.policy import Budget, ContinuousBatching
from miniengine.engine.sequence import Sequence, SequenceStatus


def stop_reason(seq: Sequence, token_id: int, eos_token_id: int) -> str | None:
    """The engine's one stop rule: right after end-of-text (unless ignore_eos) or a stop token id, or at max_tokens.
    (Stop strings are text: miniengine.stop_strings ends those a step later, from the decoded text.)"""
    if token_id == eos_token_id and not seq.params.ignore_eos:
        return "stop"
    if token_id in seq.params.stop_token_ids:  # stops even with ignore_eos, as in vLLM
        seq.stop_reason = token_id
        return "stop"
    if len(seq.output_token_ids) >= seq.params.max_tokens:
        return "length"
    return None


_UNLIMITED = 1 << 62  # the policy's token budget when the scheduler chunks prefills itself


def fcfs_key(seq: Sequence) -> tuple[int, int]:
    """First-come first-served order: by the request's arrival (its first sequence's id), then completion index."""
    return seq.root.seq_id, seq.child_index


def chunk_to_fit(seq: Sequence, tokens_left: int) -> int:
    """The default chunking rule: as much of what the sequence still has to feed as the step has room for."""
    return min(seq.num_new_tokens, tokens_left)


class Scheduler:
    def __init__(self, kv, eos_token_id: int, max_num_seqs: int, max_num_batched_tokens: int, policy=None,
                 chunk_prefill=None, num_speculative_tokens: int = 0):
        # chunk_prefill: None (a prompt is prefilled in one step), or chunk(seq, tokens_left) -> int, how many of
        # the tokens a sequence still has to feed join this step (chunk_to_fit, or Lab 08's rule)
        if chunk_prefill is not None:
            check("chunk_prefill", chunk_prefill, plugs.ChunkingRule)
        self.chunk_prefill = chunk_prefill
        self.kv, self.eos_token_id = kv, eos_token_id
        self.policy = ContinuousBatching() if policy is None else check("policy", policy, plugs.SchedulingPolicy)
        # A policy may bring its own batch limit (batch-1 FCFS, a static batch size) within the engine's.
        own = getattr(self.policy, "max_num_seqs", None)
        self.max_num_seqs = min(max_num_seqs, own) if own else max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order (forks join at the end)
        self.num_preemptions = 0
        self.num_speculative_tokens = num_speculative_tokens  # a speculative engine's γ: KV slots a decode needs ahead

    def lookahead(self, seq: Sequence) -> int:
        """Drafted tokens a decode may verify this step: never more than it may still emit, minus one."""
        left = seq.params.max_tokens - len(seq.output_token_ids)
        return max(0, min(self.num_speculative_tokens, left - 1))

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id) -> Sequence | None:
        """Stop a request wherever it is (every completion of it), and free everything it holds.

        Returns the request's first sequence, or None if no unfinished sequence has that id."""
        root = None
        for queue in (self.waiting, self.running):
            for seq in list(queue):
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self._finish(seq, "abort")
                    seq.fork_pending = False
                    root = seq.root
        return root

    def finish(self, seq: Sequence, reason: str) -> None:
        """End one running or waiting sequence now (a stop string found in its text) and free what it holds."""
        for queue in (self.waiting, self.running):
            if seq in queue:
                queue.remove(seq)
        if not seq.is_finished:
            self._finish(seq, reason)

    def schedule(self, now: float = 0.0) -> ScheduledBatch:
        decodes, preempted = self._decodes()
        tokens_left = self.max_num_batched_tokens - sum(1 + self.lookahead(s) for s in decodes)
        # Prefills already under way (chunked) continue first, oldest first, as far as the budget goes.
        going_on = []
        for seq in ([] if preempted else [s for s in self.running if self.prefilling(s)]):
            n = self._chunk(seq, tokens_left)
            if n == 0:
                break
            going_on.append((seq, n))
            tokens_left -= n
        # With chunking, the policy admits by seats and memory; the budget cuts the chunks afterwards.
        budget = Budget(max_seqs=0 if preempted else self.max_num_seqs - len(decodes) - len(going_on),
                        max_tokens=tokens_left if self.chunk_prefill is None else _UNLIMITED,
                        can_allocate=self.kv.can_allocate, now=now)
        seen = [(s, s.num_cached_tokens, len(s.token_ids)) for s in (*self.waiting, *decodes)]
        admitted = list(self.policy.admit(tuple(self.waiting), tuple(decodes), budget))
        self._check(admitted, budget, seen)
        prefills = []
        seats = sum(self.seats(s) for s in self.running)
        for seq in admitted:  # in order; stop at the first one KV memory (or a seat for each completion) no longer holds
            if not self.kv.can_allocate(seq) or seats + self.seats(seq) > self.max_num_seqs:
                break
            if self.chunk_prefill is not None and self._chunk(seq, tokens_left) == 0:
                break  # no room left in this step's token budget
            seats += self.seats(seq)
            self.kv.allocate(seq)  # the whole prompt's memory, even when it is fed in chunks
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = seq.num_new_tokens if self.chunk_prefill is None else self._chunk(seq, tokens_left)
            tokens_left -= n
            prefills.append((seq, n))
        steps = [(s, s.num_new_tokens) for s in decodes] + going_on + prefills
        return ScheduledBatch([s for s, _ in steps], [n for _, n in steps], len(decodes),
                              [self.lookahead(s) for s in decodes] if self.num_speculative_tokens else [])

    @staticmethod
    def prefilling(seq: Sequence) -> bool:
        """A running sequence with more than one token still to feed: its chunked prefill is under way."""
        return seq.num_new_tokens > 1

    def _chunk(self, seq: Sequence, tokens_left: int) -> int:
        """How many tokens ``seq`` feeds this step, by the chunking rule, checked (it is a plug point)."""
        n = self.chunk_prefill(seq, max(0, tokens_left))
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= min(seq.num_new_tokens, max(0, tokens_left)):
            raise RuntimeError(f"the chunking rule returned {n!r} for a sequence with {seq.num_new_tokens} tokens to "
                               f"feed and {max(0, tokens_left)} left in this step's budget: it must be an int in "
                               f"[0, {min(seq.num_new_tokens, max(0, tokens_left))}]")
        return n

    @staticmethod
    def seats(seq: Sequence) -> int:
        """Seats a sequence will take: an n > 1 request forks n sequences after its prefill."""
        return seq.params.n if seq.fork_pending else 1

    def _decodes(self) -> tuple[list[Sequence], bool]:
        """The running sequences that decode this step, each with a KV slot for the token it feeds.

        Returns them and whether anything was preempted (then nothing new is admitted this step: the
        memory is short).
        """
        if not hasattr(self.kv, "can_append"):  # a layout that reserved everything at admission
            return [s for s in self.running if not self.prefilling(s)][: self.max_num_seqs], False
        rest, decodes, preempted = [s for s in self.running if not self.prefilling(s)], [], False
        while rest and len(decodes) < self.max_num_seqs:
            seq = rest.pop(0)
            while not self._can_grow(seq):
                victim = rest.pop() if rest else seq  # the most recently admitted one still running
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                self._grow(seq)
                decodes.append(seq)
        return decodes, preempted

    def _can_grow(self, seq: Sequence) -> bool:
        ahead = self.lookahead(seq)
        return self.kv.can_cover(seq, seq.num_tokens + ahead) if ahead else self.kv.can_append(seq)

    def _grow(self, seq: Sequence) -> None:
        ahead = self.lookahead(seq)
        if ahead:
            self.kv.cover(seq, seq.num_tokens + ahead)
        else:
            self.kv.append_slot(seq)

    def preempt(self, seq: Sequence) -> None:
        """Take a running sequence's KV memory back; it waits at the front of the queue to be recomputed."""
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status, seq.num_cached_tokens = SequenceStatus.WAITING, 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        # Ahead of every request never admitted, behind preempted ones that arrived earlier: FCFS by arrival.
        i = 0
        while i < len(self.waiting) and fcfs_key(self.waiting[i]) < fcfs_key(seq):
            i += 1
        self.waiting.insert(i, seq)

    def _check(self, admitted, budget: Budget, seen=()) -> None:
        """A policy is a plug point: say exactly which rule its answer breaks.  ``seen``: (sequence, cached positions,
        tokens) of every sequence the policy was shown, before it answered; a policy chooses, it changes no sequence
        (one that marked a prompt cached would make its prefill free, on the simulator's clock too)."""
        name = type(self.policy).__name__
        for s, cached, tokens in seen:
            if s.num_cached_tokens != cached or len(s.token_ids) != tokens:
                raise RuntimeError(f"{name}.admit changed sequence {s.seq_id} (num_cached_tokens {cached} -> "
                                   f"{s.num_cached_tokens}, {tokens} -> {len(s.token_ids)} tokens): a policy only "
                                   f"chooses which sequences join; it must not change them")
        queued = {id(s) for s in self.waiting}
        if any(id(s) not in queued for s in admitted) or len({id(s) for s in admitted}) != len(admitted):
            raise RuntimeError(f"{name}.admit must return distinct sequences taken from `waiting`")
        if len(admitted) > budget.max_seqs:
            raise RuntimeError(f"{name}.admit returned {len(admitted)} sequences, but only {budget.max_seqs} may join "
                               f"this step (max_num_seqs={self.max_num_seqs})")
        tokens = sum(s.num_new_tokens for s in admitted)
        if tokens > budget.max_tokens:
            raise RuntimeError(f"{name}.admit returned {tokens} prompt tokens, but only {budget.max_tokens} fit in this "
                               f"step (max_num_batched_tokens={self.max_num_batched_tokens})")

    def postprocess(self, batch: ScheduledBatch, token_ids: list) -> list[Sequence]:
        """Append each row's tokens; return the sequences that finished in this step.

        ``token_ids`` has one row per entry of ``batch.sample_rows()``: the tokens that row emits, in order, a list
        of one in a plain step (a sequence whose prefill forks its request's other completions brings n rows).  A
        speculative decode (``batch.drafts(i)``) emits its accepted drafts, then one token of the target's.  Every
        row takes the same path: its tokens are appended one by one, the stop rule checked after each, and the
        fed positions they confirm keep their K/V (the sequence's own new tokens, and each accepted draft); the
        speculative step rolls the rest of the KV memory back.
        """
        finished, rows = [], iter(token_ids)
        logprobs = iter(batch.logprobs or [])  # one entry per row, when a row asked for them
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            drafts = batch.drafts(i)
            seq.tokens_processed += n + len(drafts)
            if batch.partial(i):  # a chunk of a prefill: cached now, nothing sampled yet
                self._cached(seq, n)
                continue
            completions = [seq]
            if seq.fork_pending:  # its prompt is cached: the other completions share it from here
                seq.fork_pending = False
                for c in range(1, seq.params.n):
                    child = seq.fork(c, child_params(seq.params, c))
                    self.kv.fork(seq, child)
                    self.running.append(child)
                    completions.append(child)
            for s in completions:
                emitted = emitted_tokens(next(rows))
                entry = next(logprobs, None)
                if entry is not None:
                    s.logprobs.append(entry)
                if not 1 <= len(emitted) <= len(drafts) + 1:
                    raise RuntimeError(f"a row of token_ids must hold 1 to {len(drafts) + 1} tokens for a sequence fed "
                                       f"{len(drafts)} drafted tokens, got {emitted}")
                self._cached(s, n + len(emitted) - 1)  # every emitted token but the last confirms a fed draft
                for tok in emitted:
                    s.token_ids.append(tok)
                    reason = stop_reason(s, tok, self.eos_token_id)
                    if reason is not None:
                        self.running.remove(s)
                        self._finish(s, reason)
                        finished.append(s)
                        break
        return finished

    def _cached(self, seq: Sequence, n: int) -> None:
        """``n`` more of seq's positions have their K/V written: a prefix cache may key their full blocks now."""
        seq.num_cached_tokens += n
        if hasattr(self.kv, "commit"):
            self.kv.commit(seq)

    def _finish(self, seq: Sequence, reason: str) -> None:
        if seq.kv is not None:
            self.kv.free(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
