"""The vLLM-shaped API: LLM.generate, LLM.stream, add_request/step, and bad requests."""
import pytest

from miniengine import LLM, SamplingParams
from miniengine.reference import naive_generate

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


@pytest.fixture(scope="module")
def llm():
    return LLM(model="data/models/target")


def test_generate_returns_golden_tokens_and_text(llm, golden, tok):
    cases = golden["cases"][:6]
    outs = llm.generate([c["prompt"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
    for c, o in zip(cases, outs):
        assert o.token_ids == c["token_ids"] and o.text == tok.decode(c["token_ids"]) and o.prompt == c["prompt"]
        assert o.finished and o.finish_reason == c["finish_reason"]


def test_the_engine_agrees_with_the_float64_reference_off_the_golden_set(llm, target):
    """A prompt outside the golden files: the oracle runs here, independently of the engine."""
    sp = SamplingParams(temperature=0.7, top_k=50, seed=11, max_tokens=12)
    prompt = llm.tokenizer.encode("class Stack:\n    def push(self, item):").ids
    assert llm.generate(prompt, sp)[0].token_ids == naive_generate(target, [prompt], sp)[0].token_ids


def test_stream_concatenates_to_the_text(llm):
    sp = SamplingParams(temperature=0.8, seed=4, max_tokens=20)
    assert "".join(llm.stream("def main():", sp)) == llm.generate("def main():", sp)[0].text


def test_add_request_and_step_drive_the_engine_one_step_at_a_time(llm, golden):
    a, b = golden["cases"][0], golden["cases"][7]
    ra = llm.add_request(a["prompt_token_ids"], SamplingParams(**a["params"]))
    first = llm.step()
    assert [o.request_id for o in first] == [ra] and len(first[0].token_ids) == 1 and not first[0].finished
    rb = llm.add_request(b["prompt"], SamplingParams(**b["params"]))  # joins while a is decoding
    done = {}
    while llm.has_unfinished_requests():
        for o in llm.step():
            if o.finished:
                done[o.request_id] = o
    assert done[ra].token_ids == a["token_ids"] and done[rb].token_ids == b["token_ids"]
    assert done[rb].prompt == b["prompt"]
    assert llm.engine.requests == {} and llm._texts == {}  # finished requests are not kept around


def test_a_bad_request_names_its_index_and_the_engine_keeps_serving(llm):
    with pytest.raises(ValueError, match=r"request 1: prompt token id at index 0 must be an integer in \[0, 4096\), got 5000"):
        llm.generate([[1, 2], [5000]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"request 0: len\(prompt\) \+ max_tokens must be <= max_position_embeddings=512"):
        llm.generate([[1] * 500], SamplingParams(max_tokens=20))
    assert not llm.has_unfinished_requests()  # nothing of the bad batch was queued
    assert len(llm.generate([[1, 2]], SamplingParams(max_tokens=2))[0].token_ids) >= 1


@pytest.mark.parametrize("kv_layout", ["paged", "contiguous"])
def test_abort_frees_the_request_and_the_others_finish(golden, kv_layout):
    llm = LLM(kv_cache_tokens=400, kv_layout=kv_layout)
    a, b = golden["cases"][0], golden["cases"][1]
    ra = llm.add_request(a["prompt_token_ids"], SamplingParams(**a["params"]))
    rb = llm.add_request(b["prompt_token_ids"], SamplingParams(**b["params"]))
    llm.step()
    assert llm.abort(ra) and not llm.abort(ra) and not llm.abort("nobody")
    outs = []
    while llm.has_unfinished_requests():
        outs += [o for o in llm.step() if o.finished]
    assert [o.request_id for o in outs] == [rb] and outs[0].token_ids == b["token_ids"]
    kv = llm.engine.kv
    if kv_layout == "paged":
        assert kv.block_manager.num_free_blocks == kv.num_blocks and not kv.block_manager.block_tables
    else:
        assert kv.arena.slots_reserved == 0


def test_bad_engine_arguments():
    with pytest.raises(ValueError, match=r"dtype must be one of \['float32', 'float64'\], got 'int8'"):
        LLM(model="target", dtype="int8")
    with pytest.raises(FileNotFoundError, match="model='nowhere'"):
        LLM(model="nowhere")
    with pytest.raises(ValueError, match=r"max_num_seqs must be an integer >= 1, got 0"):
        LLM(max_num_seqs=0)
    with pytest.raises(ValueError, match=r"scheduling_policy: object has no admit\(waiting, running, budget\) \(Lab 04\)"):
        LLM(scheduling_policy=object())
    with pytest.raises(ValueError, match=r"kv: int has no can_allocate\(seq\) \(Labs 02, 05\)"):
        LLM(kv=3)
    with pytest.raises(TypeError):
        LLM(kv_cache=False)  # not an engine argument: the no-cache decoder is the reference, naive_generate


def test_engine_limits_are_request_errors_that_name_the_field():
    llm = LLM(max_num_batched_tokens=16, kv_cache_tokens=40, kv_layout="contiguous")
    with pytest.raises(ValueError, match=r"len\(prompt\) must be <= max_num_batched_tokens=16 .*, got 17"):
        llm.add_request(list(range(1, 18)), SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match=r"len\(prompt\) \+ max_tokens must be <= kv_cache_tokens=40, got 10 \+ 31"):
        llm.add_request(list(range(1, 11)), SamplingParams(max_tokens=31))
    with pytest.raises(ValueError, match=r"n must be 1 with a KV layout that cannot share memory .*got n=2: use "
                                         r"kv_layout='paged'"):
        llm.add_request([1], SamplingParams(max_tokens=1, n=2))
    paged = LLM(kv_cache_tokens=40, max_num_seqs=4)
    with pytest.raises(ValueError, match=r"len\(prompt\) \+ max_tokens must be <= 48, the KV pool's 3 blocks of 16 "
                                         r"positions \(kv_cache_tokens=40 rounded up to whole blocks\), got 10 \+ 39"):
        paged.add_request(list(range(1, 11)), SamplingParams(max_tokens=39))
    with pytest.raises(ValueError, match=r"n must be <= max_num_seqs=4 .*, got 5"):
        paged.add_request([1], SamplingParams(max_tokens=1, n=5))
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 0"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match=r"request_id 'x' is already in use"):
        llm.add_request([1], SamplingParams(max_tokens=1), request_id="x")
        llm.add_request([1], SamplingParams(max_tokens=1), request_id="x")
