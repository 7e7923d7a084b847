"""Checks a request must pass before it reaches the engine.

Every message names the field, the value given and the allowed range, because
students read them.  An engine calls this per request, so one bad request is
rejected on its own and the others keep running.
"""
from __future__ import annotations

import numbers

from miniengine.sampling import SamplingParams


def validate_prompt(prompt_ids, params: SamplingParams, vocab_size: int, max_position_embeddings: int) -> list[int]:
    """Returns the prompt as a list of plain ints, or raises ValueError."""
    try:
        ids = list(prompt_ids)
    except TypeError:
        raise ValueError(f"prompt must be a sequence of token ids, got {type(prompt_ids).__name__}") from None
    if not ids:
        raise ValueError("prompt must contain at least 1 token, got an empty prompt")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab_size:
            raise ValueError(f"prompt token id at index {i} must be an integer in [0, {vocab_size}), got {t!r}")
    for t in params.stop_token_ids:
        if t >= vocab_size:
            raise ValueError(f"stop_token_ids must hold token ids in [0, {vocab_size}), got {t}")
    total = len(ids) + params.max_tokens
    if total > max_position_embeddings:
        raise ValueError(
            f"len(prompt) + max_tokens must be <= max_position_embeddings={max_position_embeddings}, "
            f"got {len(ids)} + {params.max_tokens} = {total}"
        )
    return [int(t) for t in ids]


def validate_requests(prompts, params, vocab_size: int, max_position_embeddings: int):
    """A batch of prompts with one SamplingParams for all or one per prompt.

    Returns (prompts as lists of ints, one SamplingParams per prompt); a bad
    request's error starts with its index, so the caller knows which one to fix.
    """
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(f"params must be one SamplingParams or one per prompt: got {len(params)} for {len(prompts)} prompts")
    checked = []
    for n, (p, sp) in enumerate(zip(prompts, params)):
        try:
            checked.append(validate_prompt(p, sp, vocab_size, max_position_embeddings))
        except ValueError as e:
            raise ValueError(f"request {n}: {e}") from None
    return checked, params
