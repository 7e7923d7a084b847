"""Tensor parallelism, Megatron-style: one model's weight matrices split across ranks.

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
so KV memory per rank shrinks by the world size as well.  :func:`tp_generate` starts ``world_size``
processes with ``torch.multiprocessing`` and ``torch.distributed``'s gloo backend over loopback
(127.0.0.1, a free port, every wait bounded by a timeout); each rank runs the real engine on its shard.

Exactness.  An all-reduce adds the ranks' partial sums of the row-parallel matmuls, a different
summation order than one matmul over the whole row, so float32 logits differ from the unsharded run
in the last bits: at most 7.6e-6 on the visible golden cases (float64: 3e-14), which
``python -m miniengine bench tp`` measures.  The golden prompts are screened so that no decision is
within GAP = 1e-3 of a tie (miniengine/golden.py), over a hundred times that difference (sampled steps
divide the logits by the temperature first, which scales it by at most 1/0.7 here), so the tokens stay
exact.

Ranks are started with ``spawn``, so a script that calls :func:`tp_generate` needs the
``if __name__ == "__main__":`` guard (notebooks and ``python -m`` need nothing).

    python -m miniengine bench tp      # step time and all-reduce time, 1 and 2 ranks on this CPU; the 70B forecast
"""
from __future__ import annotations

import copy
import datetime
import os
import pickle
import queue
import socket
import time
import types

import torch
import torch.distributed as dist
from torch import nn

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


class ColumnParallelLinear(nn.Module):
    """This rank's block of output rows of ``linear``: a slice of the output, no communication."""

    def __init__(self, linear: nn.Linear, rank: int, world_size: int):
        super().__init__()
        rows = linear.out_features // world_size
        self.weight = nn.Parameter(linear.weight.detach()[rank * rows:(rank + 1) * rows].clone(), requires_grad=False)

    def forward(self, x):
        return nn.functional.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """This rank's block of input columns of ``linear``; an all-reduce adds the ranks' partial outputs.

    The input is already split the same way (it is the output of column-parallel layers), so
    ``x @ W_r^T`` is rank r's share of the sum over the hidden dimension.  ``comm_s`` and
    ``comm_calls`` count the time spent inside the all-reduce (which includes waiting for the
    slowest rank to arrive), so that a benchmark can set it beside the step time.
    """

    def __init__(self, linear: nn.Linear, rank: int, world_size: int, group=None):
        super().__init__()
        cols = linear.in_features // world_size
        self.weight = nn.Parameter(linear.weight.detach()[:, rank * cols:(rank + 1) * cols].clone(),
                                   requires_grad=False)
        self.world_size, self.group = world_size, group
        self.comm_s, self.comm_calls = 0.0, 0

    def forward(self, x):
        y = nn.functional.linear(x, self.weight)
        if self.world_size > 1:  # one rank holds the whole sum already
            t0 = time.perf_counter()
            dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
            self.comm_s += time.perf_counter() - t0
            self.comm_calls += 1
        return y


def shard_model(model, rank: int, world_size: int, group=None):
    """Rank ``rank``'s shard of ``model`` (a copy; the original is untouched).

    Column-parallel q/k/v_proj and gate/up_proj, row-parallel o_proj and down_proj (with the
    all-reduce), embedding, norms and LM head replicated; each attention module counts only its
    rank's query and KV heads, so the model's own forward runs unchanged on the shard.
    """
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
    for layer in shard.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(attn, name, ColumnParallelLinear(getattr(attn, name), rank, world_size))
        attn.o_proj = RowParallelLinear(attn.o_proj, rank, world_size, group)
        attn.n_heads, attn.n_kv = attn.n_heads // world_size, attn.n_kv // world_size
        mlp.gate_proj = ColumnParallelLinear(mlp.gate_proj, rank, world_size)
        mlp.up_proj = ColumnParallelLinear(mlp.up_proj, rank, world_size)
        mlp.down_proj = RowParallelLinear(mlp.down_proj, rank, world_size, group)
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


# ---------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), names[0])


def _entry(rank, world_size, port, timeout_s, threads, results, worker, args):
    # gloo picks a network interface from the host name unless told; keep every byte on loopback.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback())
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        # Plain pickle, by value: torch's own queue pickling would pass tensors as shared-memory handles,
        # which die with this process.
        results.put((rank, pickle.dumps(worker(rank, world_size, *args))))
        dist.barrier()  # nobody tears the group down while another rank still talks to it
    finally:
        dist.destroy_process_group()


def launch(worker, world_size: int, args=(), timeout_s: float = 120.0, threads: int = 1) -> list:
    """Run ``worker(rank, world_size, *args)`` in ``world_size`` fresh processes joined by a gloo group.

    Returns the workers' return values, by rank.  ``worker`` must be a module-level function (it is
    pickled by name).  A rank that raises ends the run with its traceback; a run that takes longer
    than ``timeout_s`` (each collective is bounded by it too) is killed with a TimeoutError.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = mp.start_processes(_entry, args=(world_size, _free_port(), timeout_s, threads, results, worker, args),
                               nprocs=world_size, join=False, start_method="spawn")
    deadline, out = time.monotonic() + timeout_s, {}
    try:
        while len(out) < world_size:  # read before joining: a child exits only once its result is read
            if time.monotonic() > deadline:
                raise TimeoutError(f"tensor-parallel run of {world_size} ranks took more than {timeout_s} s")
            try:
                rank, value = results.get(timeout=0.2)
                out[rank] = pickle.loads(value)
            except queue.Empty:
                procs.join(timeout=0)  # raises at once if a rank died
        while not procs.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"tensor-parallel ranks did not exit within {timeout_s} s")
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world_size)]


# ---------------------------------------------------------------- decoding on the ranks


def _generate_rank(rank, world_size, model, prompts, params, dtype, return_logits, decoder):
    from .config import DTYPES, EngineConfig
    from .engine import LLMEngine
    from .kv import PagedKV
    from .model import load_model
    from .reference import naive_generate

    if not isinstance(model, nn.Module):
        model = load_model(model)  # each rank reads the checkpoint itself, then keeps its slice
    shard = shard_model(model.to(DTYPES[dtype]), rank, world_size)
    del model
    if decoder == "reference":  # the oracle's own loop (no cache, logits in the model's dtype), on the shard
        outs = naive_generate(shard, prompts, params, dtype=DTYPES[dtype], return_logits=return_logits)
        return [dict(token_ids=c.token_ids, finish_reason=c.finish_reason, tokens_processed=c.tokens_processed,
                     logits=c.logits if rank == 0 else None) for c in outs]
    block = 16
    blocks = sum(-(-(len(p) + sp.max_tokens) // block) for p, sp in zip(prompts, params))
    kv = PagedKV(rank_kv_shape(shard.config, world_size), blocks, block, DTYPES[dtype])
    # Every rank runs the same deterministic scheduler on the same requests, so the ranks take the same
    # steps in the same order and meet at every all-reduce with tensors of the same shape.
    engine = LLMEngine(EngineConfig(model=shard, dtype=dtype, kv=kv, max_num_seqs=len(prompts),
                                    kv_cache_tokens=blocks * block, max_num_batched_tokens=max(4096, blocks * block)),
                       keep_logits=return_logits)
    seqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    while engine.has_unfinished_requests():
        engine.step()
    return [dict(token_ids=s.output_token_ids, finish_reason=s.finish_reason, tokens_processed=s.tokens_processed,
                 logits=s.logits if return_logits and rank == 0 else None) for s in seqs]


def tp_generate(model, prompts, params, world_size: int = 2, dtype=torch.float32, return_logits: bool = False,
                decoder: str = "engine", timeout_s: float = 120.0):
    """Decode ``prompts`` with the model sharded over ``world_size`` ranks; what ``naive_generate`` returns.

    ``model`` is a model directory (each rank loads it) or a loaded Llama (sent to each rank).
    ``decoder="engine"`` runs the engine (paged KV cache, each rank holding its own KV heads; the
    logits it keeps are float32); ``"reference"`` runs naive decode, whose logits keep the model's
    dtype (float64 for a float64 run).  The ranks must agree token for token (they hold the same
    logits); rank 0's logits are returned when asked for.
    """
    from .config import DTYPES
    from .model import load_config
    from .paths import resolve_model_dir
    from .reference import Completion
    from .request import validate_requests

    if not isinstance(model, nn.Module):
        model = str(resolve_model_dir(model))
    cfg = model.config if isinstance(model, nn.Module) else load_config(model)
    check_world_size(cfg, world_size)
    if decoder not in ("engine", "reference"):
        raise ValueError(f"decoder must be 'engine' or 'reference', got {decoder!r}")
    names = {v: k for k, v in DTYPES.items()}
    if dtype not in names:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    prompts, params = validate_requests(prompts, params, cfg.vocab_size, cfg.max_position_embeddings)
    if any(sp.n != 1 for sp in params):
        raise ValueError("tp_generate decodes one completion per request: every SamplingParams needs n=1")
    ranks = launch(_generate_rank, world_size, (model, prompts, params, names[dtype], return_logits, decoder),
                   timeout_s)
    tokens = [[r["token_ids"] for r in rank] for rank in ranks]
    if any(t != tokens[0] for t in tokens):
        raise RuntimeError("tensor-parallel ranks chose different tokens: their logits should be identical")
    return [Completion(p, r["token_ids"], r["finish_reason"], r["tokens_processed"], r["logits"])
            for p, r in zip(prompts, ranks[0])]
