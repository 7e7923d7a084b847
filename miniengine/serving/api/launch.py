"""``python -m miniengine serve``: every engine option of ``LLM(...)`` as a flag, then uvicorn.

    python -m miniengine serve --port 8000 --max-num-seqs 32 --enable-prefix-caching
    python -m miniengine serve --scheduling-policy mypolicies:SLOAware   # a plug point, by import path

Flags are made from :class:`~miniengine.config.EngineConfig`'s fields, so a new engine option is a new flag
without an edit here: ``--max-num-batched-tokens 2048``, ``--kv-layout contiguous``, ``--no-enforce-eager``.
A plug point (``--sampler``, ``--kv``, ``--scheduling-policy``, ``--speculative-verifier``, ``--quantization``,
``--enable-chunked-prefill``) takes ``module:attribute``; a class found there is called with no arguments, so
the student's own parts (saved in their checkout, importable from it) can be served.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import os
import signal
import socket
import subprocess
import sys
import time

from miniengine.config import EngineConfig

# Fields whose value may be an object: given as "module:attribute" (or a plain value: "int8", "true", a path).
PLUGS = ("sampler", "kv", "scheduling_policy", "speculative_verifier", "quantization", "enable_chunked_prefill",
         "speculative_model", "logits_processor", "stop_strings")
_HELP = {
    "model": "model directory or shipped model name (default: target)",
    "enable_chunked_prefill": "true, false, or module:function (a chunking rule, Lab 08)",
    "quantization": "int8, int4, or module:attribute (a scheme, Lab 07)",
    "speculative_verifier": "coupled, rejection, or module:function (Lab 06)",
    "speculative_model": "a draft model directory or shipped name",
}


def load_object(spec: str, flag: str):
    """``module:attribute`` -> the object (a class is instantiated with no arguments); a clear error otherwise."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"{flag} must be module:attribute (for example mine.policy:SLOAware), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{flag}: cannot import module {module_name!r} ({e})") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{flag}: module {module_name!r} has no attribute {attr!r}") from None
    return obj() if isinstance(obj, type) else obj


def _plug_value(field: str, raw: str | None):
    if raw is None:
        return None
    flag = "--" + field.replace("_", "-")
    if field == "enable_chunked_prefill" and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if ":" in raw:
        return load_object(raw, flag)
    return raw  # a name ("int8", "coupled") or a path; EngineConfig checks it


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it): for a server started by a test or a benchmark."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def spawned(*flags: str, startup_s: float = 120.0, threads: int | None = None, cwd=None, env: dict | None = None):
    """``python -m miniengine serve FLAGS`` on a free port of 127.0.0.1, in a process of its own: yields its base URL
    once ``GET /health`` answers 200, and stops it on leaving (SIGINT, as Ctrl-C: in-flight requests may finish).
    ``threads``: torch threads in the server (OMP_NUM_THREADS); ``env``: more environment variables. A server that
    exits or stays silent raises RuntimeError with its last line on stderr."""
    import tempfile

    import httpx

    port = free_port()
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}), **(env or {})}
    # stderr goes to a file, not a pipe: nobody reads a pipe while the server runs, and a part that logs on every
    # step (a student's logging.warning) would fill its 64 KiB and block the server mid-request.
    stderr = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-m", "miniengine", "serve", "--port", str(port), *flags], cwd=cwd,
                            env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                stderr.seek(0)
                said = stderr.read().strip().splitlines()
                raise RuntimeError(f"`python -m miniengine serve {' '.join(flags)}` exited with status "
                                   f"{proc.returncode}: {said[-1] if said else 'nothing on stderr'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer /health within {startup_s:g} s")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stderr.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the name clients send as `model` (default: the --model value)")
    p.add_argument("--max-pending-requests", type=int, default=1024,
                   help="requests in flight (running or waiting) past which a new one gets 503 (default: 1024)")
    p.add_argument("--timeout-graceful-shutdown", type=float, default=10.0,
                   help="seconds to let in-flight requests finish on shutdown before they are aborted")
    p.add_argument("--log-level", default="warning")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="LLM's tensor_parallel_size; the server steps one engine, so only 1 is served")
    for f in dataclasses.fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if f.name in PLUGS or f.name == "model":
            p.add_argument(flag, default=None if f.name != "model" else "target", help=_HELP.get(f.name, "module:attribute"))
        elif isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif isinstance(default, int):
            p.add_argument(flag, type=int, default=default)
        else:
            p.add_argument(flag, default=default, help=_HELP.get(f.name))


def engine_args(args) -> dict:
    """EngineConfig's fields from parsed flags (only those that differ from the defaults, plus the model)."""
    out = {}
    for f in dataclasses.fields(EngineConfig):
        value = getattr(args, f.name)
        if f.name in PLUGS:
            if value is None:
                continue  # not given: EngineConfig's default (the course's own part)
            value = _plug_value(f.name, value)
        if f.name == "model" or value != f.default:
            out[f.name] = value
    return out


def run(args) -> int:
    import uvicorn

    from miniengine.llm import LLM
    from miniengine.serving.api.app import create_app

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be in [1, 65535], got {args.port}")
    if args.tensor_parallel_size != 1:
        raise ValueError(f"--tensor-parallel-size must be 1 to serve, got {args.tensor_parallel_size}: with tensor "
                         f"parallelism each LLM.generate() call starts and ends its ranks, and the server steps one "
                         f"engine between requests")
    if args.max_pending_requests < 1:
        raise ValueError(f"--max-pending-requests must be >= 1, got {args.max_pending_requests}")
    llm = LLM(**engine_args(args))
    app = create_app(llm, args.served_model_name or str(args.model), args.max_pending_requests)
    print(f"serving {args.served_model_name or args.model} on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=args.timeout_graceful_shutdown)
    return 0
