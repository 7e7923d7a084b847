"""The Llama stack: config, weights in the Hugging Face layout, and the forward pass.

The model never owns a KV cache.  Every layer hands its freshly projected q, k, v
to ``backend.attend(layer, q, k, v)``; the backend decides which history each
query sees (miniengine/README.md, "The seam").  That single call is the seam every milestone
plugs into: naive decode, KV cache, batching, paging and speculation differ only
in the backend they pass here.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from miniengine.attention import apply_rope, rope_cos_sin


@dataclasses.dataclass
class LlamaConfig:
    """The subset of Hugging Face's ``LlamaConfig`` this course uses (same field names)."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 704
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    max_position_embeddings: int = 512
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    bos_token_id: int = 0
    eos_token_id: int = 0

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads={self.num_attention_heads}"
            )
        if self.num_key_value_heads < 1 or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """K and V, for every layer and KV head: 2 * L * n_kv * head_dim values per token."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * bytes_per_value

    def to_hf_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            head_dim=self.head_dim,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            torch_dtype="float32",
        )
        return d

    @classmethod
    def from_hf_dict(cls, d: dict) -> "LlamaConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        cfg = cls(**{k: v for k, v in d.items() if k in names})
        if d.get("head_dim", cfg.head_dim) != cfg.head_dim:
            raise ValueError(f"head_dim={d['head_dim']} must equal hidden_size/num_attention_heads={cfg.head_dim}")
        return cfg


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(nn.Module):
    """Projections and RoPE only: the attention itself is the backend's job."""

    def __init__(self, cfg: LlamaConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, backend):
        T = x.shape[0]
        q = apply_rope(self.q_proj(x).view(T, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(T, self.n_kv, self.head_dim), cos, sin)
        v = self.v_proj(x).view(T, self.n_kv, self.head_dim)
        out = backend.attend(self.layer, q, k, v)  # [T, n_heads, head_dim]
        return self.o_proj(out.reshape(T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, backend):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """Named ``model`` inside ``Llama`` so parameter names match HF (``model.layers.0...``)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self._rope: dict = {}  # (dtype, device) -> RoPE cos/sin tables; not parameters, not saved
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # The final norm's weight: always a float parameter, even when the linear layers are quantized.
    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def rope_tables(self, dtype, device):
        """cos/sin for every position up to max_position_embeddings, computed once per dtype and device.

        A decode step then only gathers rows, instead of recomputing the angles.
        """
        key = (dtype, str(device))
        if key not in self._rope:
            c = self.config
            self._rope[key] = rope_cos_sin(torch.arange(c.max_position_embeddings, device=device), c.head_dim, c.rope_theta, dtype)
        return self._rope[key]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() yields a tied weight once

    def forward(self, input_ids, positions, backend, logits_indices=None):
        """input_ids, positions: [T] (all tokens of all sequences in this step, flattened).

        Returns logits [T, vocab], or only the rows in ``logits_indices`` (for example the
        last token of each sequence in prefill, which is all that sampling needs).
        """
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rope_tables(x.dtype, x.device)
        cos, sin = cos[positions], sin[positions]
        for layer in self.model.layers:
            x = layer(x, cos, sin, backend)
        x = self.model.norm(x)
        if logits_indices is not None:
            x = x[logits_indices]
        return self.lm_head(x)


# ---------------------------------------------------------------- HF layout on disk

def save_model(model: Llama, directory: str | Path) -> None:
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # HF stores a tied head once, under the embedding's name
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")


def load_config(directory: str | Path) -> LlamaConfig:
    return LlamaConfig.from_hf_dict(json.loads((Path(directory) / "config.json").read_text()))


def load_model(directory: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Llama:
    from safetensors.torch import load_file

    directory = Path(directory)
    if not (directory / "config.json").exists():
        raise FileNotFoundError(f"no model at {directory}: expected config.json and model.safetensors there")
    model = Llama(load_config(directory))
    state = load_file(str(directory / "model.safetensors"))
    if model.config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval()
