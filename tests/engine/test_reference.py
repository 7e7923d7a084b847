"""Naive decode, the oracle: golden tokens, batch invariance, token accounting, bad prompts."""
import pytest
import torch

from miniengine.reference import naive_generate
from miniengine.sampling import SamplingParams

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def params_of(case):
    return SamplingParams(**case["params"])


def test_float32_gives_the_golden_tokens(target, golden):
    """The golden files are float64 runs of this reference: tests/course/test_golden.py regenerates every one of them in
    float64 and compares; here the same cases in float32 must give the same tokens."""
    cases = golden["cases"]
    prompts = [c["prompt_token_ids"] for c in cases]
    params = [params_of(c) for c in cases]
    outs = naive_generate(target, prompts, params, golden["eos_token_id"], dtype=torch.float32)
    for c, o in zip(cases, outs):
        assert o.token_ids == c["token_ids"], f"{c['name']} in float32"


def test_float32_logits_within_1e_4_of_the_float64_reference(target, golden):
    case = next(c for c in golden["cases"] if c["name"].endswith("greedy"))
    p = params_of(case)
    a = naive_generate(target, [case["prompt_token_ids"]], p, dtype=torch.float64, return_logits=True)[0]
    b = naive_generate(target, [case["prompt_token_ids"]], p, dtype=torch.float32, return_logits=True)[0]
    assert max((x - y.double()).abs().max().item() for x, y in zip(a.logits, b.logits)) < 1e-4


@pytest.mark.parametrize("kind", ["greedy", "combined"])
def test_a_request_decodes_the_same_alone_and_in_a_ragged_batch_of_8(target, tok, kind):
    prompts = [tok.encode(s).ids for s in ["def f(x):", "import re", "class A(object):\n    x = 1", "#",
                                            "for k, v in d.items():", "x = [", "return", "@property\ndef name(self):"]]
    params = [SamplingParams(temperature=0 if kind == "greedy" else 0.9, top_k=0 if kind == "greedy" else 30,
                             top_p=1.0 if kind == "greedy" else 0.95, seed=100 + i, max_tokens=12 + i)
              for i in range(8)]
    batch = naive_generate(target, prompts, params)
    for i in (0, 3, 7):
        alone = naive_generate(target, [prompts[i]], params[i])[0]
        assert alone.token_ids == batch[i].token_ids


def test_tokens_processed_is_the_sum_of_prefix_lengths(target, golden):
    for c in golden["cases"][:5]:
        lp, n = len(c["prompt_token_ids"]), len(c["token_ids"])
        assert c["tokens_processed"] == sum(lp + t for t in range(n))
        out = naive_generate(target, [c["prompt_token_ids"]], params_of(c))[0]
        assert out.tokens_processed == c["tokens_processed"]


def test_stops_at_end_of_text_unless_ignore_eos(target, tok):
    eos = target.config.eos_token_id
    # Whatever the first greedy token is, declaring it the end-of-text id must stop decoding right there.
    first = naive_generate(target, [tok.encode("def f(x):").ids], SamplingParams(temperature=0, max_tokens=1))[0].token_ids[0]
    out = naive_generate(target, [tok.encode("def f(x):").ids], SamplingParams(temperature=0, max_tokens=8), eos_token_id=first)[0]
    assert out.token_ids == [first] and out.finish_reason == "stop"
    out = naive_generate(target, [tok.encode("def f(x):").ids],
                         SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), eos_token_id=first)[0]
    assert len(out.token_ids) == 8 and out.finish_reason == "length"
    assert eos == tok.token_to_id("<|endoftext|>")


@pytest.mark.parametrize("prompt,params,message", [
    ([], SamplingParams(), r"prompt must contain at least 1 token, got an empty prompt"),
    ([1, 99999], SamplingParams(), r"prompt token id at index 1 must be an integer in \[0, \d+\), got 99999"),
    ([1, -1], SamplingParams(), r"prompt token id at index 1 must be an integer in \[0, \d+\), got -1"),
    ([1, 2.0], SamplingParams(), r"prompt token id at index 1 must be an integer .* got 2.0"),
    ([1] * 500, SamplingParams(max_tokens=100),
     r"len\(prompt\) \+ max_tokens must be <= max_position_embeddings=512, got 500 \+ 100 = 600"),
    ("abc", SamplingParams(), r"prompt token id at index 0 must be an integer"),
    (5, SamplingParams(), r"prompt must be a sequence of token ids, got int"),
])
def test_bad_prompts_name_the_field_value_and_range(target, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        naive_generate(target, [prompt], params)
