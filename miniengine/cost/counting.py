"""Counting, with no hardware yet: model shapes, parameters, bytes and FLOPs of one forward pass.

What the count includes, and why (miniengine/README.md, Cost model):
- FLOPs are the matmuls: 2 per multiply-add.  Norms, RoPE, softmax and SiLU are
  a few FLOPs per element, lost in the noise next to d^2 per token.
- Every weight is read once per forward, whatever the number of tokens: that is
  why batching is nearly free for decode.  The exception is the embedding
  table: looking a token up reads one row, not the table.
- The LM head runs only where logits are used: the last token of each sequence
  in prefill, every token in decode.
- Causal attention does QK^T and AV only for the (query, key) pairs that the
  mask lets through.
- Bytes include the KV history each sequence reads and the KV it writes.
  Activations are ignored: fused kernels keep most of them on chip.

:mod:`miniengine.cost.roofline` turns these counts into seconds on a paper GPU.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from miniengine.model import LlamaConfig

# ---------------------------------------------------------------- models


def llama3_8b() -> LlamaConfig:
    """Meta Llama-3-8B: GQA with 8 KV heads shared by 32 query heads, untied embeddings."""
    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
    )


def llama3_70b() -> LlamaConfig:
    """Meta Llama-3-70B: 64 query heads, still only 8 KV heads."""
    return dataclasses.replace(
        llama3_8b(), hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64
    )


def _course_model(which: str) -> LlamaConfig:
    # Looked up only when asked for: the course's models are trained after this module is written.
    from miniengine import paths
    from miniengine.model import load_config

    directory = {"target": paths.TARGET, "draft": paths.DRAFT}[which]
    if not (directory / "config.json").exists():
        raise ValueError(f"--model {which!r}: {directory / 'config.json'} does not exist yet (train the model first)")
    return load_config(directory)


MODELS = {
    "llama3-8b": llama3_8b,
    "llama3-70b": llama3_70b,
    "target": lambda: _course_model("target"),
    "draft": lambda: _course_model("draft"),
}


def get_model_config(name: str) -> LlamaConfig:
    """A built-in config (llama3-8b, llama3-70b) or one of the course's trained models (target, draft)."""
    if name.lower() not in MODELS:
        raise ValueError(f"--model {name!r} is not a known model; choose one of: {', '.join(MODELS)}")
    return MODELS[name.lower()]()


# ---------------------------------------------------------------- parameters and bytes


def param_breakdown(cfg: LlamaConfig) -> dict[str, int]:
    """Parameters by part, as the worked example "Model size" (miniengine/README.md) counts them by hand."""
    d, hd, L = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers
    parts = {
        "attention_per_layer": 2 * d * cfg.num_attention_heads * hd + 2 * d * cfg.num_key_value_heads * hd,  # q,o; k,v
        "mlp_per_layer": 3 * d * cfg.intermediate_size,  # SwiGLU: gate, up, down
        "norms": (2 * L + 1) * d,  # two RMSNorms per layer and the final one
        "embedding": cfg.vocab_size * d,
        "lm_head": 0 if cfg.tie_word_embeddings else cfg.vocab_size * d,  # a tied head is the embedding
    }
    parts["total"] = (L * (parts["attention_per_layer"] + parts["mlp_per_layer"]) + parts["norms"]
                      + parts["embedding"] + parts["lm_head"])
    return parts


def _layer_matmul_params(cfg: LlamaConfig) -> int:
    """Weights one token multiplies through in one decoder layer."""
    parts = param_breakdown(cfg)
    return parts["attention_per_layer"] + parts["mlp_per_layer"]


def param_count(cfg: LlamaConfig) -> int:
    """All parameters, a tied embedding counted once (the same number ``Llama(cfg).num_parameters()`` gives)."""
    return param_breakdown(cfg)["total"]


def weight_bytes(cfg: LlamaConfig, bytes_per_param: float = 2) -> float:
    """Bytes the weights occupy in GPU memory (16-bit by default)."""
    return param_count(cfg) * bytes_per_param


def kv_bytes_per_token(cfg: LlamaConfig, bytes_per_value: float = 2) -> float:
    """K and V for every layer and KV head: 2 * layers * kv_heads * head_dim values per token."""
    return cfg.kv_bytes_per_token(bytes_per_value)


# ---------------------------------------------------------------- one forward pass


@dataclasses.dataclass(frozen=True)
class ForwardCost:
    """What one forward pass does (FLOPs) and moves (bytes), split so a lecture can show where bytes go.

    The fields may be numpy arrays, one entry per forward, when a simulator prices many steps at once.
    """

    flops: float
    weight_bytes: float  # weights read (the embedding only as gathered rows)
    kv_read_bytes: float  # KV history read by attention
    kv_write_bytes: float  # KV of the new tokens written
    new_tokens: int  # tokens fed through the model, all sequences together
    sequences: int

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved: compare it with the GPU's ridge point."""
        return self.flops / self.bytes


def _cost_from_totals(cfg, new_tokens, sequences, logit_tokens, attention_pairs, cached_tokens,
                      bytes_per_param, bytes_per_value) -> ForwardCost:
    """The accounting itself, from batch totals (scalars, or numpy arrays of many steps)."""
    d, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    lm_head = V * d
    flops = (
        2 * L * _layer_matmul_params(cfg) * new_tokens  # every token goes through every layer's matmuls
        + 2 * lm_head * logit_tokens  # logits only where they are used
        + 4 * L * cfg.num_attention_heads * cfg.head_dim * attention_pairs  # QK^T and AV: 2 matmuls x 2 FLOPs
    )
    # Every weight is read once, except the embedding table: only the rows looked up are read.  A tied
    # table is read in full anyway, as the LM head.
    untied_embedding = 0 if cfg.tie_word_embeddings else lm_head
    weights = (param_count(cfg) - untied_embedding) * bytes_per_param + new_tokens * d * bytes_per_param
    kv = kv_bytes_per_token(cfg, bytes_per_value)
    return ForwardCost(flops, weights, cached_tokens * kv, new_tokens * kv, new_tokens, sequences)


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def forward_cost(cfg: LlamaConfig, new_tokens: Sequence[int], context: Sequence[int], *,
                 logits: str = "last", bytes_per_param: float = 2, bytes_per_value: float = 2) -> ForwardCost:
    """One forward over a ragged batch: sequence i feeds ``new_tokens[i]`` tokens on top of ``context[i]`` cached ones.

    Prefill is ``new_tokens=[prompt_len], context=[0]``; decode is ``new_tokens=[1], context=[history]``;
    a continuous batch mixes both.  ``logits="last"`` computes the LM head for each sequence's last
    token (all that sampling needs); ``"all"`` for every token (speculative verification).
    """
    if len(new_tokens) != len(context) or not len(new_tokens):
        raise ValueError(f"new_tokens and context must be non-empty and of equal length, got {len(new_tokens)} "
                         f"and {len(context)}")
    if logits not in ("last", "all"):
        raise ValueError(f"logits must be 'last' or 'all', got {logits!r}")
    T = [_check_count("new_tokens[i]", t, 1) for t in new_tokens]
    S = [_check_count("context[i]", s, 0) for s in context]
    total = sum(T)
    # Causal mask: the t-th new token sees the s cached tokens and the first t new ones (itself included).
    pairs = sum(t * s + t * (t + 1) // 2 for t, s in zip(T, S))
    return _cost_from_totals(cfg, total, len(T), total if logits == "all" else len(T), pairs, sum(S),
                             bytes_per_param, bytes_per_value)


def prefill_cost(cfg: LlamaConfig, batch: int, prompt_len: int, **kw) -> ForwardCost:
    """``batch`` prompts of ``prompt_len`` tokens each, processed in one forward with an empty cache."""
    _check_count("batch", batch, 1)
    return forward_cost(cfg, [prompt_len] * batch, [0] * batch, **kw)


def decode_cost(cfg: LlamaConfig, batch: int, context: int, **kw) -> ForwardCost:
    """One decode step: each of ``batch`` sequences feeds 1 token and reads ``context`` cached tokens."""
    _check_count("batch", batch, 1)
    return forward_cost(cfg, [1] * batch, [context] * batch, **kw)
