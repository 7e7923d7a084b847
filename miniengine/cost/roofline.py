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

What the model counts, and why:
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
What it ignores: kernel efficiency that varies with shape, activation traffic,
communication (except the tensor-parallel all-reduces, priced apart by
:func:`tensor_parallel_decode`), CPU overhead beyond the fixed 0.5 ms.  It gives orders of
magnitude and trends, not the milliseconds of a real engine.

    python -m miniengine roofline --model llama3-8b --gpu H100 --phase decode --batch 64 --context 2048
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Sequence

import numpy as np

from miniengine.model import LlamaConfig

# ---------------------------------------------------------------- hardware


@dataclasses.dataclass(frozen=True)
class GPU:
    """Dense 16-bit peak, memory bandwidth and memory size, in decimal units (as vendors print them)."""

    name: str
    peak_flops: float  # FLOP/s, dense bf16 (fp16 where the chip has no bf16)
    bandwidth: float  # bytes/s of HBM (or GDDR) bandwidth
    memory: float  # bytes

    @property
    def ridge_point(self) -> float:
        """FLOPs a kernel must do per byte it moves before compute, not bandwidth, limits it."""
        return self.peak_flops / self.bandwidth


GPUS = {
    "H100": GPU("H100 SXM", 989e12, 3.35e12, 80e9),
    "H200": GPU("H200", 989e12, 4.8e12, 141e9),
    "A100-80GB": GPU("A100-80GB", 312e12, 2.039e12, 80e9),
    "T4": GPU("T4", 65e12, 0.32e12, 16e9),  # no bf16: fp16 numbers
}


def get_gpu(name: str) -> GPU:
    """A GPU from the table by name (case-insensitive)."""
    for key, gpu in GPUS.items():
        if name.lower() == key.lower():
            return gpu
    raise ValueError(f"--gpu {name!r} is not a known GPU; choose one of: {', '.join(GPUS)}")


# CUDA device names (torch.cuda.get_device_name) of the exact products in the table. Variants differ: a PCIe or
# NVL card, or a 40 GB A100, has other bandwidth or peak numbers, so it counts as unknown.
DEVICE_NAMES = {"H100 80GB HBM3": "H100", "H200": "H200", "A100-SXM4-80GB": "A100-80GB", "T4": "T4"}


def gpu_for_device(device_name: str) -> GPU | None:
    """The table's entry for this exact CUDA product, or None."""
    if "PCIe" in device_name or "NVL" in device_name:
        return None
    return next((GPUS[key] for pattern, key in DEVICE_NAMES.items() if pattern in device_name), None)


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


# ---------------------------------------------------------------- counting (no hardware yet)


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


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """A GPU-to-GPU link: the bytes/s each GPU sends in one direction, and the fixed cost of one collective."""

    name: str
    bandwidth: float  # bytes/s per GPU, one direction
    latency_s: float  # per all-reduce, whatever its size


INTERCONNECTS = {
    # NVIDIA's H100 SXM data sheet: NVLink 900 GB/s per GPU, both directions together (18 NVLink 4 links);
    # a ring sends one way while it receives the other, so 450 GB/s is each GPU's pipe (the JAX scaling
    # book's GPU chapter uses the same split).  The latency is an assumption, not a data-sheet figure: a
    # small NCCL all-reduce inside one NVLink node costs on the order of 10 us of launches and handshakes.
    "NVLink-H100": Interconnect("H100 NVLink (900 GB/s bidirectional)", 450e9, 10e-6),
}


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


# ---------------------------------------------------------------- command line


def add_arguments(parser) -> None:
    """Flags of ``python -m miniengine roofline``."""
    parser.add_argument("--model", default="llama3-8b", help=f"one of: {', '.join(MODELS)}")
    parser.add_argument("--gpu", default="H100", help=f"one of: {', '.join(GPUS)}")
    parser.add_argument("--phase", default="decode", help="prefill or decode")
    parser.add_argument("--batch", type=int, default=1, help="sequences in the forward")
    parser.add_argument("--context", type=int, default=1024,
                        help="prefill: prompt tokens per sequence; decode: cached tokens per sequence")
    parser.add_argument("--compute-eff", type=float, default=0.7, help="share of peak FLOP/s reached, in (0, 1]")
    parser.add_argument("--bandwidth-eff", type=float, default=0.8, help="share of bandwidth reached, in (0, 1]")
    parser.add_argument("--overhead-ms", type=float, default=0.5, help="fixed cost per forward, >= 0")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _validate(args):
    if args.phase not in ("prefill", "decode"):
        raise ValueError(f"--phase {args.phase!r} is not a phase; choose one of: prefill, decode")
    if args.batch < 1:
        raise ValueError(f"--batch must be an integer >= 1, got {args.batch}")
    least = 1 if args.phase == "prefill" else 0  # a prefill processes at least one token
    if args.context < least:
        raise ValueError(f"--context must be an integer >= {least} for {args.phase}, got {args.context}")
    for flag, value in (("--compute-eff", args.compute_eff), ("--bandwidth-eff", args.bandwidth_eff)):
        if not 0 < value <= 1:
            raise ValueError(f"{flag} must be in (0, 1], got {value}")
    if not args.overhead_ms >= 0:
        raise ValueError(f"--overhead-ms must be >= 0, got {args.overhead_ms}")
    gpu = get_gpu(args.gpu)  # raises for an unknown name, listing the choices
    cfg = get_model_config(args.model)
    return CostModel(cfg, gpu, args.compute_eff, args.bandwidth_eff, args.overhead_ms / 1e3)


def report(model: CostModel, phase: str, batch: int, context: int) -> dict:
    """The numbers the CLI prints, as plain Python values."""
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


def run(args) -> int:
    """Prints the cost of one forward; raises ValueError for a bad flag (the CLI exits 2 on it)."""
    model = _validate(args)
    out = report(model, args.phase, args.batch, args.context)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.model} on {model.gpu.name}, {args.phase}, batch {args.batch}, context {args.context} "
          f"(compute {model.compute_eff:.0%}, bandwidth {model.bandwidth_eff:.0%}, overhead {args.overhead_ms} ms)")
    rows = [
        ("parameters", f"{out['params'] / 1e9:.2f} B"),
        ("FLOPs", f"{out['flops']:.3e}"),
        ("bytes moved", f"{out['bytes'] / 1e9:.2f} GB"),
        ("arithmetic intensity", f"{out['flops'] / out['bytes']:.1f} FLOP/byte (ridge {model.ridge_point:.0f})"),
        ("step time", f"{out['step_time_s'] * 1e3:.3f} ms ({out['bound']}-bound)"),
        ("time per token", f"{out['time_per_token_s'] * 1e6:.1f} us"),
        ("MFU", f"{out['mfu']:.1%}"),
        ("KV per token", f"{out['kv_bytes_per_token'] / 1024:.0f} KiB"),
        ("KV capacity", f"{out['kv_capacity_tokens']:,} tokens"),
        ("max batch at this context", f"{out['max_batch']:,}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if out["kv_capacity_tokens"] == 0:
        print(f"  note: the weights alone exceed {model.usable_memory:.0%} of this GPU's memory: it takes "
              "several GPUs or quantized weights to serve this model")
    return 0
