"""``LLM`` from the student's lossless parts of labs 1..N, the course's where theirs is missing or fails.

Each part goes in through its plug point (miniengine/plugs/__init__.py), held there to its Protocol; one that the engine
refuses falls back to the course's part with the engine's own message:

    lab 01  sample                     -> sampler=PerRowSampler(sample)
    lab 02  ContiguousKVCache, ...     -> kv=PerSequenceKV(cache_class, backend_class)    (labs 02-04; the
                                          course's: kv_layout="contiguous")
    lab 04  ContinuousBatching         -> scheduling_policy=ContinuousBatching()
    lab 05  BlockManager, gather       -> kv=PagedKV(block_manager=..., gather=...)       (supersedes lab 02's)
    lab 08  PrefixCache, chunk         -> PagedKV(block_manager=PrefixCache(...)), enable_chunked_prefill=chunk
                                          (the prefix cache supersedes lab 05's block manager)

``my_cost_model`` is Lab 03's part, the simulator's clock, which is no part of ``LLM``.
"""
from __future__ import annotations

import dataclasses
import functools

from autograder.own.status import first_line

NUM_BLOCKS, BLOCK_SIZE = 1024, 4  # 4,096 positions: the visible golden runs all fit at once, in small blocks
CHUNKED_BUDGET = 64  # tokens per step from Lab 08 on, so that the chunking rule really cuts prompts


@functools.lru_cache(maxsize=1)
def _target():
    from miniengine import paths
    from miniengine.model import load_model

    return load_model(paths.TARGET)


def placement(key: str, lab: int) -> str:
    """Where a plugged part sits in lab N's engine, or what superseded it."""
    if key == "kv_cache" and lab >= 5:
        return "superseded by Lab 05's paged layout"
    if key == "block_manager" and lab >= 8:
        return "superseded by Lab 08's prefix cache"
    return "in this LLM"


def build(verdicts: dict, lab: int, exclude=frozenset()):
    """``(llm, refused)``: the engine, and ``{part key: why the engine refused the student's part}``."""
    import torch

    from miniengine import LLM, kv, plugs
    from miniengine.layers.sampler import PerRowSampler
    from miniengine.plugs.conformance import check

    refused: dict = {}
    model = _target()
    config = model.config

    def attempt(key, make):
        """make(the student's objects), or None (the course's part) when there is none or the engine refuses it."""
        v = verdicts.get(key)
        if v is None or not v.yours or key in exclude or placement(key, lab) != "in this LLM":
            return None
        try:
            return make(v.objects)
        except Exception as e:
            refused[key] = f"the engine refused it: {first_line(e)}"
            return None

    args = {"max_num_seqs": 64}
    sampler = attempt("sampler", lambda o: PerRowSampler(o["sample"]))
    if sampler is not None:
        args["sampler"] = sampler
    if lab >= 5:
        manager = attempt("prefix_cache" if lab >= 8 else "block_manager", lambda o: check(
            "block_manager", next(iter(o.values()))(NUM_BLOCKS, BLOCK_SIZE),
            plugs.PrefixCache if lab >= 8 else plugs.BlockAllocator))
        gather = attempt("gather", lambda o: check("gather", o["gather_history"], plugs.HistoryGather))
        args["kv"] = kv.PagedKV(config, NUM_BLOCKS, BLOCK_SIZE, block_manager=manager, gather=gather,
                                enable_prefix_caching=lab >= 8 and manager is None)
    elif lab >= 2:
        mine = attempt("kv_cache", lambda o: kv.PerSequenceKV(o["ContiguousKVCache"], o["CachedAttention"], config,
                                                               torch.float32, "cpu"))
        if mine is not None:
            args["kv"] = mine
        else:  # the course's Lab 02 layout: one contiguous reservation per sequence
            args["kv_layout"] = "contiguous"
    if lab >= 4:
        policy = attempt("policy", lambda o: check("scheduling_policy", o["ContinuousBatching"](), plugs.SchedulingPolicy))
        if policy is not None:
            args["scheduling_policy"] = policy
    if lab >= 8:
        rule = attempt("chunk", lambda o: check("enable_chunked_prefill", o["chunk"], plugs.ChunkingRule))
        args["enable_chunked_prefill"] = rule if rule is not None else True
        args["max_num_batched_tokens"] = CHUNKED_BUDGET
    try:
        return LLM(model=model, device="cpu", **args), refused
    except Exception as e:  # a combination the engine refuses: every part the course's, and the reason kept
        for key in ("sampler", "kv_cache", "block_manager", "gather", "policy", "prefix_cache", "chunk"):
            if key in verdicts and verdicts[key].yours and key not in refused:
                refused[key] = f"the engine refused this combination: {first_line(e)}"
        return LLM(model=model, device="cpu"), refused


def my_cost_model(config, gpu=None, verbose: bool = True):
    """The simulator's clock (plugs.ForwardCostModel) from your Lab 03, the course's where yours is missing or fails.

    ``gpu=None``: your calibrated model of the course's CPU (``calibrate(rows)(config)``, fitted to the shipped step
    times), else your roofline functions on a paper H100.  ``gpu="H100"`` (a name of ``cost.hardware.GPUS``, or a
    GPU): your ``forward_flops``, ``forward_bytes`` and ``step_time`` on that paper GPU, else the course's
    ``CostModel``.  Under grading, always the course's ``CostModel``: a lab is graded on its own.
    """
    from autograder.own import parts, registry
    from miniengine.cost.roofline import CostModel
    from miniengine.serving.simulator import CostModelFromFunctions

    def say(text):
        if verbose:
            print(f"own.my_cost_model: {text}")

    device = _paper_gpu(gpu)
    if registry.grading():
        say(f"the course's CostModel on a paper {device.name} (grading uses the course's parts)")
        return CostModel(config, device)
    verdicts = {v.part.key: v for v in parts.judge_lab(3)}
    cal, roof = verdicts.get("calibrated"), verdicts.get("roofline")
    if gpu is None and cal is not None and cal.yours:
        try:
            from miniengine import paths
            from miniengine.course.step_times import read_csv

            model = cal.objects["calibrate"](read_csv(paths.DATA / "step_times" / "cpu.csv"))(config)
            say("your calibrated model of the course's CPU (Lab 03's calibrate)")
            return model
        except Exception as e:
            say(f"your calibrate raised {first_line(e)}; trying the roofline instead")
    if roof is not None and roof.yours:
        o = roof.objects
        say(f"your forward_flops, forward_bytes and step_time on a paper {device.name}")
        # Lab 03's functions read a GPU as a plain dict (gpu["peak_flops"]), as the lab gives them
        return CostModelFromFunctions(config, dataclasses.asdict(device), o["forward_flops"], o["forward_bytes"],
                                      o["step_time"])
    say(f"the course's CostModel on a paper {device.name} ({roof.why if roof else 'no Lab 03 parts'})")
    return CostModel(config, device)


def _paper_gpu(gpu):
    """A name of cost.hardware.GPUS (None: the H100), a GPU, or Lab 03's dict of one -> a GPU."""
    from miniengine.cost.hardware import GPU, get_gpu

    if gpu is None or isinstance(gpu, str):
        return get_gpu(gpu or "H100")
    if isinstance(gpu, dict):
        return GPU(**{f.name: gpu[f.name] for f in dataclasses.fields(GPU)})
    return gpu
