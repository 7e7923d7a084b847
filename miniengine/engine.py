"""The public API, shaped like vLLM's so that what students learn transfers:

    llm = LLM(model="data/models/target")
    outputs = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=64))
    print(outputs[0].text)
    for delta in llm.stream("import os", SamplingParams(max_tokens=32)):
        print(delta, end="")

Behind it, decoding runs with the KV cache (milestone 2).  A bad request
raises ValueError naming the field; ``generate`` checks every request before
running any, and says which request index is at fault.
"""
from __future__ import annotations

import dataclasses

import torch

from .kv_cache import cached_decode, cached_generate
from .model import load_model
from .paths import resolve_model_dir
from .reference import naive_generate
from .request import validate_requests
from .sampling import SamplingParams
from .tokenizer import IncrementalDetokenizer, load_tokenizer

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclasses.dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    tokens_processed: int


class LLM:
    def __init__(self, model: str = "data/models/target", dtype: str = "float32", device: str = "cpu",
                 kv_cache: bool = True):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.model_dir = resolve_model_dir(model)
        self.dtype = DTYPES[dtype]
        self.model = load_model(self.model_dir, dtype=self.dtype, device=device)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.kv_cache = kv_cache

    def _prepare(self, prompts, sampling_params):
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt, not a list of them
        texts, ids = [], []
        for p in prompts:
            if isinstance(p, str):
                texts.append(p)
                ids.append(self.tokenizer.encode(p).ids)
            else:
                texts.append(None)
                ids.append(p)
        cfg = self.model.config
        params = sampling_params if sampling_params is not None else SamplingParams()
        ids, params = validate_requests(ids, params, cfg.vocab_size, cfg.max_position_embeddings)
        return texts, ids, params

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Prompts are strings or lists of token ids; returns one RequestOutput per prompt, in order."""
        texts, ids, params = self._prepare(prompts, sampling_params)
        decode = cached_generate if self.kv_cache else naive_generate
        completions = decode(self.model, ids, params, dtype=self.dtype)
        return [RequestOutput(n, t, c.prompt_token_ids, c.token_ids, self.tokenizer.decode(c.token_ids),
                              c.finish_reason, c.tokens_processed)
                for n, (t, c) in enumerate(zip(texts, completions))]

    def stream(self, prompt, sampling_params: SamplingParams | None = None):
        """Yields the completion's text in pieces as tokens are generated."""
        _, ids, params = self._prepare([prompt], sampling_params)
        detok = IncrementalDetokenizer(self.tokenizer)
        for _, tok in cached_decode(self.model, ids, params, dtype=self.dtype):
            delta = detok.push(tok)
            if delta:
                yield delta
