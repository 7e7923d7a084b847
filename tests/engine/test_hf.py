"""Our Llama and Hugging Face's agree: the shipped files load unchanged as LlamaForCausalLM."""
import pytest
import torch

from miniengine.attention import NoCacheBackend
from miniengine.paths import TARGET

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)

transformers = pytest.importorskip("transformers", reason="the optional 'hf' extra (transformers) is not installed")


@pytest.fixture(scope="module")
def hf_model():
    return transformers.LlamaForCausalLM.from_pretrained(str(TARGET), torch_dtype=torch.float32).eval()


def test_hf_logits_match_ours_within_1e_4(hf_model, target, golden):
    for case in golden["cases"][:: len(golden["cases"]) // 4 or 1]:
        ids = torch.tensor(case["prompt_token_ids"] + case["token_ids"])
        ours = target(ids, torch.arange(len(ids)), NoCacheBackend([len(ids)]))
        with torch.no_grad():
            theirs = hf_model(ids[None]).logits[0]
        assert (ours - theirs).abs().max().item() < 1e-4, case["name"]


def test_hf_greedy_tokens_equal_golden(hf_model, golden):
    for case in [c for c in golden["cases"] if c["name"].endswith("greedy")]:
        ids = torch.tensor([case["prompt_token_ids"]])
        out = hf_model.generate(ids, max_new_tokens=len(case["token_ids"]), do_sample=False,
                                eos_token_id=None, pad_token_id=0)
        assert out[0, ids.shape[1]:].tolist() == case["token_ids"], case["name"]


def test_hf_tokenizer_matches_ours(tok):
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(TARGET))
    text = "def f(x):\n    return {'a': x}  # café\n"
    assert hf_tok(text)["input_ids"] == tok.encode(text).ids
    assert hf_tok.eos_token == "<|endoftext|>"
