"""Lab 10's shared parts: the server the tests start, the harness's own client, and the cases it sends.

The server is ``python -m miniengine serve`` in a process of its own on 127.0.0.1 (in the grading sandbox too: it has a
loopback network and nothing else), started with the flags your ``serve_flags`` wrote and stopped when the test ends.
The harness's own client is plain httpx, non-streaming: it sends a case's prompt (token ids) and parameters as OpenAI's
completions body, asks for the chosen tokens' ids (``logprobs`` with ``return_tokens_as_token_ids``, vLLM's extension),
and reads back the text, the token ids, the finish reason and the usage. Reloaded by ``autograder.labs.lab10``.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import tempfile

import httpx

import miniengine

MODEL = "target"  # the served model's name (serve's default: the --model value)
STARTUP_S = 90.0
REQUEST_S = 120.0
# Fields of a case's params that go into the request body as they are (OpenAI's names, and vLLM's extensions).
BODY_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "min_p", "repetition_penalty",
               "presence_penalty", "frequency_penalty", "stop", "include_stop_str_in_output", "ignore_eos", "logprobs")


def body(case: dict) -> dict:
    """A case as OpenAI's completions body: its prompt's token ids and its sampling parameters."""
    params = case["params"]
    out = {"model": MODEL, "prompt": list(case["prompt_token_ids"])}
    out.update({k: params[k] for k in BODY_FIELDS if k in params})
    return out


def token_ids_of(logprobs) -> list[int]:
    """The chosen tokens' ids from a choice's logprobs (``return_tokens_as_token_ids``: "token_id:263")."""
    return [int(t.split(":", 1)[1]) for t in (logprobs or {}).get("tokens", [])]


def complete(url: str, request: dict) -> dict:
    """The harness's own client: one non-streamed completion; its text, token ids, finish reason and usage."""
    sent = {**request, "logprobs": request.get("logprobs", 0), "return_tokens_as_token_ids": True}
    r = httpx.post(url + "/v1/completions", json=sent, timeout=REQUEST_S)
    if r.status_code != 200:
        raise AssertionError(f"the server answered {r.status_code}: {r.text[:300]}")
    data = r.json()
    choice = data["choices"][0]
    return {"text": choice["text"], "token_ids": token_ids_of(choice["logprobs"]),
            "finish_reason": choice["finish_reason"], "usage": data["usage"]}


def complete_all(url: str, cases: list[dict], workers: int = 32) -> list[dict]:
    """Every case at once (the server batches them), in the cases' order."""
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda c: complete(url, body(c)), cases))


@contextlib.contextmanager
def server(flags: list[str], what: str, path: str | None = None):
    """``python -m miniengine serve`` with ``flags`` on a free port (launch.spawned); yields its URL once /health
    answers. It runs from a scratch folder, with the course (and ``path``, a folder of modules the plug flags name) on
    its import path."""
    from miniengine.serving.api.launch import spawned

    root = os.path.dirname(os.path.dirname(os.path.abspath(miniengine.__file__)))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [path, root, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    stack = contextlib.ExitStack()
    try:
        url = stack.enter_context(spawned(*flags, startup_s=STARTUP_S, cwd=tempfile.gettempdir(), env=env))
    except RuntimeError as e:  # the server's own words: the flag it refused, or the time it took
        raise AssertionError(f"{what}: {e}") from None
    with stack:
        yield url


def load_cases(files) -> list[tuple[str, dict]]:
    """(file name without .json, case) for every case of the golden ``files``, in order."""
    import json

    out = []
    for path in files:
        with open(path) as f:
            data = json.load(f)
        out += [(path.rsplit("/", 1)[-1].removesuffix(".json"), c) for c in data["cases"]]
    return out


def compare_answer(what, got, want, tok):
    """``got``'s token ids, text and finish reason against ``want``'s (a golden case, or the server's own answer):
    observed, and asserted with where they part."""
    import autograder.notebook_checks as checks
    from autograder.labs.shared import difference

    checks.observe(f"{what}: token_ids", got["token_ids"], expect=want["token_ids"])
    assert got["token_ids"] == want["token_ids"], f"{what}: {difference(tok, got['token_ids'], want['token_ids'])}"
    checks.observe(f"{what}: text", got["text"], expect=want["text"])
    assert got["text"] == want["text"], f"{what}: {text_difference(got['text'], want['text'])}"
    checks.observe(f"{what}: finish_reason", got["finish_reason"], expect=want["finish_reason"])
    assert got["finish_reason"] == want["finish_reason"], (
        f"{what}: finish_reason {got['finish_reason']!r}, expected {want['finish_reason']!r}")


def text_difference(got: str, want: str) -> str:
    """Where two texts part, for a visible message (both shown near there)."""
    from autograder.labs.shared import first_difference

    c = first_difference(got, want)
    if c == len(want):
        return f"your text goes on past the expected end at character {c}: extra {got[c:c + 30]!r}"
    if c == len(got):
        return f"your text stops at character {c}, before the expected end: missing {want[c:c + 30]!r}"
    return f"first difference at character {c}: expected {want[c:c + 20]!r}, got {got[c:c + 20]!r}"
