"""A live ``python -m miniengine serve`` on 127.0.0.1 for the black-box tests (test_serving_openai.py).

``MINIENGINE_SERVER_URL=http://host:port`` points the suite at a server that is already running instead (vLLM
serving the course's model, for instance): the suite uses nothing but the HTTP API.
"""
from __future__ import annotations

import contextlib
import os
import time

import httpx

from miniengine.paths import REPO_ROOT
from miniengine.serving.api.launch import spawned


@contextlib.contextmanager
def live_server(*flags: str, startup_s: float = 120.0):
    """Yields the base URL (``http://127.0.0.1:PORT``); on leaving, stops the server with SIGINT, as Ctrl-C does."""
    if os.environ.get("MINIENGINE_SERVER_URL"):
        yield os.environ["MINIENGINE_SERVER_URL"].rstrip("/")
        return
    with spawned(*flags, startup_s=startup_s, cwd=REPO_ROOT) as url:
        yield url


def metric(url: str, name: str) -> float:
    """One unlabelled-by-us series of /metrics (the sum over its label sets)."""
    text = httpx.get(url + "/metrics", timeout=5).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    if not values:
        raise KeyError(f"{name} is not in /metrics")
    return sum(values)


def wait_for(predicate, timeout: float = 10.0, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()
