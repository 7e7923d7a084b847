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
within GAP = 1e-3 of a tie (miniengine/course/golden.py), over a hundred times that difference (sampled steps
divide the logits by the temperature first, which scales it by at most 1/0.7 here), so the tokens stay
exact.

Plug points (Lab 09).  How a weight is split and how the partial sums meet are functions the caller can
replace: ``column_shard(weight, rank, world_size)`` and ``row_shard(weight, rank, world_size)`` return a
rank's slice of a ``[out, in]`` weight, and ``all_reduce(tensor, comm)`` returns the sum over the ranks,
built from :meth:`Communicator.ring_exchange` (send to the next rank, receive from the previous one, as
``MPI_Sendrecv`` does).  :func:`ring_all_reduce` is the course's: a reduce-scatter then an all-gather, each
rank sending 2(p-1)/p of the tensor.  Without a plug, the all-reduce is gloo's own ``dist.all_reduce``.
:class:`ThreadRing` runs an all-reduce on p threads in one process, to test it without starting processes.

Ranks are started with ``spawn``, so a script that calls :func:`tp_generate` needs the
``if __name__ == "__main__":`` guard (notebooks and ``python -m`` need nothing).

    python -m miniengine bench tp      # step time and all-reduce time, 1 and 2 ranks on this CPU; the 70B forecast
"""
from __future__ import annotations

import copy
import dataclasses
import datetime
import os
import pickle
import queue
import socket
import threading
import time
import types

import cloudpickle
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


# ---------------------------------------------------------------- plug points: splitting a weight, summing partials


def column_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s block of output rows (dim 0) of a ``[out, in]`` weight: it computes that slice of the output."""
    rows = weight.shape[0] // world_size
    return weight[rank * rows:(rank + 1) * rows]


def row_shard(weight: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s block of input columns (dim 1): it reads that slice of the input, and makes a partial sum."""
    cols = weight.shape[1] // world_size
    return weight[:, rank * cols:(rank + 1) * cols]


def ring_all_reduce(tensor: torch.Tensor, comm) -> torch.Tensor:
    """The sum of ``tensor`` over the ranks, the same bits on every rank, by a ring (Patarasuk and Yuan, 2009).

    The flattened tensor is cut into p chunks.  Reduce-scatter: in p-1 exchanges each rank passes a partial sum of
    one chunk to the next rank and adds what the previous rank sent; after them rank r holds chunk (r+1) mod p
    summed over every rank.  All-gather: p-1 more exchanges pass the finished chunks around, copied, not added, so
    every rank ends with identical bits (ranks that summed in their own order could pick different tokens).  Each
    rank sends 2(p-1)/p of the tensor, whatever p is: the reason rings scale.
    """
    p, r = comm.world_size, comm.rank
    if p == 1:
        return tensor
    flat = tensor.detach().reshape(-1).clone()
    chunks = flat.tensor_split(p)  # views into flat: filling a chunk fills the result
    for step in range(p - 1):  # reduce-scatter
        send, recv = (r - step) % p, (r - step - 1) % p
        incoming = comm.ring_exchange(chunks[send], torch.empty_like(chunks[recv]))
        chunks[recv].add_(incoming)
    for step in range(p - 1):  # all-gather
        send, recv = (r + 1 - step) % p, (r - step) % p
        comm.ring_exchange(chunks[send], chunks[recv])
    return flat.view_as(tensor)


class Communicator:
    """What an ``all_reduce`` plug may use: its ``rank``, the ``world_size``, and one ring exchange.

    ``ring_exchange(send, recv)`` sends ``send`` to rank (rank+1) mod p, receives what rank (rank-1) mod p sent into
    ``recv`` (same number of elements and dtype as that rank's ``send``), and returns ``recv``.  Every rank must call
    it the same number of times.  ``bytes_sent`` counts what this rank sent.
    """

    rank: int
    world_size: int
    bytes_sent: int = 0

    def ring_exchange(self, send: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _check(self, send, recv):
        for name, t in (("send", send), ("recv", recv)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"ring_exchange: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not recv.is_contiguous():
            raise ValueError("ring_exchange: recv must be contiguous (it is filled in place); "
                             "use torch.empty_like(...) or a slice of a flat tensor")


class GlooComm(Communicator):
    """The ring over torch.distributed point-to-point messages (this process's rank in the default group)."""

    def __init__(self, group=None):
        self.group, self.rank, self.world_size = group, dist.get_rank(group), dist.get_world_size(group)
        self.bytes_sent = 0

    def ring_exchange(self, send, recv):
        self._check(send, recv)
        send = send.detach().contiguous()
        # Post the send before the blocking receive: with both blocking, every rank would wait on its neighbour.
        pending = dist.isend(send, (self.rank + 1) % self.world_size, group=self.group)
        dist.recv(recv, (self.rank - 1) % self.world_size, group=self.group)
        pending.wait()
        self.bytes_sent += send.numel() * send.element_size()
        return recv


class ThreadRing:
    """p ranks as threads of one process, joined in a ring by queues: test an all-reduce without processes.

        results = ThreadRing(3).run(lambda comm, x: my_all_reduce(x, comm), [x0, x1, x2])

    A rank that raises stops the others; a rank left waiting ``timeout_s`` for its neighbour (an unequal number
    of exchanges) raises TimeoutError naming both.
    """

    def __init__(self, world_size: int, timeout_s: float = 10.0):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        self.world_size, self.timeout_s = world_size, timeout_s
        self.failed = threading.Event()
        self.comms = [_ThreadComm(self, r) for r in range(world_size)]

    def run(self, fn, inputs: list) -> list:
        """``fn(comm, inputs[r])`` on rank r's thread, for every rank at once; the return values, by rank."""
        if len(inputs) != self.world_size:
            raise ValueError(f"inputs must hold one entry per rank ({self.world_size}), got {len(inputs)}")
        results, errors = [None] * self.world_size, [None] * self.world_size

        def body(r):
            try:
                results[r] = fn(self.comms[r], inputs[r])
            except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
                errors[r] = e
                self.failed.set()

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout_s + 5)
        first = next(((r, e) for r, e in enumerate(errors) if e is not None and not isinstance(e, _Stopped)), None)
        if first is not None:
            raise first[1]
        if any(t.is_alive() for t in threads):
            raise TimeoutError(f"the ranks did not finish within {self.timeout_s + 5:.0f} s")
        return results


class _Stopped(Exception):
    """Another rank failed; this one stops waiting."""


class _ThreadComm(Communicator):
    def __init__(self, ring: ThreadRing, rank: int):
        self.ring, self.rank, self.world_size = ring, rank, ring.world_size
        self.inbox, self.bytes_sent, self.exchanges = queue.Queue(), 0, 0

    def ring_exchange(self, send, recv):
        self._check(send, recv)
        p = self.world_size
        self.ring.comms[(self.rank + 1) % p].inbox.put(send.detach().clone())
        self.bytes_sent += send.numel() * send.element_size()
        self.exchanges += 1
        deadline = time.monotonic() + self.ring.timeout_s
        while True:
            if self.ring.failed.is_set():
                raise _Stopped()
            try:
                got = self.inbox.get(timeout=0.05)
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.ring.failed.set()
                    raise TimeoutError(
                        f"rank {self.rank} waited {self.ring.timeout_s:.0f} s in its exchange {self.exchanges} for rank "
                        f"{(self.rank - 1) % p}: every rank must call ring_exchange the same number of times") from None
        if got.numel() != recv.numel() or got.dtype != recv.dtype:
            self.ring.failed.set()
            raise ValueError(f"ring_exchange on rank {self.rank}: rank {(self.rank - 1) % p} sent {got.numel()} "
                             f"{got.dtype} values, but recv holds {recv.numel()} {recv.dtype} values")
        recv.copy_(got.reshape(recv.shape))
        return recv


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
    # The ranks inherit the environment at spawn.  c10d warns on stderr when the host name does not resolve (a
    # sandbox's does not), and a notebook cell that writes to stderr fails under nbgrader: errors only.
    saved = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        procs = mp.start_processes(_entry, args=(world_size, _free_port(), timeout_s, threads, results, worker, args),
                                   nprocs=world_size, join=False, start_method="spawn")
    finally:
        if saved is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = saved
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


def _generate_rank(rank, world_size, model, prompts, params, dtype, return_logits, decoder, plan_blob=None):
    from miniengine.config import DTYPES, EngineConfig
    from miniengine.engine import LLMEngine
    from miniengine.kv import PagedKV
    from miniengine.model import load_model
    from miniengine.reference import naive_generate

    if not isinstance(model, nn.Module):
        model = load_model(model)  # each rank reads the checkpoint itself, then keeps its slice
    plan = cloudpickle.loads(plan_blob) if plan_blob else None
    shard = shard_model(model.to(DTYPES[dtype]), rank, world_size, plan=plan)
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
                decoder: str = "engine", timeout_s: float = 120.0, plan: Plan | None = None):
    """Decode ``prompts`` with the model sharded over ``world_size`` ranks; what ``naive_generate`` returns.

    ``model`` is a model directory (each rank loads it) or a loaded Llama (sent to each rank).
    ``decoder="engine"`` runs the engine (paged KV cache, each rank holding its own KV heads; the
    logits it keeps are float32); ``"reference"`` runs naive decode, whose logits keep the model's
    dtype (float64 for a float64 run).  The ranks must agree token for token (they hold the same
    logits); rank 0's logits are returned when asked for.  ``plan`` (:class:`Plan`) plugs in other split
    functions and another all-reduce; they travel to the ranks by value (cloudpickle), so functions defined
    in a notebook work.
    """
    from miniengine.config import DTYPES
    from miniengine.model import load_config
    from miniengine.paths import resolve_model_dir
    from miniengine.reference import Completion
    from miniengine.request import validate_requests

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
    if plan is not None and not isinstance(plan, Plan):
        raise TypeError(f"plan must be a tensor_parallel.Plan, got {type(plan).__name__}")
    blob = cloudpickle.dumps(plan) if plan is not None else None
    ranks = launch(_generate_rank, world_size, (model, prompts, params, names[dtype], return_logits, decoder, blob),
                   timeout_s)
    tokens = [[r["token_ids"] for r in rank] for rank in ranks]
    if any(t != tokens[0] for t in tokens):
        raise RuntimeError("tensor-parallel ranks chose different tokens: their logits should be identical")
    return [Completion(p, r["token_ids"], r["finish_reason"], r["tokens_processed"], r["logits"])
            for p, r in zip(prompts, ranks[0])]
