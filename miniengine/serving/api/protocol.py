"""The body of ``POST /v1/completions``, checked, and turned into the engine's SamplingParams.

Field names and defaults are OpenAI's legacy completions API (https://platform.openai.com/docs/api-reference/completions)
with vLLM's extensions (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``, ``stop_token_ids``,
``include_stop_str_in_output``), which an ``openai`` client sends through ``extra_body``.  Types are strict: ``"16"``
is not a number and ``true`` is not 1, so a client's mistake is named rather than guessed at.  Unknown fields are
refused too (``max_token`` is a typo, not an option to ignore).  Every refusal becomes a 400 with OpenAI's error
body (:func:`error_body`), never FastAPI's 422.
"""
from __future__ import annotations

import secrets
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from miniengine.sampling import MAX_LOGPROBS, SamplingParams

Number = StrictFloat  # strict, yet an integer is a number: 1 is 1.0
# A prompt: a string, token ids, or a list of either (each its own request, as in OpenAI's API).
Prompt = Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    prompt: Prompt
    max_tokens: Annotated[StrictInt, Field(ge=1)] = 16
    temperature: Annotated[Number, Field(ge=0)] = 1.0
    top_p: Number = 1.0
    n: Annotated[StrictInt, Field(ge=1)] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    stop: StrictStr | list[StrictStr] | None = None
    presence_penalty: Number = 0.0
    frequency_penalty: Number = 0.0
    seed: StrictInt | None = None  # None: a fresh random seed per request, as OpenAI and vLLM do
    user: StrictStr | None = None  # accepted and ignored, as vLLM does
    # Accepted at their "off" values only: the engine has no suffix insertion, no logit bias and no best_of search.
    best_of: StrictInt | None = None
    logit_bias: dict[str, Number] | None = None
    suffix: StrictStr | None = None
    # vLLM's extensions
    top_k: StrictInt = 0
    min_p: Number = 0.0
    repetition_penalty: Number = 1.0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: StrictBool = False
    return_tokens_as_token_ids: StrictBool = False  # logprobs' tokens as "token_id:263": exact where text is not

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request: OpenAI's API takes a string, token ids, or a list of either."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise RequestError("prompt must be a non-empty string, token ids, or a non-empty list of them, got []",
                               "prompt")
        return list(p)


class RequestError(ValueError):
    """A request the server refuses: the message, the field at fault, OpenAI's error type and code, the status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code


def error_body(e: RequestError) -> dict:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}}


# The fields SamplingParams checks itself; its ValueError names the field first ("top_k must be ...").
_CHECKED_BY_ENGINE = ("temperature", "top_p", "top_k", "max_tokens", "seed", "n", "stop", "stop_token_ids",
                      "repetition_penalty", "presence_penalty", "frequency_penalty", "min_p", "logprobs")


def param_of(message: str, default: str | None = None) -> str | None:
    """The request field an engine message is about: the field it starts with, or a prompt's length."""
    head = message.split(" ", 1)[0]
    if head in _CHECKED_BY_ENGINE:
        return head
    if head == "len(prompt)":
        return "max_tokens" if "max_tokens" in message.split(" must ")[0] else "prompt"
    if head == "prompt" or message.startswith("request ") or "prompt" in head:
        return "prompt"
    return default


def sampling_params(req: CompletionRequest) -> SamplingParams:
    """The engine's SamplingParams for this request, or a RequestError naming the field."""
    for name, off in (("best_of", (None, 1)), ("logit_bias", (None, {})), ("suffix", (None, ""))):
        value = getattr(req, name)
        if value not in off:
            raise RequestError(f"{name} is not supported by this server: leave it out (got {value!r})", name)
    if req.stream_options is not None and not req.stream:
        raise RequestError("stream_options is only allowed when stream is true", "stream_options")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise RequestError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {req.logprobs}", "logprobs")
    if req.stop is not None and (req.stop == "" or (isinstance(req.stop, list) and not all(req.stop))):
        raise RequestError(f"stop must be a non-empty string or a list of non-empty strings, got {req.stop!r}", "stop")
    seed = secrets.randbits(63) if req.seed is None else req.seed
    stop = () if req.stop is None else req.stop
    try:
        return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, max_tokens=req.max_tokens,
                              seed=seed, ignore_eos=req.ignore_eos, n=req.n, stop=stop,
                              stop_token_ids=tuple(req.stop_token_ids or ()),
                              include_stop_str_in_output=req.include_stop_str_in_output,
                              repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
                              frequency_penalty=req.frequency_penalty, min_p=req.min_p, logprobs=req.logprobs)
    except ValueError as e:
        raise RequestError(str(e), param_of(str(e))) from None


def validation_error(errors: list[dict]) -> RequestError:
    """pydantic's complaint about a body (FastAPI's RequestValidationError) as one 400 naming the first bad field."""
    e = errors[0]
    loc = [str(p) for p in e.get("loc", ()) if p != "body"]
    if e.get("type") == "json_invalid":
        return RequestError(f"the body is not valid JSON: {e.get('msg')} (at character {loc[-1] if loc else '?'})")
    if not loc:
        return RequestError(f"the body must be a JSON object with the completion's fields: {e.get('msg')}")
    field = loc[0]
    where = ".".join(p for p in loc if "[" not in p and p not in ("str", "int", "float", "bool"))  # not union tags
    if e.get("type") == "extra_forbidden":
        return RequestError(f"{where} is not a field of /v1/completions (a typo? the fields are OpenAI's plus vLLM's "
                            f"top_k, min_p, repetition_penalty, ignore_eos, stop_token_ids, include_stop_str_in_output, "
                            f"return_tokens_as_token_ids)",
                            field)
    if e.get("type") == "missing":
        return RequestError(f"{where} is required", field)
    got = e.get("input")
    # a union (the prompt, stop) lists one complaint per alternative; say what is allowed instead
    if field == "prompt":
        return RequestError(f"prompt must be a string, a list of token ids (integers), or a list of strings or of token "
                            f"id lists, got {got!r}", field)
    if field == "stop":
        return RequestError(f"stop must be a non-empty string or a list of non-empty strings, got {got!r}", field)
    return RequestError(f"{where}: {e.get('msg')}, got {got!r}", field)

