"""The server from inside: a dead engine loop, overload, shutdown, the flags (the black box is test_serving_openai.py)."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from miniengine.course.cli import build_parser
from miniengine.llm import LLM
from miniengine.serving.api.app import create_app
from miniengine.serving.api.launch import engine_args, load_object


@pytest.fixture(scope="module")
def llm():
    return LLM(max_num_seqs=8)


def _events(response) -> list:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def test_a_dead_engine_loop_ends_streams_with_an_error_then_done_and_health_says_503(monkeypatch):
    llm = LLM(max_num_seqs=4)  # its own: a dead loop leaves requests in it
    with TestClient(create_app(llm)) as client:
        assert client.get("/health").status_code == 200

        def boom():
            raise RuntimeError("a step failed")

        monkeypatch.setattr(llm, "step", boom)
        with client.stream("POST", "/v1/completions", json={"model": "target", "prompt": "import os",
                                                             "max_tokens": 4, "stream": True}) as r:
            events = _events(r)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert "RuntimeError: a step failed" in error["message"] and set(error) == {"message", "type", "param", "code"}
        assert client.get("/health").status_code == 503
        r = client.post("/v1/completions", json={"model": "target", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 503 and "engine loop is not running" in r.json()["error"]["message"]


def test_past_max_pending_requests_a_request_gets_503_with_a_reason(llm):
    app = create_app(llm, max_pending_requests=1)
    with TestClient(app) as client:
        app.state.engine._jobs["someone-else"] = None  # one request in flight already
        r = client.post("/v1/completions", json={"model": "target", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "at capacity: 1 requests in flight, at most 1 (--max-pending-requests)" in r.json()["error"]["message"]
        del app.state.engine._jobs["someone-else"]
        assert client.post("/v1/completions", json={"model": "target", "prompt": "x", "max_tokens": 1}).status_code == 200


def test_a_shutdown_mid_request_answers_abort_and_frees_every_block():
    llm = LLM(max_num_seqs=4)
    app = create_app(llm)
    engine = app.state.engine
    with TestClient(app) as client:
        with client.stream("POST", "/v1/completions", json={"model": "target", "prompt": "import os",
                                                             "max_tokens": 400, "ignore_eos": True,
                                                             "stream": True}) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
            engine.shutdown()
            events = [line[6:] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
    assert llm.engine.kv.block_manager.num_free_blocks == llm.engine.kv.num_blocks


def test_every_engine_option_is_a_flag_and_plugs_load_by_import_path():
    args = build_parser().parse_args(["serve", "--max-num-seqs", "3", "--kv-layout", "contiguous",
                                      "--enable-prefix-caching", "--scheduling-policy",
                                      "miniengine.engine.policy:FCFSPolicy", "--enable-chunked-prefill", "true"])
    got = engine_args(args)
    assert got["max_num_seqs"] == 3 and got["kv_layout"] == "contiguous" and got["enable_prefix_caching"] is True
    assert got["enable_chunked_prefill"] is True and type(got["scheduling_policy"]).__name__ == "FCFSPolicy"
    import dataclasses

    from miniengine.config import EngineConfig
    flags = {a.dest for a in build_parser()._subparsers._group_actions[0].choices["serve"]._actions}
    assert {f.name for f in dataclasses.fields(EngineConfig)} <= flags


def test_a_bad_plug_path_is_named():
    with pytest.raises(ValueError, match="--sampler must be module:attribute"):
        load_object("nocolon", "--sampler")
    with pytest.raises(ValueError, match="--kv: module 'miniengine.kv' has no attribute 'Nope'"):
        load_object("miniengine.kv:Nope", "--kv")
    with pytest.raises(ValueError, match="--kv: cannot import module 'no_such_module'"):
        load_object("no_such_module:X", "--kv")


@pytest.mark.parametrize("flags,message", [
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size must be 1 to serve, got 2"),
    (["--kv-layout", "bogus"], "kv_layout must be one of ['paged', 'contiguous'], got 'bogus'"),
    (["--port", "0"], "--port must be in [1, 65535], got 0"),
    (["--sampler", "miniengine.kv:Nope"], "--sampler: module 'miniengine.kv' has no attribute 'Nope'"),
])
def test_bad_flags_exit_2_with_one_line_naming_the_flag(capsys, flags, message):
    from miniengine.course.cli import main

    assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_ctrl_c_lets_a_stream_in_flight_finish_then_the_server_exits_cleanly():
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from miniengine.serving.api.launch import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "miniengine", "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        body = {"model": "target", "prompt": "import os", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            proc.send_signal(signal.SIGINT)  # as Ctrl-C: stop accepting, let this stream finish
            events = [line[6:] for line in lines if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        proc.kill()


def test_a_part_that_writes_to_stderr_on_every_step_never_blocks_the_server(tmp_path):
    """spawned() sends the server's stderr to a file: a pipe that nobody reads fills at 64 KiB, and a plugged part
    that logs on every step (here 8 KiB a call, 64 calls) would block the server in the middle of a request."""
    import httpx

    from miniengine.serving.api.launch import spawned

    (tmp_path / "noisy.py").write_text(
        "import sys\n"
        "from miniengine.logits_processors import process_row as course\n"
        "def process_row(logits, prompt_ids, output_ids, params):\n"
        "    sys.stderr.write('x' * 8192 + '\\n')\n"
        "    return course(logits, prompt_ids, output_ids, params)\n")
    with spawned("--logits-processor", "noisy:process_row", cwd=tmp_path) as url:
        body = {"model": "target", "prompt": "import os", "max_tokens": 64, "ignore_eos": True, "presence_penalty": 0.5}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 64, r.text
