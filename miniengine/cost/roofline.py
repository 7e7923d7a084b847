"""The "paper GPU": a roofline cost model of one forward pass (miniengine/README.md, Cost model).

A GPU is two numbers that matter, a calculator and a pipe: peak FLOP/s and
memory bandwidth in bytes/s.  A forward pass is two numbers too: the FLOPs it
does and the bytes it moves.  Whichever takes longer is the bottleneck:

    step time = max(FLOPs / (compute_eff * peak), bytes / (bandwidth_eff * bandwidth)) + overhead

With the course's conventions (70% of peak, 80% of bandwidth, 0.5 ms of fixed
overhead per forward, decimal GB, 90% of memory usable) this reproduces the
course's worked examples for Llama-3-8B on an H100 (miniengine/README.md, Cost
model).  Set the efficiencies to 1 and the overhead to 0 and you get the ideal
textbook figures (kipply's "Transformer Inference Arithmetic",
https://kipp.ly/transformer-inference-arithmetic/, and the JAX scaling book,
https://jax-ml.github.io/scaling-book/).

The pieces: the GPU and interconnect tables live in :mod:`miniengine.cost.hardware`, the model shapes and
the counting of parameters, bytes and FLOPs (what is counted, and why) in :mod:`miniengine.cost.counting`;
this module prices a count on a GPU.  Every name of those two modules that this one has always offered
(``GPUS``, ``llama3_8b``, ``param_count``, ``forward_cost``, ...) is still importable from here.
What the model ignores: kernel efficiency that varies with shape, activation traffic,
communication (except the tensor-parallel all-reduces, priced apart by
:func:`tensor_parallel_decode`), CPU overhead beyond the fixed 0.5 ms.  It gives orders of
magnitude and trends, not the milliseconds of a real engine.

    python -m miniengine roofline --model llama3-8b --gpu H100 --phase decode --batch 64 --context 2048
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

# Lab 03's answer key forbids the counting helpers by this module's name, privates included (_layer_matmul_params,
# _cost_from_totals): they stay reachable here.
from miniengine.cost.counting import (MODELS, ForwardCost, _check_count, _cost_from_totals, _layer_matmul_params,
                                      decode_cost, forward_cost, get_model_config, kv_bytes_per_token, llama3_8b,
                                      llama3_70b, param_breakdown, param_count, prefill_cost, weight_bytes)
from miniengine.cost.hardware import DEVICE_NAMES, GPU, GPUS, INTERCONNECTS, Interconnect, get_gpu, gpu_for_device
from miniengine.model import LlamaConfig

__all__ = [
    # this module: pricing on the paper GPU
    "StepEstimate", "CostModel", "ring_allreduce_s", "TensorParallelStep", "tensor_parallel_decode", "report",
    # miniengine.cost.hardware
    "GPU", "GPUS", "get_gpu", "DEVICE_NAMES", "gpu_for_device", "Interconnect", "INTERCONNECTS",
    # miniengine.cost.counting
    "llama3_8b", "llama3_70b", "MODELS", "get_model_config", "param_breakdown", "param_count", "weight_bytes",
    "kv_bytes_per_token", "ForwardCost", "forward_cost", "prefill_cost", "decode_cost",
]

# ---------------------------------------------------------------- the paper GPU


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """A forward pass priced on a paper GPU."""

    cost: ForwardCost
    compute_s: float  # FLOPs / achievable FLOP/s
    memory_s: float  # bytes / achievable bandwidth
    step_time_s: float  # max of the two, plus overhead
    bound: str  # "compute" or "memory"
    mfu: float  # model FLOPs utilisation: achieved FLOP/s over the (undiscounted) peak

    @property
    def time_per_token_s(self) -> float:
        """Step time shared among the tokens this forward processed (prompt tokens in prefill)."""
        return self.step_time_s / self.cost.new_tokens


@dataclasses.dataclass(frozen=True)
class CostModel:
    """A model on a GPU, with the course's conventions as defaults (miniengine/README.md, Cost model).

    compute_eff=1, bandwidth_eff=1, overhead_s=0 gives the ideal roofline of the textbooks.
    """

    config: LlamaConfig
    gpu: GPU
    compute_eff: float = 0.7  # share of peak FLOP/s real matmuls reach
    bandwidth_eff: float = 0.8  # share of the nominal bandwidth real kernels reach
    overhead_s: float = 0.5e-3  # fixed cost of one forward: kernel launches, Python, scheduling
    usable_memory: float = 0.9  # share of memory for weights + KV (vLLM's default gpu_memory_utilization)
    bytes_per_param: float = 2  # 16-bit weights
    bytes_per_value: float = 2  # 16-bit KV cache

    def __post_init__(self):
        for name in ("compute_eff", "bandwidth_eff", "usable_memory"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        if not self.overhead_s >= 0:
            raise ValueError(f"overhead_s must be >= 0, got {self.overhead_s!r}")

    # -- pricing a forward

    def _times(self, cost: ForwardCost):
        compute = cost.flops / (self.compute_eff * self.gpu.peak_flops)
        memory = cost.bytes / (self.bandwidth_eff * self.gpu.bandwidth)
        return compute, memory

    def step_time(self, cost: ForwardCost):
        """Seconds for one forward (an array of them if ``cost`` holds arrays)."""
        compute, memory = self._times(cost)
        return np.maximum(compute, memory) + self.overhead_s

    def estimate(self, cost: ForwardCost) -> StepEstimate:
        compute, memory = self._times(cost)
        step = max(compute, memory) + self.overhead_s
        return StepEstimate(cost, compute, memory, step, "compute" if compute > memory else "memory",
                            cost.flops / step / self.gpu.peak_flops)

    def forward(self, new_tokens: Sequence[int], context: Sequence[int], logits: str = "last") -> StepEstimate:
        return self.estimate(forward_cost(self.config, new_tokens, context, logits=logits, **self._dtypes))

    def prefill(self, batch: int, prompt_len: int) -> StepEstimate:
        return self.estimate(prefill_cost(self.config, batch, prompt_len, **self._dtypes))

    def decode(self, batch: int, context: int) -> StepEstimate:
        return self.estimate(decode_cost(self.config, batch, context, **self._dtypes))

    def decode_run_times(self, contexts: Sequence[int], steps: int) -> np.ndarray:
        """Step times of ``steps`` consecutive decode steps of a fixed set of sequences.

        Sequence i starts with ``contexts[i]`` cached tokens and gains one per step.  A simulator
        calls this once for a stretch in which the batch does not change, instead of once per step.
        """
        B, j = len(contexts), np.arange(steps)
        start = sum(contexts)
        cached = start + B * j
        pairs = cached + B  # each new token sees its history and itself
        return self.step_time(_cost_from_totals(self.config, B, B, B, pairs, cached, **self._dtypes))

    @property
    def _dtypes(self) -> dict:
        return {"bytes_per_param": self.bytes_per_param, "bytes_per_value": self.bytes_per_value}

    # -- memory: the ceiling on the batch

    @property
    def kv_bytes_per_token(self) -> float:
        return kv_bytes_per_token(self.config, self.bytes_per_value)

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache that fit next to the weights in the usable share of memory (0 if the weights don't fit)."""
        free = self.usable_memory * self.gpu.memory - weight_bytes(self.config, self.bytes_per_param)
        return max(0, math.floor(free / self.kv_bytes_per_token))

    def max_batch(self, context: int) -> int:
        """How many sequences of ``context`` tokens each fit their KV caches in memory at once."""
        return self.kv_capacity_tokens // max(1, _check_count("context", context, 0))

    # -- the roofline

    @property
    def ridge_point(self) -> float:
        """Nominal FLOPs per byte where compute and bandwidth balance: the GPU's own ratio."""
        return self.gpu.ridge_point

    @property
    def effective_ridge_point(self) -> float:
        """The same with the efficiencies applied: about the prompt length where prefill turns compute-bound."""
        return self.compute_eff * self.gpu.peak_flops / (self.bandwidth_eff * self.gpu.bandwidth)


# ---------------------------------------------------------------- tensor parallelism


def ring_allreduce_s(nbytes: float, world_size: int, link: Interconnect) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``world_size`` GPUs: 2(p-1)/p x bytes / bandwidth + latency.

    A reduce-scatter then an all-gather, each p-1 steps in which every GPU sends 1/p of the buffer:
    2(p-1)/p of the buffer leaves each GPU, whatever p.  One GPU has nothing to exchange.
    """
    p = _check_count("world_size", world_size, 1)
    if p == 1:
        return 0.0
    return 2 * (p - 1) / p * nbytes / link.bandwidth + link.latency_s


@dataclasses.dataclass(frozen=True)
class TensorParallelStep:
    """A decode step split over ``world_size`` GPUs: each GPU's share of the work, then the all-reduces."""

    world_size: int
    compute_s: float  # the paper GPU's step time for one GPU's share, fixed overhead included
    comm_s: float  # every all-reduce of the step, one after another
    allreduces: int
    allreduce_bytes: float  # each

    @property
    def step_time_s(self) -> float:
        return self.compute_s + self.comm_s  # no overlap: a layer's all-reduce gates the next layer

    @property
    def comm_share(self) -> float:
        return self.comm_s / self.step_time_s


def tensor_parallel_decode(model: CostModel, world_size: int, batch: int, context: int, link: Interconnect,
                           activation_bytes: float = 2) -> TensorParallelStep:
    """One decode step of ``model`` with Megatron tensor parallelism over ``world_size`` GPUs.

    Every weight matrix and every KV head is split p ways (Megatron also splits the embedding and the
    LM head by vocabulary), so each GPU does 1/p of the FLOPs and moves 1/p of the bytes, in
    parallel.  Communication: one all-reduce after each attention block and one after each MLP block,
    2 x layers per step, each of batch x hidden_size 16-bit activations.
    """
    p = _check_count("world_size", world_size, 1)
    cost = decode_cost(model.config, batch, context, **model._dtypes)
    share = dataclasses.replace(cost, flops=cost.flops / p, weight_bytes=cost.weight_bytes / p,
                                kv_read_bytes=cost.kv_read_bytes / p, kv_write_bytes=cost.kv_write_bytes / p)
    n = 2 * model.config.num_hidden_layers
    nbytes = batch * model.config.hidden_size * activation_bytes
    return TensorParallelStep(p, float(model.step_time(share)), n * ring_allreduce_s(nbytes, p, link), n, nbytes)


# ---------------------------------------------------------------- what the roofline command prints


def report(model: CostModel, phase: str, batch: int, context: int) -> dict:
    """The numbers ``python -m miniengine roofline`` prints, as plain Python values."""
    est = model.prefill(batch, context) if phase == "prefill" else model.decode(batch, context)
    return {
        "params": param_count(model.config),
        "flops": float(est.cost.flops),
        "bytes": float(est.cost.bytes),
        "step_time_s": float(est.step_time_s),
        "time_per_token_s": float(est.time_per_token_s),
        "bound": est.bound,
        "mfu": float(est.mfu),
        "kv_bytes_per_token": int(model.kv_bytes_per_token),
        "kv_capacity_tokens": model.kv_capacity_tokens,
        "max_batch": model.max_batch(context),
    }
