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
