"""A Sequence carries one request's state through the engine, from waiting to finished."""
from __future__ import annotations

import enum
import itertools

from miniengine.sampling import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"    # queued (or preempted and requeued); holds no KV memory
    RUNNING = "running"    # admitted; owns KV memory and decodes one token per step
    FINISHED = "finished"  # stopped (end-of-text, max_tokens or abort); its KV memory is freed


class Sequence:
    """Token ids (prompt, then output), how many of them the KV cache holds, and the request's own params.

    ``num_cached_tokens`` counts the tokens whose K/V are stored.  The tokens a
    step must feed are the ones after it: the whole prompt at first, then the
    last sampled token.  The last token chosen is never fed, so a finished
    request has fed Lp + Lo - 1 tokens.
    """

    _ids = itertools.count()

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, request_id=None, arrival_time: float = 0.0):
        self.seq_id = next(Sequence._ids)
        self.request_id = self.seq_id if request_id is None else request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.num_cached_tokens = 0
        self.tokens_processed = 0  # tokens fed through the model, over all steps (recomputation counts again)
        self.finish_reason: str | None = None  # "stop" (end-of-text), "length" (max_tokens) or "abort"
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it, as vLLM says
        self.logprobs: list[dict] | None = [] if params.logprobs is not None else None  # one entry per output token
        self.arrival_time = arrival_time
        self.kv = None  # the KV plug's handle, while RUNNING
        self.logits: list | None = None  # the chosen rows, when the engine keeps them
        # SamplingParams(n > 1): this sequence is completion 0; after its prefill the engine forks
        # completions 1 .. n-1 from it (``fork``), which share its prompt's KV blocks.
        self.child_index = 0
        self.fork_pending = params.n > 1
        self.children: list[Sequence] = []
        self.parent: Sequence | None = None
        self.num_preemptions = 0  # times its KV memory was taken back and its tokens recomputed

    def fork(self, index: int, params: SamplingParams) -> "Sequence":
        """Completion ``index`` of this request: the same tokens so far, its own params, the same request_id."""
        child = Sequence(self.prompt_token_ids, params, self.request_id, self.arrival_time)
        child.token_ids = list(self.token_ids)
        child.num_cached_tokens, child.status, child.child_index = self.num_cached_tokens, self.status, index
        child.parent = self
        self.children.append(child)
        return child

    @property
    def completions(self) -> list["Sequence"]:
        """Every completion of the request, in index order: this one, then its forks."""
        return [self] + self.children

    @property
    def root(self) -> "Sequence":
        """The sequence the request started as (completion 0)."""
        return self if self.parent is None else self.parent

    @property
    def request_finished(self) -> bool:
        """Every completion of this sequence's request has finished (none is still to be forked)."""
        root = self.root
        return not root.fork_pending and all(s.is_finished for s in root.completions)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_new_tokens(self) -> int:
        """Tokens this sequence must feed in its next step."""
        return self.num_tokens - self.num_cached_tokens

    @property
    def max_len(self) -> int:
        """Positions its KV cache may have to hold: the prompt plus every token it may generate."""
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence(request_id={self.request_id!r}, status={self.status.value}, prompt={self.num_prompt_tokens}, "
                f"output={len(self.output_token_ids)}, cached={self.num_cached_tokens})")
