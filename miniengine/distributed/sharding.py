"""Tensor-parallel layers, Megatron-style: a rank's slice of every weight matrix, and the model built from them.

When a model's weights outgrow one GPU (Llama-3-70B needs 141 GB in bf16), tensor parallelism gives
every rank a slice of *every* layer, and the ranks run each layer together.  The split follows
Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", 2019, https://arxiv.org/abs/1909.08053 (section 3), which pairs the matmuls so that
each pair needs a single collective:

* **Attention block.** q/k/v_proj are *column-parallel*: rank r keeps the output rows of its own
  heads (heads are contiguous blocks of head_dim rows), so it computes q, k and v for its heads only
  and attends over them with no help: heads never mix.  o_proj is *row-parallel*: rank r keeps the
  input columns that read its heads' outputs, and produces a partial sum of the full hidden vector.
  With GQA the KV heads are split too, and a rank's query heads map onto its own KV heads, because
  query head h reads KV head h // (heads per KV head) and both are cut into the same number of blocks.
* **MLP block.** gate_proj and up_proj are column-parallel (rank r keeps a slice of the intermediate
  rows; SiLU and the product are elementwise, so they need nothing from other ranks), down_proj is
  row-parallel (the matching input columns), again a partial sum.
* **One all-reduce per block**: one all-reduce (sum) at the output of each attention block and one at
  the output of each MLP block, in :class:`RowParallelLinear`.  That is two per transformer layer,
  2 x num_hidden_layers per forward, each of [tokens, hidden_size] values; nothing else is exchanged.
* The embedding, the norms and the LM head are replicated (Megatron also splits the embedding and the
  LM head by vocabulary; at this size they are not worth a third collective).  Every rank then holds
  the same logits and samples the same token: the sampler's noise is keyed by (seed, position).

Each rank runs the course's own model and attention (one forward path): :func:`shard_model` returns a
copy of the model whose Linear layers are column- or row-parallel slices and whose attention modules
count only their rank's heads.  Each rank's KV cache holds only its own KV heads (:func:`rank_kv_shape`),
so KV memory per rank shrinks by the world size as well.  :func:`miniengine.distributed.launcher.tp_generate` starts the ranks.

Exactness.  An all-reduce adds the ranks' partial sums of the row-parallel matmuls, a different
summation order than one matmul over the whole row, so float32 logits differ from the unsharded run
in the last bits: at most 7.6e-6 on the visible golden cases (float64: 3e-14), which
``python -m miniengine bench tp`` measures.  The golden prompts are screened so that no decision is
within GAP = 1e-3 of a tie (miniengine/course/golden/screening.py), over a hundred times that difference (sampled
steps divide the logits by the temperature first, which scales it by at most 1/0.7 here), so the tokens stay
exact.

The all-reduce itself, and the plug points that replace it, are in :mod:`miniengine.distributed.comm`;
the split functions are plug points too (:class:`Plan`).
"""
from __future__ import annotations

import copy
import dataclasses
import time
import types

import torch
import torch.distributed as dist
from torch import nn

from miniengine.distributed.comm import GlooComm

SHARDED_FIELDS = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


def check_world_size(cfg, world_size: int) -> None:
    """A ValueError naming the field and the allowed world sizes, unless ``world_size`` splits the model evenly."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    # Each rank keeps whole heads, whole KV heads and an equal slice of the MLP.
    allowed = [p for p in range(1, cfg.num_attention_heads + 1)
               if all(getattr(cfg, f) % p == 0 for f in SHARDED_FIELDS)]
    for field in SHARDED_FIELDS:
        value = getattr(cfg, field)
        if value % world_size:
            raise ValueError(f"world_size={world_size} must divide {field}={value} (each rank keeps an equal share); "
                             f"allowed world sizes for this model: {', '.join(map(str, allowed))}")




# ---------------------------------------------------------------- plug points: splitting a weight


def column_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s block of output rows (dim 0) of a ``[out, in]`` weight: it computes that slice of the output."""
    rows = weight.shape[0] // world_size
    return weight[rank * rows:(rank + 1) * rows]


def row_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s block of input columns (dim 1): it reads that slice of the input, and makes a partial sum."""
    cols = weight.shape[1] // world_size
    return weight[:, rank * cols:(rank + 1) * cols]


@dataclasses.dataclass
class Plan:
    """The three plug points of a tensor-parallel run (None: the course's split, gloo's own all-reduce)."""

    column_shard: object = None
    row_shard: object = None
    all_reduce: object = None

    def __post_init__(self):
        for name in ("column_shard", "row_shard", "all_reduce"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a function, got {type(fn).__name__}")


def _split(fn, name: str, linear: nn.Linear, rank: int, world_size: int, dim: int, where: str) -> torch.Tensor:
    """A plug's slice of ``linear``'s weight, checked: a tensor of the expected shape, copied out of the original."""
    full = linear.weight.detach()
    want = list(full.shape)
    want[dim] //= world_size
    got = fn(full, rank, world_size)
    if not isinstance(got, torch.Tensor):
        raise TypeError(f"{name} returned {type(got).__name__} for {where}, expected a torch.Tensor")
    if list(got.shape) != want:
        raise ValueError(f"{name}(weight of shape {list(full.shape)}, rank={rank}, world_size={world_size}) for "
                         f"{where} returned shape {list(got.shape)}, expected {want}")
    return got.detach().clone().contiguous()


class ColumnParallelLinear(nn.Module):
    """This rank's block of output rows of ``linear``: a slice of the output, no communication."""

    def __init__(self, linear: nn.Linear, rank: int, world_size: int, split=None, where: str = "a column-parallel layer"):
        super().__init__()
        self.weight = nn.Parameter(_split(split or column_shard, "column_shard", linear, rank, world_size, 0, where),
                                   requires_grad=False)

    def forward(self, x):
        return nn.functional.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """This rank's block of input columns of ``linear``; an all-reduce adds the ranks' partial outputs.

    The input is already split the same way (it is the output of column-parallel layers), so
    ``x @ W_r^T`` is rank r's share of the sum over the hidden dimension.  ``comm_s`` and
    ``comm_calls`` count the time spent inside the all-reduce (which includes waiting for the
    slowest rank to arrive), so that a benchmark can set it beside the step time.
    """

    def __init__(self, linear: nn.Linear, rank: int, world_size: int, group=None, split=None, all_reduce=None,
                 where: str = "a row-parallel layer"):
        super().__init__()
        self.weight = nn.Parameter(_split(split or row_shard, "row_shard", linear, rank, world_size, 1, where),
                                   requires_grad=False)
        self.world_size, self.group, self.all_reduce = world_size, group, all_reduce
        self.comm_s, self.comm_calls = 0.0, 0
        self._comm = None

    def forward(self, x):
        y = nn.functional.linear(x, self.weight)
        if self.world_size > 1:  # one rank holds the whole sum already
            t0 = time.perf_counter()
            if self.all_reduce is None:
                dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
            else:
                self._comm = self._comm or GlooComm(self.group)
                out = self.all_reduce(y, self._comm)
                if not isinstance(out, torch.Tensor) or out.shape != y.shape or out.dtype != y.dtype:
                    raise ValueError(f"all_reduce must return a tensor of the input's shape {list(y.shape)} and dtype "
                                     f"{y.dtype}, got {getattr(out, 'shape', type(out).__name__)}")
                y = out
            self.comm_s += time.perf_counter() - t0
            self.comm_calls += 1
        return y


def shard_model(model, rank: int, world_size: int, group=None, plan: Plan | None = None):
    """Rank ``rank``'s shard of ``model`` (a copy; the original is untouched).

    Column-parallel q/k/v_proj and gate/up_proj, row-parallel o_proj and down_proj (with the
    all-reduce), embedding, norms and LM head replicated; each attention module counts only its
    rank's query and KV heads, so the model's own forward runs unchanged on the shard.  ``plan``
    replaces the split functions and the all-reduce (:class:`Plan`).
    """
    plan = plan or Plan()
    cfg = model.config
    check_world_size(cfg, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
    layers = [m for layer in model.model.layers for m in (layer.self_attn, layer.mlp)]
    for name, m in ((n, m) for block in layers for n, m in block.named_children()):
        if not isinstance(m, nn.Linear):
            raise ValueError(f"shard_model splits nn.Linear weights; {name} is a {type(m).__name__} "
                             f"(shard the float model, before quantizing)")
    shard = copy.deepcopy(model)
    for i, layer in enumerate(shard.model.layers):
        attn, mlp = layer.self_attn, layer.mlp

        def column(block, name):
            return ColumnParallelLinear(getattr(block, name), rank, world_size, plan.column_shard, f"layer {i} {name}")

        def row(block, name):
            return RowParallelLinear(getattr(block, name), rank, world_size, group, plan.row_shard, plan.all_reduce,
                                     f"layer {i} {name}")

        attn.q_proj, attn.k_proj, attn.v_proj = (column(attn, n) for n in ("q_proj", "k_proj", "v_proj"))
        attn.o_proj = row(attn, "o_proj")
        attn.n_heads, attn.n_kv = attn.n_heads // world_size, attn.n_kv // world_size
        mlp.gate_proj, mlp.up_proj = column(mlp, "gate_proj"), column(mlp, "up_proj")
        mlp.down_proj = row(mlp, "down_proj")
    shard.tensor_parallel = (rank, world_size)
    return shard


def rank_kv_shape(cfg, world_size: int):
    """What a KV pool needs to know to hold one rank's K/V: all layers, this rank's KV heads."""
    return types.SimpleNamespace(num_hidden_layers=cfg.num_hidden_layers, head_dim=cfg.head_dim,
                                 num_key_value_heads=cfg.num_key_value_heads // world_size)


def comm_stats(model) -> tuple[float, int]:
    """(seconds inside all-reduces, number of all-reduces) since the counters were last reset."""
    row = [m for m in model.modules() if isinstance(m, RowParallelLinear)]
    return sum(m.comm_s for m in row), sum(m.comm_calls for m in row)


def reset_comm_stats(model) -> None:
    for m in model.modules():
        if isinstance(m, RowParallelLinear):
            m.comm_s, m.comm_calls = 0.0, 0
