"""The server as a black box, through the official ``openai`` client, against the golden data.

Nothing here imports the server: it could run unchanged against vLLM serving the same model
(``MINIENGINE_SERVER_URL``, tests/engine/live_server.py); vLLM's extensions go through ``extra_body``.  Expected
tokens and text come from data/golden/ (the float64 reference's, margin-screened), never from the server itself.
"""
from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest

from miniengine.paths import GOLDEN
from tests.engine.live_server import live_server, metric, wait_for

MODEL = "target"
AS_IDS = {"return_tokens_as_token_ids": True}  # logprobs' tokens as "token_id:N": the exact tokens


def _golden(name):
    return json.loads((GOLDEN / name).read_text())


VISIBLE = _golden("visible.json")
FEATURES = _golden("sampling_features.json")


@pytest.fixture(scope="module")
def url():
    with live_server("--max-num-seqs", "64") as u:
        yield u


@pytest.fixture
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def _ids(choice) -> list[int]:
    return [int(t.split(":", 1)[1]) for t in choice.logprobs.tokens]


def _request(case) -> dict:
    """A golden case's params as a completions request (vLLM's extensions through extra_body)."""
    p = dict(case["params"])
    body = {"model": MODEL, "prompt": case["prompt"], "max_tokens": p.pop("max_tokens"),
            "temperature": p.pop("temperature"), "top_p": p.pop("top_p"), "seed": p.pop("seed"),
            "logprobs": p.pop("logprobs", 0)}
    for name in ("presence_penalty", "frequency_penalty"):
        if name in p:
            body[name] = p.pop(name)
    body["extra_body"] = {**AS_IDS, **p}  # top_k, min_p, repetition_penalty, n ...
    return body


def _check(case, choice, usage=None):
    assert _ids(choice) == case["token_ids"], case["name"]
    assert choice.text == case["text"], case["name"]
    assert choice.finish_reason == case["finish_reason"], case["name"]
    if usage is not None:
        assert usage.prompt_tokens == len(case["prompt_token_ids"])
        assert usage.completion_tokens == len(case["token_ids"])
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_models_lists_the_served_model_and_404s_another(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)


def test_golden_cases_concurrently_greedy_and_seeded_with_exact_usage(url):
    """Every visible golden case (greedy, seeded, top-k, top-p) and every sampling-feature case, all at once."""
    cases = VISIBLE["cases"] + FEATURES["cases"]

    async def main():
        aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        return await asyncio.gather(*(aclient.completions.create(**_request(c)) for c in cases))

    for case, resp in zip(cases, asyncio.run(main())):
        _check(case, resp.choices[0], resp.usage)


def test_stream_equals_the_golden_text_with_finish_reason_only_on_the_last_chunk(client):
    for case in VISIBLE["cases"][:8]:
        chunks = list(client.completions.create(**_request(case), stream=True,
                                                stream_options={"include_usage": True}))
        body, last = chunks[:-1], chunks[-1]
        assert last.choices == [] and last.usage.completion_tokens == len(case["token_ids"])
        assert all(c.usage is None for c in body)
        assert [c.choices[0].finish_reason for c in body] == [None] * (len(body) - 1) + [case["finish_reason"]]
        assert "".join(c.choices[0].text for c in body) == case["text"]
        assert [t for c in body for t in _ids(c.choices[0])] == case["token_ids"]


def test_fork_cases_n_choices_in_index_order(client):
    for case in VISIBLE["fork_cases"]:
        resp = client.completions.create(**_request(case))
        assert [c.index for c in resp.choices] == list(range(case["params"]["n"]))
        assert [_ids(c) for c in resp.choices] == [c["token_ids"] for c in case["completions"]]
        assert resp.usage.completion_tokens == sum(len(c["token_ids"]) for c in case["completions"])


def test_list_prompts_and_token_id_prompts(client):
    a, b = VISIBLE["cases"][0], VISIBLE["cases"][5]  # two greedy cases
    assert a["params"]["temperature"] == b["params"]["temperature"] == 0
    for prompt in ([a["prompt"], b["prompt"]], [a["prompt_token_ids"], b["prompt_token_ids"]]):
        resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, logprobs=0,
                                         n=2, extra_body=AS_IDS)
        assert [c.index for c in resp.choices] == [0, 1, 2, 3]  # prompt i's choice j is i * n + j
        for c, case in zip(resp.choices, (a, a, b, b)):
            _check(case, c)
        assert resp.usage.prompt_tokens == len(a["prompt_token_ids"]) + len(b["prompt_token_ids"])
    one = client.completions.create(model=MODEL, prompt=a["prompt_token_ids"], max_tokens=24, temperature=0)
    assert one.choices[0].text == a["text"]


def test_echo_puts_the_prompt_first(client):
    case = VISIBLE["cases"][0]
    resp = client.completions.create(model=MODEL, prompt=case["prompt"], max_tokens=24, temperature=0, echo=True)
    assert resp.choices[0].text == case["prompt"] + case["text"]
    streamed = client.completions.create(model=MODEL, prompt=case["prompt"], max_tokens=24, temperature=0,
                                         echo=True, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == case["prompt"] + case["text"]


def test_logprobs_counts_and_offsets(client):
    case = VISIBLE["cases"][0]
    for k in (0, 1, 5, 20):
        resp = client.completions.create(model=MODEL, prompt=case["prompt"], max_tokens=24, temperature=0, logprobs=k)
        lp = resp.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == resp.usage.completion_tokens
        assert all(len(top) in (k, k + 1) or (k == 0 and len(top) == 1) for top in lp.top_logprobs)
        assert all(max(top.values()) <= 0 for top in lp.top_logprobs)
        text = resp.choices[0].text
        assert [text[o:o + len(t)] for o, t in zip(lp.text_offset, lp.tokens)] == lp.tokens


def _inside_token_stop(case):
    """A stop string that starts and ends inside tokens of the case's greedy text."""
    text = case["text"]
    start = len(text) // 3
    return text[start + 1:start + 4], text.find(text[start + 1:start + 4])


def test_stop_strings_cut_the_text_even_inside_a_token(client):
    case = VISIBLE["cases"][0]
    stop, at = _inside_token_stop(case)
    for stream in (False, True):
        for include in (False, True):
            resp = client.completions.create(model=MODEL, prompt=case["prompt"], max_tokens=24, temperature=0,
                                             stop=[stop, "never appears"], stream=stream,
                                             extra_body={"include_stop_str_in_output": include})
            chunks = list(resp) if stream else [resp]
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            assert text == case["text"][:at + (len(stop) if include else 0)], (stream, include)
            assert chunks[-1].choices[0].finish_reason == "stop"
            assert getattr(chunks[-1].choices[0], "stop_reason", stop) == stop


def test_64_concurrent_streaming_clients_each_token_exact(url, client):
    cases = (VISIBLE["cases"] * 2)[:64]
    greedy = VISIBLE["cases"][0]
    alone = client.completions.create(**_request(greedy)).choices[0].text

    async def one(aclient, case):
        stream = await aclient.completions.create(**_request(case), stream=True)
        chunks = [c async for c in stream]
        return "".join(c.choices[0].text for c in chunks), [t for c in chunks for t in _ids(c.choices[0])]

    async def main():
        aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        return await asyncio.gather(*(one(aclient, c) for c in cases))

    results = asyncio.run(main())
    assert len(results) == 64
    for case, (text, ids) in zip(cases, results):
        assert (text, ids) == (case["text"], case["token_ids"]), case["name"]
    assert alone == greedy["text"] == results[0][0]
    assert wait_for(lambda: metric(url, "vllm:kv_cache_usage_perc") == 0 and
                    metric(url, "vllm:num_requests_running") == 0)


def test_a_client_dropped_mid_stream_frees_its_kv_blocks(url, client):
    stream = client.completions.create(model=MODEL, prompt="import os", max_tokens=400, temperature=0,
                                       extra_body={"ignore_eos": True}, stream=True)
    next(iter(stream))
    assert metric(url, "vllm:num_requests_running") == 1 and metric(url, "vllm:kv_cache_usage_perc") > 0
    stream.close()
    assert wait_for(lambda: metric(url, "vllm:kv_cache_usage_perc") == 0 and
                    metric(url, "vllm:num_requests_running") == 0, timeout=10)


def test_a_storm_of_abandoned_requests_leaves_the_server_serving(url):
    async def consume(aclient, i, stream):
        r = await aclient.completions.create(model=MODEL, prompt=f"def f{i}(x):", max_tokens=300, seed=i,
                                             extra_body={"ignore_eos": True}, stream=stream)
        if stream:
            async for _ in r:
                pass

    async def abandon(aclient, i, stream):  # a client that gives up after 0.3 s and closes its connection
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(consume(aclient, i, stream), timeout=0.3)

    async def main():
        aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        await asyncio.gather(*(abandon(aclient, i, i % 2 == 0) for i in range(200)))

    asyncio.run(main())
    fresh = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=5)
    start = time.monotonic()
    case = VISIBLE["cases"][0]
    assert fresh.completions.create(model=MODEL, prompt=case["prompt"], max_tokens=24, temperature=0).choices[0].text \
        == case["text"]
    assert time.monotonic() - start < 5
    assert wait_for(lambda: metric(url, "vllm:kv_cache_usage_perc") == 0, timeout=10)


BAD = [  # (the request's fields, the param the 400 must name)
    (dict(prompt="x", max_tokens="5"), "max_tokens"),
    (dict(prompt="x", max_tokens=0), "max_tokens"),
    (dict(prompt="x", temperature=-1), "temperature"),
    (dict(prompt="x", top_p=0), "top_p"),
    (dict(prompt="x", n=0), "n"),
    (dict(prompt="", max_tokens=4), "prompt"),
    (dict(prompt=[], max_tokens=4), "prompt"),
    (dict(prompt=[1, 2, 10 ** 6], max_tokens=4), "prompt"),
    (dict(prompt="x " * 600, max_tokens=4), "prompt"),
    (dict(prompt="x", max_tokens=10_000), "max_tokens"),
    (dict(prompt="x", logprobs=21), "logprobs"),
    (dict(prompt="x", stream_options={"include_usage": True}), "stream_options"),
    (dict(prompt="x", stop=[""]), "stop"),
    (dict(prompt="x", presence_penalty=3), "presence_penalty"),
    (dict(prompt="x", extra_body={"top_k": -1}), "top_k"),
    (dict(prompt="x", extra_body={"min_p": 2}), "min_p"),
    (dict(prompt="x", extra_body={"repetition_penalty": 0}), "repetition_penalty"),
    (dict(prompt="x", extra_body={"stop_token_ids": [10 ** 6]}), "stop_token_ids"),
    (dict(prompt="x", extra_body={"max_tokenz": 3}), "max_tokenz"),
]


@pytest.mark.parametrize("fields,param", BAD, ids=[p + str(i) for i, (_, p) in enumerate(BAD)])
def test_bad_input_gets_400_naming_the_field_then_the_server_serves(client, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, **fields)
    assert e.value.status_code == 400
    error = e.value.body if "message" in (e.value.body or {}) else e.value.body["error"]
    assert error["param"] == param and param in error["message"], error
    ok = client.completions.create(model=MODEL, prompt="import os", max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason == "length"


def test_a_malformed_body_is_a_400_too(url, client):
    import httpx

    r = httpx.post(url + "/v1/completions", content=b'{"model": "target", "prompt": "x', timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=1).choices[0].text is not None
