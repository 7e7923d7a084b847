"""The engine's plug points, declared once: one Protocol per interface the engine calls, with its lab and default.

Each lab builds a part of the engine and plugs it in where the course's own part sits.  A plug point is an
interface below, stated as the engine calls it (who calls which method, when, and what must hold);
``PLUG_POINTS`` gives each one its milestone (lab), the course's implementation (the default, used when nothing
is plugged in) and where it is taken.  Where a plug is taken, ``miniengine.plugs.conformance.check`` holds it to its
Protocol, e.g. ``scheduling_policy: StudentPolicy has no admit(waiting, running, budget) (Lab 04)``.  Strings
and ``True`` stay shortcuts for the course's own parts (``kv_layout="paged"``, ``quantization="int8"``,
``speculative_verifier="coupled"``, ``enable_chunked_prefill=True``).  Lab 10's two are what the
server's requests ask for: the logits processor (penalties, min_p) and the stop strings.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable


# ---------------------------------------------------------------- Lab 01: the sampler

@runtime_checkable
class BatchSampler(Protocol):
    """``sampler(logits[B, V], params[B], positions[B]) -> B token ids``: ModelRunner.sample, once per step, on the
    rows that choose a token.  ``positions[i]`` (the absolute position of the token chosen) keys row i's noise,
    so a row's token must not depend on the other rows (batch invariance)."""
    def __call__(self, logits, params, positions) -> list[int]: ...


@runtime_checkable
class RowSampler(Protocol):
    """``sample(logits_row, params, position) -> int`` (Lab 01's shape), one numpy float64 row at a time;
    ``layers.sampler.PerRowSampler(sample)`` makes a BatchSampler of it."""
    def __call__(self, logits_row, params, position) -> int: ...


# ---------------------------------------------------------------- Labs 02, 05: the KV layout and its backend

@runtime_checkable
class KVLayout(Protocol):
    """Where K/V live.  The scheduler calls ``can_allocate`` then ``allocate`` when it admits a sequence (which sets
    ``seq.kv``), ``free`` when one finishes, is aborted or preempted; ModelRunner.forward calls ``backend(seqs,
    new_tokens)`` once per step, ``new_tokens[i]`` being the tokens sequence i feeds after its
    ``num_cached_tokens``.  Optional: ``capacity_tokens`` (requests longer are refused), ``fork(parent, child)``
    (``SamplingParams(n > 1)``: refused without it), ``commit(seq)`` after a step writes seq's K/V."""
    def can_allocate(self, seq) -> bool: ...
    def allocate(self, seq) -> None: ...
    def free(self, seq) -> None: ...
    def backend(self, seqs, new_tokens) -> AttentionBackend: ...


@runtime_checkable
class GrowingKVLayout(KVLayout, Protocol):
    """A layout that grows sequences as they decode (paged): before each decode step the scheduler asks
    ``can_append(seq)`` and then ``append_slot(seq)`` for the token seq feeds; when it says no, the scheduler
    preempts.  A layout that has either method is held to both."""
    def can_append(self, seq) -> bool: ...
    def append_slot(self, seq) -> None: ...


@runtime_checkable
class AttentionBackend(Protocol):
    """One step's attention, from ``KVLayout.backend``: ModelRunner.forward reads ``positions(device)`` (every fed
    token's absolute position, sequence after sequence), the model calls ``attend(layer, q, k, v)`` in every layer
    with the step's fresh q/k/v ([T, heads, d]) and gets [T, heads, d] back, computed by the one attention
    function; ``advance()`` follows the forward pass."""
    def positions(self, device): ...
    def attend(self, layer, q, k, v): ...
    def advance(self) -> None: ...


@runtime_checkable
class CacheFactory(Protocol):
    """Lab 02's cache class for ``kv.PerSequenceKV``: ``cache_class(config, max_len, dtype, device)`` at admission,
    ``max_len`` = prompt + max_tokens; its backend class reads it."""
    def __call__(self, config, max_len, dtype, device): ...


@runtime_checkable
class BackendFactory(Protocol):
    """Lab 02's backend class for ``kv.PerSequenceKV``: ``backend_class(caches, new_tokens)`` every step, an
    AttentionBackend over those caches."""
    def __call__(self, caches, new_tokens) -> AttentionBackend: ...


# ---------------------------------------------------------------- Lab 03: the cost model

@runtime_checkable
class ForwardCostModel(Protocol):
    """The simulator's clock: ``forward(new_tokens, context).step_time_s``, the seconds of one forward pass in which
    sequence i feeds ``new_tokens[i]`` tokens over ``context[i]`` cached ones.  Optional: ``decode_run_times(contexts,
    steps)``, many decode steps at once.  ``serving.simulator.CostModelFromFunctions`` builds one from Lab 03's
    forward_flops, forward_bytes and step_time."""
    def forward(self, new_tokens, context): ...


# ---------------------------------------------------------------- Lab 04: the scheduling policy

@runtime_checkable
class SchedulingPolicy(Protocol):
    """``admit(waiting, running, budget)`` once per step (engine and simulator alike): the waiting sequences to
    prefill now, in order, taken from ``waiting`` (FCFS order), within ``budget`` (engine.policy.Budget); the
    scheduler checks the answer.  Optional: ``max_num_seqs``, ``wake_time(waiting)``, ``padding()``."""
    def admit(self, waiting, running, budget) -> list: ...


# ---------------------------------------------------------------- Lab 05: the block manager and the paged gather

@runtime_checkable
class BlockAllocator(Protocol):
    """PagedKV's bookkeeping, no tensors: ``block_tables[seq.seq_id]`` lists seq's blocks in position order.
    ``can_allocate``/``allocate`` at admission (blocks for seq.num_tokens positions), ``can_append``/``append_slot``
    before each decode (returns the copy-on-write ``(src, dst)`` or None), ``fork`` for n > 1 (counts + 1),
    ``free`` at the end.  Invariants: a block's count is the number of tables holding it; no block leaks."""
    block_tables: dict
    def can_allocate(self, seq) -> bool: ...
    def allocate(self, seq): ...
    def can_append(self, seq) -> bool: ...
    def append_slot(self, seq): ...
    def fork(self, parent, child) -> None: ...
    def free(self, seq) -> None: ...


@runtime_checkable
class HistoryGather(Protocol):
    """``gather(cache[num_blocks, block_size, kv_heads, d], block_tables[B, max_blocks], num_keys)`` -> [B, num_keys,
    kv_heads, d]: PagedBackend, in every layer and group; key j of row b is ``cache[table[j // bs], j % bs]``."""
    def __call__(self, cache, block_tables, num_keys): ...


# ---------------------------------------------------------------- Lab 06: proposer, verifier, rollback

@runtime_checkable
class Proposer(Protocol):
    """The speculative step's drafter: ``release(live_seq_ids)`` first (forget the others), then ``propose(seqs,
    gammas)`` -> (drafts, draft_probs), up to gammas[i] tokens for seqs[i] and the distributions they came from."""
    def release(self, live_seq_ids) -> None: ...
    def propose(self, seqs, gammas) -> tuple: ...


@runtime_checkable
class Verifier(Protocol):
    """``verify(target_logits[γ+1, V], drafts, draft_probs, params, positions)`` -> the accepted drafts, then one
    token of the target's (1 to γ + 1 tokens), once per decoding sequence per step.  ``"rejection"`` is the course's;
    ``"coupled"``, the default, shares the target's keyed noise and is no function of this shape."""
    def __call__(self, target_logits, drafts, draft_probs, params, positions) -> list[int]: ...


@runtime_checkable
class SpeculativeKV(Protocol):
    """The rollback: after the scheduler appends a step's emitted tokens, SpeculativeDecoder.rollback calls
    ``truncate(seq, num_positions)`` on every decode still running: forget the K/V from ``num_positions`` on (the
    rejected drafts'), keep the ones before.  Without it a layout cannot speculate."""
    def truncate(self, seq, num_positions) -> None: ...


@runtime_checkable
class LookaheadKV(Protocol):
    """A growing layout that speculates: the scheduler asks ``can_cover(seq, num_positions)`` and calls ``cover(seq,
    num_positions)`` to make room for the last token and the drafts ahead (``Scheduler.lookahead``)."""
    def can_cover(self, seq, num_positions) -> bool: ...
    def cover(self, seq, num_positions) -> None: ...


@runtime_checkable
class RollbackBlockAllocator(BlockAllocator, Protocol):
    """A block manager under speculation: ``truncate(seq, num_tokens)`` keeps the blocks of positions [0, num_tokens)
    and releases the rest (count - 1; free at 0).  PagedKV.can_cover reads ``ref_count`` and ``num_free_blocks``."""
    ref_count: list
    num_free_blocks: int
    def truncate(self, seq, num_tokens) -> None: ...


# ---------------------------------------------------------------- Lab 07: quantizer, GQA conversion

@runtime_checkable
class QuantScheme(Protocol):
    """``quantize(weight[out, in]) -> state`` (a dict of tensors) once per linear layer at load time;
    ``dequantize(state)`` in every forward, ``dequantize(state, rows=ids)`` for the rows an embedding looks up."""
    def quantize(self, weight) -> dict: ...
    def dequantize(self, state, rows=None): ...


@runtime_checkable
class KVHeadPool(Protocol):
    """``pool(weight[H * d, hidden], H, K) -> [K * d, hidden]``: gqa.convert, on every layer's k_proj and v_proj."""
    def __call__(self, weight, num_heads, kv_heads): ...


# ---------------------------------------------------------------- Lab 08: prefix cache, chunking rule

@runtime_checkable
class PrefixCache(BlockAllocator, Protocol):
    """A block manager whose ``allocate(seq)`` returns the positions found cached (seq then feeds only the rest) and
    whose ``register(seq, num_tokens)`` (PagedKV.commit, after each step) keys the full blocks written so far."""
    def register(self, seq, num_tokens) -> None: ...


@runtime_checkable
class ChunkingRule(Protocol):
    """``chunk(seq, tokens_left) -> int`` in [0, min(seq.num_new_tokens, tokens_left)]: how many of seq's tokens join
    this step's prefill; the scheduler checks the answer.  ``enable_chunked_prefill=True`` means chunk_to_fit."""
    def __call__(self, seq, tokens_left) -> int: ...


# ---------------------------------------------------------------- Lab 09: the parallel plan

@runtime_checkable
class ShardSplit(Protocol):
    """``column_shard`` / ``row_shard(weight[out, in], rank, world_size)``: rank's rows [out/p, in] or columns
    [out, in/p], once per linear layer when a rank builds its shard (a distributed.Plan field)."""
    def __call__(self, weight, rank, world_size): ...


@runtime_checkable
class AllReduce(Protocol):
    """``all_reduce(tensor, comm)`` -> the sum over ranks, the same bits on every rank, after each row-parallel layer,
    using ``comm.ring_exchange(send, recv)``; None in the Plan is gloo's own."""
    def __call__(self, tensor, comm): ...


# ---------------------------------------------------------------- Lab 10: what an OpenAI client sends

@runtime_checkable
class LogitsProcessor(Protocol):
    """``process(logits_row, prompt_ids, output_ids, params) -> row``: ModelRunner, once per step for each row whose
    request asks for penalties or min_p (``params.processes_logits``), on a float64 numpy row; masked tokens -inf."""
    def __call__(self, logits_row, prompt_ids, output_ids, params): ...


@runtime_checkable
class StopStrings(Protocol):
    """An object with ``find_stop(text, stops)`` (the earliest-ending match, with ``.stop``, ``.start``, ``.end``, or
    None), which LLM calls on each completion's text after every step, and ``sendable(text, stops, finished)`` (what
    a stream may send now), which LLM.stream and the server call: miniengine/stop_strings.py is the course's."""
    def find_stop(self, text, stops): ...
    def sendable(self, text, stops, finished): ...


# ---------------------------------------------------------------- the table

@dataclasses.dataclass(frozen=True)
class PlugPoint:
    protocol: type
    labs: tuple
    default: str   # the course's implementation, module:name
    taken: str     # where it plugs in
    name: str = ""  # what a function plug is called in messages

    @property
    def lab(self) -> str:
        return ("Lab " if len(self.labs) == 1 else "Labs ") + ", ".join(f"{n:02d}" for n in self.labs)


PLUG_POINTS = {p.protocol: p for p in (
    PlugPoint(BatchSampler, (1,), "miniengine.layers.sampler:Sampler", "EngineConfig.sampler", "sampler"),
    PlugPoint(RowSampler, (1,), "miniengine.sampling:sample_token", "layers.sampler.PerRowSampler(sample)", "sample"),
    PlugPoint(KVLayout, (2, 5), "miniengine.kv:PagedKV", "EngineConfig.kv (kv_layout='contiguous': kv.ContiguousKV)"),
    PlugPoint(GrowingKVLayout, (5,), "miniengine.kv:PagedKV", "EngineConfig.kv"),
    PlugPoint(AttentionBackend, (2, 5), "miniengine.kv.paged:PagedBackend", "ModelRunner.forward, from kv.backend()"),
    PlugPoint(CacheFactory, (2,), "miniengine.kv.contiguous:KVCache", "kv.PerSequenceKV(cache_class)", "cache_class"),
    PlugPoint(BackendFactory, (2,), "miniengine.kv.contiguous:CachedBackend", "kv.PerSequenceKV(backend_class)",
              "backend_class"),
    PlugPoint(ForwardCostModel, (3,), "miniengine.cost.roofline:CostModel", "serving.simulator.simulate(model)"),
    PlugPoint(SchedulingPolicy, (4,), "miniengine.engine.policy:ContinuousBatching",
              "EngineConfig.scheduling_policy, Scheduler(policy) (the simulator's too)"),
    PlugPoint(BlockAllocator, (5,), "miniengine.kv.block_manager:BlockManager", "kv.PagedKV(block_manager)"),
    PlugPoint(HistoryGather, (5,), "miniengine.kv.paged:gather_history", "kv.PagedKV(gather)", "gather"),
    PlugPoint(Proposer, (6,), "miniengine.spec.proposer:DraftProposer", "spec.decoding.SpeculativeDecoder(proposer)"),
    PlugPoint(Verifier, (6,), "miniengine.spec.verify:rejection_verify", "EngineConfig.speculative_verifier",
              "verify"),
    PlugPoint(SpeculativeKV, (6,), "miniengine.kv:PagedKV",
              "EngineConfig.kv with a speculative_model, SpeculativeDecoder(kv)"),
    PlugPoint(LookaheadKV, (6,), "miniengine.kv:PagedKV",
              "EngineConfig.kv with a speculative_model, SpeculativeDecoder(kv)"),
    PlugPoint(RollbackBlockAllocator, (6,), "miniengine.kv.block_manager:BlockManager",
              "kv.PagedKV(block_manager) with a speculative_model"),
    PlugPoint(QuantScheme, (7,), "miniengine.layers.quant:Int8PerChannel", "EngineConfig.quantization"),
    PlugPoint(KVHeadPool, (7,), "miniengine.gqa:mean_pool_kv", "gqa.convert(pool)", "pool"),
    PlugPoint(PrefixCache, (8,), "miniengine.kv.prefix_cache:PrefixCachingBlockManager", "kv.PagedKV(block_manager)"),
    PlugPoint(ChunkingRule, (8,), "miniengine.engine.scheduler:chunk_to_fit",
              "EngineConfig.enable_chunked_prefill, Scheduler(chunk_prefill)", "chunk"),
    PlugPoint(ShardSplit, (9,), "miniengine.distributed:column_shard", "LLM(tensor_parallel_plan=Plan(...))"),
    PlugPoint(AllReduce, (9,), "miniengine.distributed:ring_all_reduce", "LLM(tensor_parallel_plan=Plan(...))",
              "all_reduce"),
    PlugPoint(LogitsProcessor, (10,), "miniengine.logits_processors:process_row", "EngineConfig.logits_processor",
              "process"),
    PlugPoint(StopStrings, (10,), "miniengine.stop_strings:StopStringRules", "EngineConfig.stop_strings (LLM and the server)"),
)}
