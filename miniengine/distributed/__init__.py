"""Tensor parallelism (Lab 09): a model sharded across processes, Megatron-style.

* :mod:`~miniengine.distributed.sharding`: column- and row-parallel layers, a rank's shard of the model, the
  split plug points (:class:`Plan`);
* :mod:`~miniengine.distributed.comm`: the all-reduce (gloo's, or the course's ring over ``ring_exchange``),
  the communicators, :class:`ThreadRing` to test an all-reduce on threads;
* :mod:`~miniengine.distributed.launcher`: starting the ranks, and :func:`tp_generate`, the engine on them.

``LLM(tensor_parallel_size=2)`` uses them; ``python -m miniengine bench tp`` measures them.
"""
from miniengine.distributed.comm import Communicator, GlooComm, ThreadRing, ring_all_reduce
from miniengine.distributed.launcher import launch, tp_generate
from miniengine.distributed.sharding import (SHARDED_FIELDS, ColumnParallelLinear, Plan, RowParallelLinear,
                                             check_world_size, column_shard, comm_stats, rank_kv_shape,
                                             reset_comm_stats, row_shard, shard_model)

__all__ = ["Communicator", "GlooComm", "ThreadRing", "ring_all_reduce", "launch", "tp_generate", "SHARDED_FIELDS",
           "ColumnParallelLinear", "Plan", "RowParallelLinear", "check_world_size", "column_shard", "comm_stats",
           "rank_kv_shape", "reset_comm_stats", "row_shard", "shard_model"]
