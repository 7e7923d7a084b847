"""What the engine returns, in vLLM's shape."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class CompletionOutput:
    """One of a request's ``n`` completions."""
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it (vLLM's name)
    # SamplingParams(logprobs=k): per output token, {token id: logprob} of the chosen token and the k most likely,
    # under the model's raw distribution (miniengine.logits_processors.top_logprobs)
    logprobs: list[dict[int, float]] | None = None

    @property
    def cumulative_logprob(self) -> float | None:
        """The sum of the chosen tokens' logprobs (None without logprobs)."""
        if self.logprobs is None:
            return None
        return float(sum(entry[t] for entry, t in zip(self.logprobs, self.token_ids)))


@dataclasses.dataclass
class RequestOutput:
    request_id: object
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]      # generated tokens; ends with end-of-text when finish_reason == "stop"
    text: str
    finish_reason: str | None  # "stop", "length", "abort", or None while still running
    tokens_processed: int      # tokens fed through the model for this request, over all steps
    finished: bool = True
    # Every completion, in index order (SamplingParams.n of them); token_ids, text and finish_reason
    # above are completion 0's.
    outputs: list[CompletionOutput] = dataclasses.field(default_factory=list)
