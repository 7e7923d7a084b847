"""One engine loop in a background thread; HTTP requests join it between steps.

The engine is not thread-safe, and a step is seconds of CPU work that must not block the event loop that
serves HTTP.  So one thread owns the ``LLM`` and does nothing else:

    loop:  take the commands that arrived (add a request, abort one)  ->  one engine step  ->  hand each
           request's output so far to the coroutine waiting for it (``loop.call_soon_threadsafe``)

A request's coroutine (``generate``) reads its outputs from an asyncio queue.  If the coroutine ends early (the
client disconnected, the server is shutting down), it sends an abort, and the engine frees the request's KV blocks
before its next step.  If the loop dies, every waiting coroutine gets the error, and ``alive`` turns False
(``GET /health`` answers 503 from then on).  This is vLLM's AsyncLLMEngine in miniature, without its separate
detokenizer process: text is decoded in the engine thread, which costs step time at high batch sizes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import queue
import threading
import time

from miniengine.llm import LLM
from miniengine.outputs import CompletionOutput, RequestOutput


_REQUEST_IDS = itertools.count()  # unique in the process: an LLM may outlive one server (tests start several)


class EngineDeadError(RuntimeError):
    """The engine loop stopped with an error; no request can be served until the server restarts."""


@dataclasses.dataclass
class _Live:
    """What the loop keeps about a request for its metrics."""
    arrival: float
    prompt_tokens: int
    tokens: int = 0
    first_token: float | None = None
    last_token: float | None = None


def _snapshot(out: RequestOutput) -> RequestOutput:
    """A copy the event loop may read while the engine thread goes on appending to the sequences' lists."""
    outs = [dataclasses.replace(c, token_ids=list(c.token_ids),
                                logprobs=None if c.logprobs is None else list(c.logprobs)) for c in out.outputs]
    return dataclasses.replace(out, token_ids=list(out.token_ids), outputs=outs)


class AsyncEngine:
    def __init__(self, llm: LLM, metrics=None, idle_wait_s: float = 0.5):
        self.llm = llm
        self.metrics = metrics  # a ServerMetrics (prometheus.py), or None
        self.idle_wait_s = idle_wait_s
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._jobs: dict = {}  # request id -> (event loop, asyncio.Queue): read by the engine thread
        self._live: dict[str, _Live] = {}  # engine thread only
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="miniengine-engine-loop", daemon=True)

    # ------------------------------------------------------------- event-loop side

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None and not self._stopping.is_set()

    @property
    def in_flight(self) -> int:
        """Requests added and not finished (running or waiting)."""
        return len(self._jobs)

    async def generate(self, prompt_token_ids: list[int], params, arrival: float | None = None):
        """Yields the request's output after every step that gave it tokens; the last one has ``finished`` set.
        Ending the iteration early aborts the request and frees its KV memory."""
        if not self.alive:
            raise EngineDeadError(f"the engine loop is not running ({self.error!r})")
        rid = f"req-{next(_REQUEST_IDS)}"
        q: asyncio.Queue = asyncio.Queue()
        self._jobs[rid] = (asyncio.get_running_loop(), q)
        self._send(("add", rid, prompt_token_ids, params, time.perf_counter() if arrival is None else arrival))
        finished = False
        try:
            while not finished:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._jobs.pop(rid, None)
            if not finished:
                self._send(("abort", rid))

    def _send(self, command) -> None:
        self._commands.put(command)
        self._wake.set()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Finish the step under way, abort every request left (each gets finish_reason "abort"), stop the loop."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------- engine-thread side

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._take_commands()
                if not self.llm.has_unfinished_requests():
                    self._observe()
                    self._wake.wait(self.idle_wait_s)
                    self._wake.clear()
                    continue
                outs = self.llm.step()
                now = time.perf_counter()
                for out in outs:
                    self._deliver(out, now)
                self._observe()
            self._abort_all()
        except BaseException as e:  # noqa: BLE001 - every waiting request must hear of it, then /health says 503
            self.error = e
            dead = EngineDeadError(f"the engine loop stopped: {type(e).__name__}: {e}")
            for rid in list(self._jobs):
                self._post(rid, dead)

    def _take_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, rid, ids, params, arrival = command
                if rid not in self._jobs:
                    continue  # its client left before it was added
                try:
                    self.llm.add_request(ids, params, request_id=rid)
                except ValueError as e:  # checked before it was sent; a change of state since (or a bug) lands here
                    self._post(rid, e)
                    continue
                self._live[rid] = _Live(arrival, len(ids))
            else:
                rid = command[1]
                if self.llm.abort(rid) and self.metrics is not None:
                    self.metrics.finished("abort")
                self._live.pop(rid, None)

    def _deliver(self, out: RequestOutput, now: float) -> None:
        rid = out.request_id
        live = self._live.get(rid)
        if live is not None:
            tokens = sum(len(c.token_ids) for c in out.outputs)
            if self.metrics is not None:
                self.metrics.tokens(live, tokens, now)
            if live.first_token is None:
                live.first_token = now
            live.tokens, live.last_token = tokens, now
            if out.finished:
                self._live.pop(rid)
                if self.metrics is not None:
                    self.metrics.request_done(live, out.finish_reason, now)
        self._post(rid, _snapshot(out))

    def _post(self, rid, item) -> None:
        job = self._jobs.get(rid)
        if job is not None:
            loop, q = job
            try:
                loop.call_soon_threadsafe(q.put_nowait, item)
            except RuntimeError:  # that event loop is closed: nobody is listening any more
                pass

    def _abort_all(self) -> None:
        """At shutdown: every request still in the engine ends with finish_reason "abort"."""
        self._take_commands()
        for rid in list(self._live):
            seq = self.llm.engine.requests.get(rid)
            self.llm.abort(rid)
            self._live.pop(rid, None)
            if seq is not None:
                outs = [CompletionOutput(s.child_index, list(s.output_token_ids), self.llm.tokenizer.decode(
                    s.output_token_ids), "abort") for s in seq.completions]
                first = outs[0]
                self._post(rid, RequestOutput(rid, None, seq.prompt_token_ids, first.token_ids, first.text, "abort",
                                              0, True, outs))
        self._observe()

    def _observe(self) -> None:
        """Set the gauges a router reads: requests running and waiting, KV-cache usage."""
        if self.metrics is None:
            return
        sched = self.llm.engine.scheduler
        kv = self.llm.engine.kv
        bm = getattr(kv, "block_manager", None)
        usage = 0.0
        if bm is not None and getattr(kv, "num_blocks", 0):
            usage = 1 - bm.num_free_blocks / kv.num_blocks
        self.metrics.observe(running=len({s.request_id for s in sched.running}),
                             waiting=len({s.request_id for s in sched.waiting}) + self._commands.qsize(),
                             kv_usage=usage, preemptions=getattr(sched, "num_preemptions", 0))
