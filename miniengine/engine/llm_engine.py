"""LLMEngine: add requests at any time, then call step() until none is left.

    engine = LLMEngine(EngineConfig(model="data/models/target"))
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        for seq in engine.step(): ...

A step is schedule -> run -> postprocess (a speculative step: schedule -> propose and verify -> postprocess ->
rollback, spec/decoding.py).  A bad request is rejected by
add_request with a ValueError and never enters the queue, so the others keep
being served.
"""
from __future__ import annotations

import time

import torch

from miniengine.config import EngineConfig
from miniengine.kv import ContiguousKV, PagedKV
from miniengine.layers.sampler import Sampler
from miniengine.model import load_model
from miniengine.paths import resolve_model_dir
from miniengine.request import validate_prompt
from miniengine.sampling import SamplingParams
from miniengine.engine.model_runner import ModelRunner
from miniengine.engine.scheduler import Scheduler, chunk_to_fit
from miniengine.engine.sequence import Sequence


class LLMEngine:
    def __init__(self, config: EngineConfig, keep_logits: bool = False, clock=time.perf_counter, sleep=time.sleep,
                 speculative=None):
        """``speculative`` makes the speculative step when ``config.speculative_model`` is set: a callable taking
        (runner, kv, draft, num_speculative_tokens, verifier, max_num_seqs=, kv_cache_tokens=, block_size=) and
        returning an object with ``propose_and_verify(batch, live_seq_ids)`` and ``rollback(batch)``.  ``LLM``
        passes spec/decoding.py's ``SpeculativeDecoder``: the engine never imports spec/, which imports the engine."""
        self.config = config
        self.clock, self.sleep = clock, sleep  # wall time by default; a test may pass a virtual clock
        dtype = config.torch_dtype
        if isinstance(config.model, torch.nn.Module):
            model = config.model
            self.model_dir = None
            want = torch.device(config.device)  # "cuda" means whichever CUDA device; "cuda:1" means that one
            same_device = model.device.type == want.type and (want.index is None or model.device.index == want.index)
            if model.dtype != dtype or not same_device:
                raise ValueError(f"model is a loaded {model.dtype} model on {model.device}, but the engine was asked "
                                 f"for dtype={config.dtype!r} on device={config.device!r}: load it that way")
        else:
            self.model_dir = resolve_model_dir(config.model)
            model = load_model(self.model_dir, dtype=dtype, device=config.device)
        if config.quantization is not None:
            import copy

            from miniengine.layers.quant import quantize_model
            if model is config.model:
                model = copy.deepcopy(model)  # the caller's model stays as it was
            model = quantize_model(model, config.quantization, config.quant_group_size)
        self.model = model
        cfg = model.config
        self.kv = config.kv if config.kv is not None else self._default_kv(cfg, dtype, model.device)
        chunk = config.enable_chunked_prefill
        self.scheduler = Scheduler(self.kv, cfg.eos_token_id, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.scheduling_policy,
                                   chunk_prefill=(chunk_to_fit if chunk is True else chunk) if chunk else None,
                                   num_speculative_tokens=config.num_speculative_tokens)
        self.runner = ModelRunner(model, self.kv, config.sampler or Sampler(), keep_logits,
                                  logits_processor=config.logits_processor)
        self.requests: dict = {}  # request_id -> Sequence, for the requests not finished yet
        self.spec = (self._speculative_decoder(config, dtype, speculative) if config.speculative_model is not None
                     else None)
        if self.model.device.type == "cuda" and not config.enforce_eager and self.spec is None:
            self.runner.graphs = self._decode_graphs()

    def _decode_graphs(self):
        """CUDA graphs for decode steps, one per bucket up to max_num_seqs; None (eager) where they cannot be had."""
        import warnings

        from miniengine.engine.cuda_graphs import DecodeGraphs, default_buckets, supports

        if not supports(self.kv):
            return None  # a plugged-in KV layout or gather: its shapes are its own
        try:
            return DecodeGraphs(self.model, self.kv, default_buckets(self.config.max_num_seqs), capture=True)
        except Exception as e:  # noqa: BLE001 - a capture failure must not stop the engine from serving
            warnings.warn(f"CUDA graph capture failed ({type(e).__name__}: {e}); decoding eagerly. "
                          f"LLM(enforce_eager=True) skips the attempt.", stacklevel=3)
            return None

    def _speculative_decoder(self, config, dtype, make):
        """The speculative step, given what it uses: the target's runner and KV layout, the draft, the budgets."""
        if make is None:
            raise ValueError("speculative_model needs the speculative step: LLMEngine(config, speculative="
                             "miniengine.spec.decoding.SpeculativeDecoder), as LLM(speculative_model=...) does")
        draft = config.speculative_model
        if not isinstance(draft, torch.nn.Module):
            draft = load_model(resolve_model_dir(draft), dtype=dtype, device=config.device)
        if draft.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(f"the speculative_model's vocabulary ({draft.config.vocab_size} tokens) must be the "
                             f"target's ({self.model.config.vocab_size})")
        return make(self.runner, self.kv, draft, config.num_speculative_tokens,
                                  config.speculative_verifier, max_num_seqs=config.max_num_seqs,
                                  kv_cache_tokens=config.kv_cache_tokens, block_size=config.block_size)

    def _default_kv(self, cfg, dtype, device):
        c = self.config
        if c.kv_layout == "paged":
            return PagedKV(cfg, -(-c.kv_cache_tokens // c.block_size), c.block_size, dtype, device,  # whole blocks
                           enable_prefix_caching=c.enable_prefix_caching)
        return ContiguousKV(cfg, c.kv_cache_tokens, dtype, device)

    def add_request(self, prompt_token_ids, params: SamplingParams | None = None, request_id=None,
                    arrival_time: float | None = None) -> Sequence:
        params = SamplingParams() if params is None else params
        ids = self.check_request(prompt_token_ids, params)
        if request_id is not None and request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        seq = Sequence(ids, params, request_id, self.clock() if arrival_time is None else arrival_time)
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq

    def check_request(self, prompt_token_ids, params: SamplingParams) -> list[int]:
        """The prompt as plain ints, or a ValueError naming the field and its allowed range."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        cfg = self.model.config
        ids = validate_prompt(prompt_token_ids, params, cfg.vocab_size, cfg.max_position_embeddings)
        c = self.config
        if len(ids) > c.max_num_batched_tokens and not c.enable_chunked_prefill:
            raise ValueError(f"len(prompt) must be <= max_num_batched_tokens={c.max_num_batched_tokens} (a prompt is "
                             f"prefilled in one step), got {len(ids)}")
        if params.n > 1 and not hasattr(self.kv, "fork"):
            raise ValueError(f"n must be 1 with a KV layout that cannot share memory between sequences "
                             f"({type(self.kv).__name__}), got n={params.n}: use kv_layout='paged'")
        if params.n > c.max_num_seqs:
            raise ValueError(f"n must be <= max_num_seqs={c.max_num_seqs} (the completions decode together), "
                             f"got {params.n}")
        if self.spec is not None:  # the verifier draws from the raw rows: nothing may change them, none kept
            asked = [f for f, on in (("repetition_penalty", params.repetition_penalty != 1),
                                     ("presence_penalty", params.presence_penalty != 0),
                                     ("frequency_penalty", params.frequency_penalty != 0), ("min_p", params.min_p > 0),
                                     ("logprobs", params.logprobs is not None)) if on]
            if asked:
                raise ValueError(f"{asked[0]} is not supported with speculative decoding (num_speculative_tokens="
                                 f"{c.num_speculative_tokens}): leave it at its default, or serve without a draft")
        capacity = getattr(self.kv, "capacity_tokens", None)  # a KV layout with a fixed pool says how big it is
        if capacity is not None and len(ids) + params.max_tokens > capacity:
            if isinstance(self.kv, PagedKV) and c.kv is None:
                limit = (f"{capacity}, the KV pool's {self.kv.num_blocks} blocks of {self.kv.block_size} positions "
                         f"(kv_cache_tokens={c.kv_cache_tokens} rounded up to whole blocks)")
            else:
                limit = f"kv_cache_tokens={capacity}"
            raise ValueError(f"len(prompt) + max_tokens must be <= {limit}, got {len(ids)} + {params.max_tokens}")
        return ids

    def abort(self, request_id) -> bool:
        """Stop a request and free its KV memory; False if it is unknown or already finished."""
        seq = self.scheduler.abort(request_id)
        if seq is not None:
            self.requests.pop(seq.request_id, None)
        return seq is not None

    def finish(self, seq: Sequence, reason: str = "stop") -> None:
        """End one completion now, between steps (a stop string found in its text), and free its KV memory."""
        self.scheduler.finish(seq, reason)
        if seq.request_finished and self.requests.get(seq.request_id) is seq.root:
            del self.requests[seq.request_id]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[Sequence]:
        """One forward pass over this step's batch; returns the sequences that got a token (finished ones too)."""
        now = self.clock()
        batch = self.scheduler.schedule(now)
        if not batch.seqs:
            wake = getattr(self.scheduler.policy, "wake_time", lambda waiting: None)(tuple(self.scheduler.waiting))
            if wake is not None and wake > now:  # the policy holds requests back on purpose (a batching timeout)
                self.sleep(wake - now)
            elif self.scheduler.has_unfinished():
                raise RuntimeError(f"the scheduling policy admitted no request while none is running, with "
                                   f"{len(self.scheduler.waiting)} waiting: the engine would stall")
            return []
        forking = {s.seq_id for s in batch.seqs if s.fork_pending}
        chunked = {s.seq_id for i, s in enumerate(batch.seqs) if batch.partial(i)}  # fed a chunk, got no token
        speculative = self.spec is not None and batch.num_decodes
        if speculative:  # the decodes' drafts ride on the batch; each decode's row holds 1 to γ + 1 tokens
            batch, tokens = self.spec.propose_and_verify(batch, {s.seq_id for s in self.scheduler.running})
        else:
            tokens = self.runner.run(batch)  # a list of one token per row
        finished = self.scheduler.postprocess(batch, tokens)
        if speculative:
            self.spec.rollback(batch)
        # A request that forked in this step got a token in every completion.
        stepped = [c for s in batch.seqs if s.seq_id not in chunked
                   for c in (s.completions if s.seq_id in forking else [s])]
        for seq in finished:
            if seq.request_finished and seq.request_id in self.requests:
                del self.requests[seq.request_id]  # finished: its id may be used again
        return stepped
