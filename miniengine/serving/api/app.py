"""The HTTP routes: ``/v1/completions`` (plain and streamed), ``/v1/models``, ``/health`` and ``/metrics``.

``create_app(llm, model_name)`` builds a FastAPI app around one ``LLM``; ``python -m miniengine serve`` runs it
with uvicorn (``launch.py``).  There is no chat endpoint: the course's model continues Python source, and a chat
template would pretend it answers questions.

Streaming follows OpenAI's server-sent events: one ``data: {json}`` event per step that gave a choice new text,
``finish_reason`` null on every chunk but each choice's last, a final ``choices: []`` chunk with the usage when
``stream_options.include_usage`` is set, and ``data: [DONE]`` at the end (after an error too).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from miniengine.llm import LLM
from miniengine.serving.api.async_engine import AsyncEngine, EngineDeadError
from miniengine.serving.api.choices import Choice
from miniengine.serving.api.prometheus import ServerMetrics
from miniengine.serving.api.protocol import (CompletionRequest, RequestError, error_body, param_of, sampling_params,
                                              validation_error)


def _error(e: RequestError, headers=None) -> JSONResponse:
    return JSONResponse(error_body(e), status_code=e.status, headers=headers)


def create_app(llm: LLM, model_name: str = "target", max_pending_requests: int = 1024) -> FastAPI:
    metrics = ServerMetrics(model_name)
    engine = AsyncEngine(llm, metrics)
    max_len = llm.model.config.max_position_embeddings

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.shutdown()  # uvicorn has drained (or, past its graceful timeout, cancelled) the open requests

    app = FastAPI(title="miniengine", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.model_name = engine, metrics, model_name

    @app.exception_handler(RequestValidationError)
    async def _bad_body(request, exc: RequestValidationError):  # a 400 naming the field, not FastAPI's 422
        return _error(validation_error(list(exc.errors())))

    @app.exception_handler(RequestError)
    async def _refused(request, exc: RequestError):
        return _error(exc, {"Retry-After": "1"} if exc.status == 503 else None)

    @app.get("/health")
    async def health():
        if not engine.alive:
            return Response(status_code=503, content=f"the engine loop is not running ({engine.error!r})")
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=ServerMetrics.content_type)

    def _model_card():
        return {"id": model_name, "object": "model", "created": 0, "owned_by": "miniengine", "root": model_name,
                "max_model_len": max_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_name:
            raise RequestError(f"The model `{name}` does not exist.", "model", 404, code="model_not_found")
        return _model_card()

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        if req.model != model_name:
            raise RequestError(f"The model `{req.model}` does not exist: this server serves `{model_name}`",
                               "model", 404, code="model_not_found")
        if not engine.alive:
            raise RequestError(f"the engine loop is not running ({engine.error!r}): the server must be restarted",
                               None, 503, "service_unavailable")
        params = sampling_params(req)
        if req.echo and req.logprobs is not None:
            raise RequestError("echo with logprobs (the prompt's own logprobs) is not supported: ask for one of them",
                               "echo")
        prompts = [_encode(llm, p, i, params, max_len) for i, p in enumerate(req.prompts())]
        if engine.in_flight + len(prompts) > max_pending_requests:
            raise RequestError(f"the server is at capacity: {engine.in_flight} requests in flight, at most "
                               f"{max_pending_requests} (--max-pending-requests); retry later", None, 503,
                               "service_unavailable")
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        choices = [Choice(llm.tokenizer, i * req.n + c, ids if req.echo else None, params, req.return_tokens_as_token_ids,
                          llm.stop_strings) for i, ids in enumerate(prompts) for c in range(req.n)]
        usage = {"prompt_tokens": sum(len(ids) for ids in prompts)}
        head = {"id": rid, "object": "text_completion", "created": created, "model": model_name}
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return StreamingResponse(_stream(engine, prompts, params, choices, usage, head, include_usage),
                                     media_type="text/event-stream")
        work = asyncio.ensure_future(_collect(engine, prompts, params, choices))
        gone = asyncio.ensure_future(_disconnected(request))
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work not in done:  # the client left: cancelling the work aborts its requests (AsyncEngine.generate)
            work.cancel()
            return Response(status_code=499)
        gone.cancel()
        try:
            work.result()
        except EngineDeadError as e:
            raise RequestError(str(e), None, 503, "service_unavailable") from None
        except ValueError as e:  # refused when it reached the engine (checked before, so rare): still a 400
            raise RequestError(str(e), param_of(str(e), "prompt")) from None
        return {**head, "choices": [c.final() for c in choices], "usage": _usage(usage, choices)}

    return app


def _encode(llm: LLM, prompt, i: int, params, max_len: int) -> list[int]:
    """One prompt as token ids, checked as the engine would check it; a RequestError naming the field."""
    where = "prompt" if i == 0 else f"prompt {i}"
    if isinstance(prompt, str) and not prompt:
        raise RequestError(f"{where} must not be empty: give at least one character or token id", "prompt")
    ids = llm.tokenizer.encode(prompt).ids if isinstance(prompt, str) else prompt
    if len(ids) >= max_len:
        raise RequestError(f"{where} is {len(ids)} tokens, but the model's context is {max_len} tokens and at least "
                           f"1 must be left for the completion", "prompt", code="context_length_exceeded")
    try:
        return llm.engine.check_request(ids, params)
    except ValueError as e:
        message = str(e) if i == 0 else f"prompt {i}: {e}"
        code = "context_length_exceeded" if "max_position_embeddings" in message else None
        raise RequestError(message, param_of(str(e), "prompt"), code=code) from None


def _usage(usage: dict, choices: list[Choice]) -> dict:
    completion = sum(c.num_tokens for c in choices)
    return {**usage, "completion_tokens": completion, "total_tokens": usage["prompt_tokens"] + completion}


async def _run_one(engine: AsyncEngine, ids, params, mine: list[Choice], on_update=None):
    """One prompt's request, its outputs fed to its n choices (and, when streaming, to ``on_update``)."""
    async for out in engine.generate(ids, params):
        for c, completion in zip(mine, out.outputs):
            c.update(completion)
        if on_update is not None:
            await on_update(mine)


def _groups(prompts, choices, n):
    return [choices[i * n:(i + 1) * n] for i in range(len(prompts))]


async def _collect(engine, prompts, params, choices):
    groups = _groups(prompts, choices, params.n)
    await asyncio.gather(*(_run_one(engine, ids, params, g) for ids, g in zip(prompts, groups)))


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is read: the next ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _event(payload) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _stream(engine, prompts, params, choices, usage, head, include_usage):
    """Server-sent events; leaving early (a client disconnect cancels this generator) aborts every request."""
    chunks: asyncio.Queue = asyncio.Queue()

    async def push(group):
        for c in group:
            piece = c.delta()
            if piece is not None:
                await chunks.put(piece)

    async def run_all():
        try:
            await asyncio.gather(*(_run_one(engine, ids, params, g, push)
                                   for ids, g in zip(prompts, _groups(prompts, choices, params.n))))
        finally:
            await chunks.put(None)

    task = asyncio.ensure_future(run_all())
    try:
        try:
            while (piece := await chunks.get()) is not None:
                yield _event({**head, "choices": [piece], **({"usage": None} if include_usage else {})})
            task.result()
            if include_usage:
                yield _event({**head, "choices": [], "usage": _usage(usage, choices)})
        except EngineDeadError as e:
            yield _event(error_body(RequestError(str(e), None, 503, "service_unavailable")))
        except Exception as e:  # noqa: BLE001 - a stream that has begun cannot change its status; it says so and ends
            yield _event(error_body(RequestError(f"{type(e).__name__}: {e}", None, 500, "internal_error")))
        yield "data: [DONE]\n\n"
    finally:  # also on a disconnect (the generator is closed or cancelled): aborts what still runs
        task.cancel()
