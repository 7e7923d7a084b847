"""The public API, shaped like vLLM's so that what students learn transfers:

    llm = LLM(model="data/models/target")
    outputs = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=64))
    print(outputs[0].text)
    for delta in llm.stream("import os", SamplingParams(max_tokens=32)):
        print(delta, end="")

Behind it runs :class:`~miniengine.engine.LLMEngine`.  Keyword arguments are
:class:`~miniengine.config.EngineConfig` fields, plug points included, for example
``LLM(sampler=PerRowSampler(my_sample))``; each plug point's interface is a
Protocol in :mod:`miniengine.plugs`, and a plugged object is checked against it
when it is given.  ``generate`` checks every request before running any and says
which request index is at fault; ``add_request`` and ``step`` drive the engine one
step at a time.

``LLM(tensor_parallel_size=2)`` (vLLM's name) serves ``generate`` on a model sharded
over 2 processes (:mod:`miniengine.distributed`); ``tensor_parallel_plan`` plugs
in other split functions and another all-reduce (Lab 09).  Each ``generate`` call
starts the ranks and ends them, so stepping one request at a time is not offered.
"""
from __future__ import annotations

import itertools

from miniengine import plugs
from miniengine.config import EngineConfig
from miniengine.engine import LLMEngine
from miniengine.outputs import CompletionOutput, RequestOutput
from miniengine.paths import TARGET
from miniengine.plugs.conformance import check
from miniengine.sampling import SamplingParams
from miniengine.spec.decoding import SpeculativeDecoder
from miniengine.stop_strings import StopStringRules, stopped_text
from miniengine.tokenizer import load_tokenizer


class LLM:
    def __init__(self, model="data/models/target", tensor_parallel_size: int = 1, tensor_parallel_plan=None,
                 **engine_args):
        self.tensor_parallel_size, self.tensor_parallel_plan = tensor_parallel_size, tensor_parallel_plan
        self._tp_request_ids = itertools.count()
        if self.sharded:
            self._check_tensor_parallel(engine_args)
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args), speculative=SpeculativeDecoder)
        self.model = self.engine.model
        self.tokenizer = load_tokenizer(self.engine.model_dir or TARGET)
        # find_stop and sendable: the course's (miniengine/stop_strings.py) unless EngineConfig.stop_strings plugs others
        self.stop_strings = self.engine.config.stop_strings or StopStringRules()
        self._texts: dict = {}
        self._stopped: dict = {}  # seq_id -> the final text of a completion a stop string ended

    def _check_tensor_parallel(self, engine_args):
        from miniengine.distributed import Plan

        size = self.tensor_parallel_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {size!r}")
        plan = self.tensor_parallel_plan
        if plan is not None and not isinstance(plan, Plan):
            raise TypeError(f"tensor_parallel_plan must be a miniengine.distributed.Plan, got {type(plan).__name__}")
        for name, protocol in (("column_shard", plugs.ShardSplit), ("row_shard", plugs.ShardSplit),
                               ("all_reduce", plugs.AllReduce)):
            if getattr(plan, name, None) is not None:
                check(f"tensor_parallel_plan.{name}", getattr(plan, name), protocol, name)
        if engine_args:  # each rank builds its own engine (a paged KV pool of its own KV heads)
            raise ValueError(f"with tensor_parallel_size={size}, LLM takes no engine arguments; "
                             f"got {', '.join(sorted(engine_args))}")

    @property
    def sharded(self) -> bool:
        """Does generate() run on tensor-parallel ranks (a size other than 1, or a plan)?"""
        return self.tensor_parallel_size != 1 or self.tensor_parallel_plan is not None

    def _single_process(self, what):
        if self.sharded:
            raise ValueError(f"{what} drives one engine step by step; with tensor_parallel_size="
                             f"{self.tensor_parallel_size} each generate() call starts and ends the ranks: use generate()")

    def _encode(self, prompt):
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt).ids
        return None, prompt

    def _as_list(self, prompts, sampling_params):
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt, not a list of them
        prompts = list(prompts)
        params = SamplingParams() if sampling_params is None else sampling_params
        params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params must be one SamplingParams or one per prompt: "
                             f"got {len(params)} for {len(prompts)} prompts")
        return prompts, params

    def add_request(self, prompt, sampling_params: SamplingParams | None = None, request_id=None):
        """Queue one request (a string or token ids); returns its request_id.  Raises ValueError if it is bad."""
        self._single_process("add_request")
        text, ids = self._encode(prompt)
        seq = self.engine.add_request(ids, sampling_params, request_id)
        self._texts[seq.request_id] = text
        return seq.request_id

    def step(self) -> list[RequestOutput]:
        """One engine step; an output for every request that got a token (``finished`` says if it is done)."""
        self._single_process("step")
        roots = {s.root.seq_id: s.root for s in self._step()}  # n > 1: one output per request
        return [self._output(s) for s in roots.values()]

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def abort(self, request_id) -> bool:
        """Stop a request and free its KV memory (and what LLM kept of its text); False if unknown or finished."""
        seq = self.engine.requests.get(request_id)
        if seq is not None:
            self._texts.pop(request_id, None)
            for s in seq.completions:
                self._stopped.pop(s.seq_id, None)
        return self.engine.abort(request_id)

    def _step(self):
        """One engine step, then the stop strings (miniengine/stop_strings.py) of every completion that got a token:
        one that now holds a stop string ends here, its KV memory freed, its text cut."""
        stepped = self.engine.step()
        for s in stepped:
            if not s.params.stop or s.seq_id in self._stopped:
                continue
            text = self.tokenizer.decode(s.output_token_ids)
            match = self.stop_strings.find_stop(text, s.params.stop)
            if match is None:
                continue
            self._stopped[s.seq_id] = stopped_text(text, match, s.params.include_stop_str_in_output)
            s.stop_reason = match.stop
            if s.is_finished:  # it also reached max_tokens in this step: the stop string says why it ended
                s.finish_reason = "stop"
            else:
                self.engine.finish(s, "stop")
        return stepped

    def _text(self, s, final: bool = False) -> str:
        """A completion's text so far: its decoded output, cut at a stop string that ended it."""
        if s.seq_id in self._stopped:
            return self._stopped.pop(s.seq_id) if final else self._stopped[s.seq_id]
        return self.tokenizer.decode(s.output_token_ids)

    def _output(self, seq) -> RequestOutput:
        """The request's output so far; ``seq`` is its first sequence (completion 0)."""
        finished = seq.request_finished
        text = self._texts.pop(seq.request_id, None) if finished else self._texts.get(seq.request_id)
        outputs = [CompletionOutput(s.child_index, s.output_token_ids, self._text(s, final=finished), s.finish_reason,
                                    s.stop_reason, s.logprobs) for s in seq.completions]
        first = outputs[0]
        return RequestOutput(seq.request_id, text, seq.prompt_token_ids, first.token_ids, first.text,
                             first.finish_reason, sum(s.tokens_processed for s in seq.completions), finished, outputs)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Prompts are strings or lists of token ids; returns one RequestOutput per prompt, in order."""
        prompts, params = self._as_list(prompts, sampling_params)
        encoded = [self._encode(p) for p in prompts]
        for n, ((_, ids), sp) in enumerate(zip(encoded, params)):  # check them all before running any
            try:
                self.engine.check_request(ids, sp)
            except ValueError as e:
                raise ValueError(f"request {n}: {e}") from None
        if self.sharded:
            return self._generate_tensor_parallel(encoded, params)
        seqs = []
        for (text, ids), sp in zip(encoded, params):
            seq = self.engine.add_request(ids, sp)
            self._texts[seq.request_id] = text
            seqs.append(seq)
        while self.engine.has_unfinished_requests():
            self._step()
        return [self._output(s) for s in seqs]

    def _generate_tensor_parallel(self, encoded, params) -> list[RequestOutput]:
        from miniengine.distributed import tp_generate

        bad = [n for n, sp in enumerate(params) if sp.n != 1]
        if bad:
            raise ValueError(f"request {bad[0]}: with tensor_parallel_size > 1 each request has one completion: "
                             f"n must be 1, got {params[bad[0]].n}")
        for n, sp in enumerate(params):  # the ranks run the plain sampler on token ids alone
            asked = [f for f, on in (("stop", sp.stop), ("stop_token_ids", sp.stop_token_ids),
                                     ("logprobs", sp.logprobs is not None), ("penalties or min_p", sp.processes_logits))
                     if on]
            if asked:
                raise ValueError(f"request {n}: {asked[0]} is not supported with tensor_parallel_size > 1")
        model = self.engine.model_dir or self.model  # a directory: each rank loads it itself
        done = tp_generate(model, [ids for _, ids in encoded], params, world_size=self.tensor_parallel_size,
                           plan=self.tensor_parallel_plan)
        outs = []
        for (text, ids), c in zip(encoded, done):
            rid = next(self._tp_request_ids)
            piece = self.tokenizer.decode(c.token_ids)
            outs.append(RequestOutput(rid, text, ids, c.token_ids, piece, c.finish_reason, c.tokens_processed, True,
                                      [CompletionOutput(0, c.token_ids, piece, c.finish_reason)]))
        return outs

    def stream(self, prompt, sampling_params: SamplingParams | None = None):
        """Yields the completion's text in pieces as tokens are generated; with stop strings, the last
        characters are held back until they cannot start one (miniengine/stop_strings.py)."""
        if sampling_params is not None and sampling_params.n != 1:
            raise ValueError(f"stream serves one completion: n must be 1, got {sampling_params.n}")
        rid = self.add_request(prompt, sampling_params)
        seq = self.engine.requests[rid]
        sent = ""
        while not seq.is_finished:
            self._step()
            ready = self.stop_strings.sendable(self._text(seq), seq.params.stop, seq.is_finished)
            if len(ready) > len(sent):
                yield ready[len(sent):]
                sent = ready
        self._output(seq)
