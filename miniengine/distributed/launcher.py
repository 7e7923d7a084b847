"""Starting tensor-parallel ranks, and decoding on them with the engine: :func:`launch` and :func:`tp_generate`.

``tp_generate`` starts ``world_size`` processes with ``torch.multiprocessing`` and ``torch.distributed``'s gloo
backend over loopback (127.0.0.1, a free port, every wait bounded by a timeout); each rank loads the model,
keeps its shard (:mod:`miniengine.distributed.sharding`) and runs the real engine on it.  The float64 oracle's
own loop on the shards, which the tests and ``bench tp`` compare against, is course tooling
(:mod:`miniengine.course.tp_reference`).

Ranks are started with ``spawn``, so a script that calls :func:`tp_generate` needs the
``if __name__ == "__main__":`` guard (notebooks and ``python -m`` need nothing).

    python -m miniengine bench tp      # step time and all-reduce time, 1 and 2 ranks on this CPU; the 70B forecast
"""
from __future__ import annotations

import datetime
import os
import pickle
import queue
import socket
import time

import cloudpickle
import torch
import torch.distributed as dist
from torch import nn

from miniengine.distributed.sharding import Plan, check_world_size, rank_kv_shape, shard_model


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


def _generate_rank(rank, world_size, model, prompts, params, dtype, return_logits, plan_blob=None):
    from miniengine.config import DTYPES, EngineConfig
    from miniengine.engine import LLMEngine
    from miniengine.kv import PagedKV
    from miniengine.model import load_model

    if not isinstance(model, nn.Module):
        model = load_model(model)  # each rank reads the checkpoint itself, then keeps its slice
    plan = cloudpickle.loads(plan_blob) if plan_blob else None
    shard = shard_model(model.to(DTYPES[dtype]), rank, world_size, plan=plan)
    del model
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
                timeout_s: float = 120.0, plan: Plan | None = None):
    """Decode ``prompts`` with the model sharded over ``world_size`` ranks; what ``naive_generate`` returns.

    ``model`` is a model directory (each rank loads it) or a loaded Llama (sent to each rank).
    Each rank runs the engine (paged KV cache, each rank holding its own KV heads; the logits it keeps
    are float32).  The ranks must agree token for token (they hold the same
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
    names = {v: k for k, v in DTYPES.items()}
    if dtype not in names:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    prompts, params = validate_requests(prompts, params, cfg.vocab_size, cfg.max_position_embeddings)
    if any(sp.n != 1 for sp in params):
        raise ValueError("tp_generate decodes one completion per request: every SamplingParams needs n=1")
    if plan is not None and not isinstance(plan, Plan):
        raise TypeError(f"plan must be a miniengine.distributed.Plan, got {type(plan).__name__}")
    blob = cloudpickle.dumps(plan) if plan is not None else None
    ranks = launch(_generate_rank, world_size, (model, prompts, params, names[dtype], return_logits, blob),
                   timeout_s)
    tokens = [[r["token_ids"] for r in rank] for rank in ranks]
    if any(t != tokens[0] for t in tokens):
        raise RuntimeError("tensor-parallel ranks chose different tokens: their logits should be identical")
    return [Completion(p, r["token_ids"], r["finish_reason"], r["tokens_processed"], r["logits"])
            for p, r in zip(prompts, ranks[0])]
