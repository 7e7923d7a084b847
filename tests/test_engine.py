"""The vLLM-shaped API: LLM.generate, LLM.stream, and bad requests."""
import pytest

from miniengine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(model="data/models/target")


def test_generate_returns_golden_tokens_and_text(llm, golden, tok):
    cases = golden["cases"][:6]
    outs = llm.generate([c["prompt"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
    for c, o in zip(cases, outs):
        assert o.token_ids == c["token_ids"] and o.text == tok.decode(c["token_ids"]) and o.prompt == c["prompt"]


def test_naive_and_cached_engines_agree(llm, golden):
    c = golden["cases"][1]
    naive = LLM(model="target", kv_cache=False)
    sp = SamplingParams(**c["params"])
    assert naive.generate(c["prompt_token_ids"], sp)[0].token_ids == llm.generate(c["prompt_token_ids"], sp)[0].token_ids


def test_stream_concatenates_to_the_text(llm):
    sp = SamplingParams(temperature=0.8, seed=4, max_tokens=20)
    assert "".join(llm.stream("def main():", sp)) == llm.generate("def main():", sp)[0].text


def test_a_bad_request_names_its_index_and_the_engine_keeps_serving(llm):
    with pytest.raises(ValueError, match=r"request 1: prompt token id at index 0 must be an integer in \[0, 4096\), got 5000"):
        llm.generate([[1, 2], [5000]], SamplingParams(max_tokens=2))
    assert len(llm.generate([[1, 2]], SamplingParams(max_tokens=2))[0].token_ids) >= 1


def test_bad_engine_arguments():
    with pytest.raises(ValueError, match=r"dtype must be one of \['float32', 'float64'\], got 'int8'"):
        LLM(model="target", dtype="int8")
    with pytest.raises(FileNotFoundError, match="model='nowhere'"):
        LLM(model="nowhere")
