"""The Llama stack: the HF layout on disk, the seam, configs."""
import json

import pytest
import torch
from conftest import tiny_config

from miniengine.attention import NoCacheBackend
from miniengine.model import LlamaConfig, load_model, save_model
from miniengine.paths import TARGET

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def test_round_trip_through_the_hf_layout(tiny_gqa, tmp_path):
    save_model(tiny_gqa, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"config.json", "model.safetensors"}
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 2
    loaded = load_model(tmp_path)
    ids, pos = torch.tensor([3, 1, 4, 1, 5]), torch.arange(5)
    torch.testing.assert_close(loaded(ids, pos, NoCacheBackend([5])), tiny_gqa(ids, pos, NoCacheBackend([5])), rtol=0, atol=0)


def test_tied_head_is_stored_once(tiny_gqa, tmp_path):
    from safetensors import safe_open

    save_model(tiny_gqa, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert "model.layers.0.self_attn.q_proj.weight" in names


def test_shipped_target_is_mha_fp32_and_small(target):
    c = target.config
    assert c.num_key_value_heads == c.num_attention_heads
    assert target.num_parameters() <= 8_000_000
    assert all(p.dtype == torch.float32 for p in target.parameters())


def test_shipped_draft_is_at_most_a_tenth_of_the_target(target):
    draft = load_model(TARGET.parent / "draft")
    assert draft.num_parameters() <= 0.10 * target.num_parameters()
    assert draft.config.vocab_size == target.config.vocab_size
    assert (TARGET.parent / "draft" / "tokenizer.json").read_bytes() == (TARGET / "tokenizer.json").read_bytes()


def test_a_ragged_batch_equals_each_sequence_alone(tiny_gqa):
    seqs = [[5, 6, 7], [1], [9, 8, 7, 6, 5]]
    ids = torch.tensor([t for s in seqs for t in s])
    pos = torch.cat([torch.arange(len(s)) for s in seqs])
    batched = tiny_gqa(ids, pos, NoCacheBackend([len(s) for s in seqs]))
    alone = torch.cat([tiny_gqa(torch.tensor(s), torch.arange(len(s)), NoCacheBackend([len(s)])) for s in seqs])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_logits_indices_select_rows(tiny_gqa):
    ids, pos = torch.tensor([1, 2, 3, 4]), torch.arange(4)
    full = tiny_gqa(ids, pos, NoCacheBackend([4]))
    torch.testing.assert_close(tiny_gqa(ids, pos, NoCacheBackend([4]), logits_indices=torch.tensor([3])), full[3:])


def test_every_layer_goes_through_the_backend(tiny_gqa):
    seen = []

    class Spy(NoCacheBackend):
        def attend(self, layer, q, k, v):
            seen.append((layer, tuple(q.shape), tuple(k.shape)))
            return super().attend(layer, q, k, v)

    tiny_gqa(torch.tensor([1, 2, 3]), torch.arange(3), Spy([3]))
    assert seen == [(0, (3, 4, 8), (3, 2, 8)), (1, (3, 4, 8), (3, 2, 8))]


@pytest.mark.parametrize("fields,message", [
    (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads=3 must divide num_attention_heads=4"),
    (dict(hidden_size=30, num_attention_heads=4), "hidden_size=30 must be a multiple of num_attention_heads=4"),
])
def test_bad_config_is_rejected(fields, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**fields)


def test_missing_model_directory_says_where(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected config.json"):
        load_model(tmp_path / "nope")
