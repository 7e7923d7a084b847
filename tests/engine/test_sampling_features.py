"""What an OpenAI client sends, through the engine: penalties, min_p, logprobs, stop token ids and stop strings.

Each is checked three ways: against an independent computation written here (and Hugging Face's logits processors
where the semantics agree), token-exact against the float64 reference on the screened golden cases of
data/golden/sampling_features.json, and for the engine's bookkeeping (KV blocks freed, batch invariance).
"""
import json
import math

import numpy as np
import pytest
import torch

from miniengine import LLM, SamplingParams
from miniengine.logits_processors import apply_penalties, min_p_mask, process_row, top_logprobs
from miniengine.paths import GOLDEN
from miniengine.stop_strings import find_stop, sendable

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


@pytest.fixture(scope="module")
def llm():
    return LLM(model="data/models/target", kv_layout="paged")


@pytest.fixture(scope="module")
def features():
    return json.loads((GOLDEN / "sampling_features.json").read_text())


def params_of(case, **overrides):
    return SamplingParams(**{**case["params"], **overrides})


# --- the logits processors, against independent computations ---------------------------------------------------

def test_repetition_penalty_equals_hugging_faces():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(0)
    logits = rng.normal(size=50) * 3
    prompt, output = [3, 7, 7, 12], [12, 40, 3]
    ours = apply_penalties(logits, prompt, output, SamplingParams(repetition_penalty=1.7))
    hf = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt + output]), torch.tensor(logits)[None])[0]
    np.testing.assert_allclose(ours, hf.numpy(), rtol=1e-12)
    assert ours[7] != logits[7] and ours[0] == logits[0]  # seen in the prompt only: still penalised; unseen: not


def test_presence_and_frequency_penalties_follow_openais_definition():
    logits = np.linspace(-2, 2, 10)
    prompt, output = [1, 1, 1], [2, 2, 5]  # the prompt's tokens are not penalised by these two
    got = apply_penalties(logits, prompt, output, SamplingParams(presence_penalty=0.5, frequency_penalty=-0.25))
    want = logits.copy()
    for t in set(output):
        want[t] -= -0.25 * output.count(t) + 0.5
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_min_p_keeps_what_hugging_faces_warper_keeps_at_the_same_temperature():
    from transformers.generation.logits_process import MinPLogitsWarper

    rng = np.random.default_rng(1)
    for trial in range(20):
        logits, temperature, m = rng.normal(size=64) * 2, 0.5 + trial / 10, [0.02, 0.1, 0.3, 0.9][trial % 4]
        ours = min_p_mask(logits, SamplingParams(temperature=temperature, min_p=m))
        hf = MinPLogitsWarper(m)(None, torch.tensor(logits / temperature)[None])[0]
        assert (ours == torch.isfinite(hf).numpy()).all(), (trial, m, temperature)
    assert min_p_mask(logits, SamplingParams(temperature=0, min_p=0.9)).all()  # greedy: the argmax is kept anyway


def test_process_row_applies_penalties_before_min_p():
    logits = np.array([5.0, 4.9, 0.0, -1.0])
    # unpenalised, min_p 0.5 keeps tokens 0 and 1; token 0 penalised below log(0.5) of token 1's lead is dropped
    row = process_row(logits, [0], [], SamplingParams(temperature=1.0, min_p=0.5, repetition_penalty=2.0))
    assert row[0] == -np.inf and row[1] == 4.9 and np.isneginf(row[2:]).all()


def test_logprobs_are_the_raw_distributions_top_k_plus_the_chosen_token():
    logits = np.array([1.0, 3.0, 2.0, 0.5, 3.0])
    lp = logits - np.log(np.exp(logits).sum())
    assert top_logprobs(logits, 1, 2) == pytest.approx({1: lp[1], 4: lp[4]})  # k entries: the chosen is in the top k
    assert top_logprobs(logits, 3, 2) == pytest.approx({1: lp[1], 4: lp[4], 3: lp[3]})  # k + 1: it is not
    assert top_logprobs(logits, 3, 0) == pytest.approx({3: lp[3]})


@pytest.mark.parametrize("field, value, words", [
    ("repetition_penalty", 0, "repetition_penalty must be a finite number > 0 (1 means off), got 0"),
    ("presence_penalty", 2.5, "presence_penalty must be a number in [-2, 2] (0 means off), got 2.5"),
    ("frequency_penalty", float("nan"), "frequency_penalty must be a number in [-2, 2]"),
    ("min_p", 1.5, "min_p must be a number in [0, 1] (0 means off), got 1.5"),
    ("logprobs", 21, "logprobs must be an integer in [0, 20] or None, got 21"),
    ("logprobs", -1, "logprobs must be an integer in [0, 20] or None, got -1"),
    ("stop", ["ok", ""], "stop must be a non-empty string or a list of non-empty strings, got ['ok', '']"),
    ("stop", 3, "stop must be a non-empty string or a list of non-empty strings, got 3"),
    ("stop_token_ids", [1, -2], "stop_token_ids must be a list of token ids (integers >= 0), got [1, -2]"),
    ("include_stop_str_in_output", "yes", "include_stop_str_in_output must be true or false, got 'yes'"),
])
def test_bad_values_name_the_field_and_its_range(field, value, words):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    assert words in str(e.value)


def test_a_stop_token_id_outside_the_vocabulary_is_refused_and_the_engine_keeps_serving(llm):
    vocab = llm.model.config.vocab_size
    with pytest.raises(ValueError, match=rf"request 1: stop_token_ids must hold token ids in \[0, {vocab}\), got {vocab}"):
        llm.generate(["a", "b"], [SamplingParams(max_tokens=2), SamplingParams(stop_token_ids=[vocab])])
    assert len(llm.generate("def f():", SamplingParams(temperature=0, max_tokens=3))[0].token_ids) == 3


# --- the engine, token-exact against the reference's screened golden cases ---------------------------------------

def test_the_engine_serves_the_feature_golden_cases_token_exact(llm, features, tok):
    cases = features["cases"]
    kinds = {c["name"].split("-", 1)[1] for c in cases}
    assert kinds == {"repetition", "penalties", "min_p", "all"} and len(cases) >= 28
    outs = llm.generate([c["prompt_token_ids"] for c in cases], [params_of(c) for c in cases])
    for c, o in zip(cases, outs):
        assert o.token_ids == c["token_ids"] and o.finish_reason == c["finish_reason"], c["name"]
        assert o.text == tok.decode(c["token_ids"])
        if "logprobs" in c:  # the engine's float32 logits against the reference's float64: close, same entries
            got = o.outputs[0].logprobs
            assert len(got) == len(c["logprobs"])
            for mine, want in zip(got, c["logprobs"]):
                assert mine.keys() == {t for t, _ in want}
                assert all(math.isclose(mine[t], v, abs_tol=1e-4) for t, v in want)


def test_penalised_requests_are_batch_invariant(llm, features):
    case = next(c for c in features["cases"] if c["name"].endswith("-all"))
    alone = llm.generate([case["prompt_token_ids"]], [params_of(case)])[0].token_ids
    others = [c for c in features["cases"] if c is not case][:9]
    batch = llm.generate([c["prompt_token_ids"] for c in others] + [case["prompt_token_ids"]],
                         [params_of(c) for c in others] + [params_of(case)])
    assert batch[-1].token_ids == alone == case["token_ids"]


def test_a_stop_token_id_ends_the_completion_after_it(llm, golden):
    case = next(c for c in golden["cases"] if c["name"].endswith("-greedy") and len(c["token_ids"]) > 10)
    stop_id = case["token_ids"][6]
    first = case["token_ids"].index(stop_id)
    out = llm.generate(case["prompt_token_ids"], SamplingParams(**case["params"], stop_token_ids=[stop_id]))[0]
    assert out.token_ids == case["token_ids"][: first + 1]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop_id


# --- stop strings --------------------------------------------------------------------------------------------------

def test_find_stop_takes_the_earliest_ending_match():
    assert find_stop("abcdef", ["def", "bc"]).stop == "bc"
    assert find_stop("abcdef", ["cd", "bcd"]).stop == "bcd"  # the same end: the longer cut keeps less text
    assert find_stop("abc", ["x"]) is None


def test_sendable_holds_back_what_could_start_a_stop_string():
    assert sendable("hello wor", ["world"], finished=False) == "hello"
    assert sendable("hello wor", ["world"], finished=True) == "hello wor"
    assert sendable("caf\ufffd", [], finished=False) == "caf"
    assert sendable("\n   ", ["of ", "never appears"], finished=False) == ""  # shorter than the 12 held back


def stop_inside_a_token(tok, token_ids):
    """A stop string that ends inside a token of the completion: the first token of 2+ characters after the fifth,
    cut after its first character, with the two characters before it."""
    for i in range(5, len(token_ids)):
        piece = tok.decode([token_ids[i]])
        if len(piece.strip()) >= 2:
            text = tok.decode(token_ids)
            end = len(tok.decode(token_ids[:i])) + 1
            return text[end - 3:end], text
    return None, None


def test_a_stop_string_ending_inside_a_token_cuts_the_text_and_frees_the_blocks(llm, golden, tok):
    kv = llm.engine.kv
    checked = 0
    for case in [c for c in golden["cases"] if c["name"].endswith(("-greedy", "-top_k"))][:6]:
        stop, text = stop_inside_a_token(tok, case["token_ids"])
        if stop is None:
            continue
        for include in (False, True):
            sp = SamplingParams(**case["params"], stop=["<never>", stop], include_stop_str_in_output=include)
            free = kv.block_manager.num_free_blocks
            out = llm.generate(case["prompt_token_ids"], sp)[0]
            at = text.find(stop)  # an independent cut: the first occurrence in the reference's own text
            assert out.text == text[: at + (len(stop) if include else 0)], (case["name"], stop)
            assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
            n = len(out.token_ids)  # every token up to the one that completed the stop string, no more
            assert out.token_ids == case["token_ids"][:n] and len(tok.decode(out.token_ids)) >= at + len(stop)
            assert len(tok.decode(out.token_ids[:-1])) < at + len(stop)
            assert kv.block_manager.num_free_blocks == free == kv.num_blocks  # its blocks came back
            checked += 1
    assert checked >= 6


def test_a_stream_with_stop_strings_never_sends_what_is_cut(llm, golden, tok):
    case = next(c for c in golden["cases"] if c["name"].endswith("-temperature"))
    stop, text = stop_inside_a_token(tok, case["token_ids"])
    sp = SamplingParams(**case["params"], stop=[stop, "\n\n\n\n"])
    pieces = list(llm.stream(case["prompt_token_ids"], sp))
    assert "".join(pieces) == llm.generate(case["prompt_token_ids"], sp)[0].text == text[: text.find(stop)]


def test_features_are_refused_with_speculative_decoding_by_name():
    spec = LLM(model="data/models/target", speculative_model="data/models/draft", num_speculative_tokens=2)
    with pytest.raises(ValueError, match="min_p is not supported with speculative decoding"):
        spec.generate("def f():", SamplingParams(min_p=0.1))
    assert spec.generate("def f():", SamplingParams(temperature=0, max_tokens=4, stop=["\n"]))[0].finish_reason


def test_a_plugged_logits_processor_and_stop_strings_are_the_ones_used(features, golden):
    """Lab 10's plug points: EngineConfig.logits_processor and EngineConfig.stop_strings replace the course's."""
    from miniengine.logits_processors import process_row
    from miniengine.stop_strings import StopStringRules

    calls = []

    def counting(logits_row, prompt_ids, output_ids, params):
        calls.append(len(output_ids))
        return process_row(logits_row, prompt_ids, output_ids, params)

    class NeverStops(StopStringRules):
        find_stop = staticmethod(lambda text, stops: None)

    case = next(c for c in features["cases"] if c["name"].endswith("-penalties"))
    mine = LLM(model="data/models/target", logits_processor=counting, stop_strings=NeverStops())
    assert mine.generate(case["prompt_token_ids"], params_of(case))[0].token_ids == case["token_ids"]
    assert calls == list(range(len(case["token_ids"])))  # once per token, with the output so far
    greedy = next(c for c in golden["cases"] if c["params"]["temperature"] == 0)
    out = mine.generate(greedy["prompt_token_ids"], SamplingParams(**greedy["params"], stop=[greedy["text"][:3]]))
    assert out[0].text == greedy["text"]  # its find_stop never finds one: the whole completion
