"""The KV cache is lossless: golden tokens, logits within 1e-4 of the float64 reference, Lp + Lo - 1 tokens."""
import pytest
import torch

from miniengine.course.cached_decode import cached_generate
from miniengine.kv.contiguous import CachedBackend, KVCache
from miniengine.reference import naive_generate
from miniengine.sampling import SamplingParams

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def params_of(case):
    return SamplingParams(**case["params"])


def test_cached_decode_gives_every_golden_token(target, golden):
    cases = golden["cases"]
    outs = cached_generate(target, [c["prompt_token_ids"] for c in cases], [params_of(c) for c in cases])
    for c, o in zip(cases, outs):
        assert o.token_ids == c["token_ids"], c["name"]
        assert o.finish_reason == c["finish_reason"], c["name"]


def test_cached_logits_within_1e_4_of_the_float64_reference(target, golden):
    for c in golden["cases"][::5]:
        ref = naive_generate(target, [c["prompt_token_ids"]], params_of(c), return_logits=True)[0]
        ours = cached_generate(target, [c["prompt_token_ids"]], params_of(c), return_logits=True)[0]
        worst = max((a - b.double()).abs().max().item() for a, b in zip(ref.logits, ours.logits))
        assert worst < 1e-4, (c["name"], worst)


def test_tokens_processed_and_kv_bytes(target, golden):
    cfg = target.config
    for c in golden["cases"][:5]:
        o = cached_generate(target, [c["prompt_token_ids"]], params_of(c))[0]
        lp, lo = len(c["prompt_token_ids"]), len(o.token_ids)
        assert o.tokens_processed == lp + lo - 1
        # The last sampled token is never fed back, so Lp + Lo - 1 positions hold K/V.
        assert o.kv_bytes_used == (lp + lo - 1) * 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
        assert o.kv_bytes_reserved == (lp + c["params"]["max_tokens"]) * cfg.kv_bytes_per_token(4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_gqa_model_cached_equals_naive(tiny_gqa, temperature):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    sp = SamplingParams(temperature=temperature, top_k=40, seed=5, max_tokens=12, ignore_eos=True)
    a = naive_generate(tiny_gqa, prompts, sp)
    b = cached_generate(tiny_gqa, prompts, sp)
    assert [x.token_ids for x in a] == [y.token_ids for y in b]


def test_a_request_decodes_the_same_alone_and_in_a_batch(target, golden):
    cases = golden["cases"][:8]
    batch = cached_generate(target, [c["prompt_token_ids"] for c in cases], [params_of(c) for c in cases])
    for c, o in zip(cases, batch):
        assert cached_generate(target, [c["prompt_token_ids"]], params_of(c))[0].token_ids == o.token_ids


def test_writing_past_the_reservation_is_an_error(tiny_gqa):
    cache = KVCache(tiny_gqa.config, max_len=2)
    backend = CachedBackend([cache], [3])
    with pytest.raises(ValueError, match=r"KV cache overflow: writing positions \[0, 3\) into a cache of max_len=2"):
        tiny_gqa(torch.tensor([1, 2, 3]), backend.positions(), backend)
