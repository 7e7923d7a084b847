"""A contiguous per-sequence KV cache, and cached decode through the seam.

Naive decode recomputes K and V for the whole prefix at every step, although
they never change: a token's K and V depend only on the tokens before it.  The
cache keeps them.  Prefill runs the prompt once and fills the cache; each
decode step then feeds only the newest token, appends its K/V, and attends over
the stored history.  Same math (the same ``causal_attention``), far fewer FLOPs:
a request processes Lp + Lo - 1 tokens instead of sum(Lp + t).

The price is memory.  This cache reserves ``max_len`` slots per sequence up
front, as early serving systems did; :attr:`KVCache.bytes_reserved` against
:attr:`KVCache.bytes_used` is the waste that PagedAttention later removes.
"""
from __future__ import annotations

import dataclasses

import torch

from .attention import causal_attention
from .reference import Completion, in_dtype
from .request import validate_requests
from .sampling import sample_token


class KVCache:
    """K and V of one sequence, for every layer, in one contiguous reservation of ``max_len`` slots."""

    def __init__(self, config, max_len: int, dtype=torch.float32, device="cpu"):
        shape = (config.num_hidden_layers, max_len, config.num_key_value_heads, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0  # tokens whose K/V are stored (in every layer)

    @property
    def bytes_used(self) -> int:
        return 2 * self.k[:, : self.length].numel() * self.k.element_size()

    @property
    def bytes_reserved(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[0]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: writing positions [{start}, {end}) into a cache of max_len={self.max_len}")
        self.k[layer, start:end] = k
        self.v[layer, start:end] = v


class CachedBackend:
    """Attention for a ragged batch whose sequences each own a :class:`KVCache`.

    The step's flattened tokens are, for each sequence in order, ``new_tokens[i]``
    tokens that continue at position ``caches[i].length``: the whole prompt in
    prefill, one token in decode.  Their K/V are written to the cache first; then
    the queries attend over everything stored so far.
    """

    def __init__(self, caches: list[KVCache], new_tokens: list[int]):
        self.caches, self.new_tokens = caches, [int(n) for n in new_tokens]

    def positions(self, device="cpu") -> torch.Tensor:
        return torch.cat([torch.arange(c.length, c.length + n, device=device) for c, n in zip(self.caches, self.new_tokens)])

    def attend(self, layer, q, k, v):
        out = torch.empty_like(q)
        start = 0
        for cache, n in zip(self.caches, self.new_tokens):
            sl = slice(start, start + n)
            cache.write(layer, cache.length, k[sl], v[sl])
            total = cache.length + n
            k_pos = torch.arange(total, device=q.device)
            out[sl] = causal_attention(q[sl], cache.k[layer, :total], cache.v[layer, :total], k_pos[cache.length :], k_pos)
            start += n
        return out

    def advance(self) -> None:
        """Called once after the forward pass: the new tokens' K/V are now stored in every layer."""
        for cache, n in zip(self.caches, self.new_tokens):
            cache.length += n


@dataclasses.dataclass
class CachedCompletion(Completion):
    kv_bytes_used: int = 0
    kv_bytes_reserved: int = 0


def cached_generate(model, prompts, params, eos_token_id: int | None = None, dtype=torch.float32,
                    return_logits: bool = False, on_token=None) -> list[CachedCompletion]:
    """Same contract and same tokens as :func:`miniengine.reference.naive_generate`, with a KV cache.

    The batch is static: all prompts prefill together, then every unfinished
    sequence decodes one token per step.
    """
    steps = cached_decode(model, prompts, params, eos_token_id, dtype, return_logits)
    while True:
        try:
            i, tok = next(steps)
        except StopIteration as done:
            return done.value
        if on_token is not None:
            on_token(i, tok)


@torch.no_grad()
def cached_decode(model, prompts, params, eos_token_id=None, dtype=torch.float32, return_logits=False):
    """Generator form of :func:`cached_generate`: yields (request index, token id) as each token is chosen,
    and returns the completions."""
    cfg = model.config
    if eos_token_id is None:
        eos_token_id = cfg.eos_token_id
    prompts, params = validate_requests(prompts, params, cfg.vocab_size, cfg.max_position_embeddings)
    model = in_dtype(model, dtype)
    device = model.device
    caches = [KVCache(cfg, len(p) + sp.max_tokens, dtype, device) for p, sp in zip(prompts, params)]
    out = [CachedCompletion(p, [], "length", 0, [] if return_logits else None) for p in prompts]

    active = list(range(len(prompts)))
    feed = {i: prompts[i] for i in active}  # prefill: the whole prompt; then the last sampled token
    while active:
        backend = CachedBackend([caches[i] for i in active], [len(feed[i]) for i in active])
        ids = torch.tensor([t for i in active for t in feed[i]], device=device)
        last = torch.tensor([len(feed[i]) for i in active], device=device).cumsum(0) - 1
        logits = model(ids, backend.positions(device), backend, logits_indices=last).cpu()
        backend.advance()
        still = []
        for row, i in enumerate(active):
            c = out[i]
            c.tokens_processed += len(feed[i])
            if return_logits:
                c.logits.append(logits[row].clone())
            tok = sample_token(logits[row], params[i], position=caches[i].length)
            c.token_ids.append(tok)
            yield i, tok
            if tok == eos_token_id and not params[i].ignore_eos:
                c.finish_reason = "stop"
            elif len(c.token_ids) < params[i].max_tokens:
                still.append(i)
                feed[i] = [tok]
        active = still
    for c, cache in zip(out, caches):
        c.kv_bytes_used, c.kv_bytes_reserved = cache.bytes_used, cache.bytes_reserved
    return out
