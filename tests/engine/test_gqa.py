"""GQA conversion (mean-pooled K/V heads) and the engine's exactness on the shipped GQA model."""
import json
import subprocess
import sys

import pytest
import torch

from miniengine import LLM, SamplingParams
from miniengine.attention import NoCacheBackend
from miniengine.course import golden as golden_mod
from miniengine.gqa import convert, mean_pool_kv
from miniengine.model import load_model
from miniengine.paths import MODELS, REPO_ROOT, TARGET


def test_mean_pool_averages_each_group_of_heads():
    w = torch.arange(4 * 2 * 3, dtype=torch.float32).reshape(4 * 2, 3)  # 4 heads of head_dim 2, hidden 3
    pooled = mean_pool_kv(w, num_heads=4, kv_heads=2)
    heads = w.reshape(4, 2, 3)
    assert torch.equal(pooled.reshape(2, 2, 3), torch.stack([heads[:2].mean(0), heads[2:].mean(0)]))
    with pytest.raises(ValueError, match="kv_heads must divide the 4 KV heads of the model, got 3"):
        mean_pool_kv(w, 4, 3)


def test_query_head_h_reads_kv_head_h_over_group_size():
    """If the heads of each group already share their K and V, converting changes nothing at all."""
    mha = load_model(TARGET, torch.float64)
    c = mha.config
    with torch.no_grad():
        for layer in mha.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                pooled = mean_pool_kv(proj.weight, c.num_attention_heads, 2)  # [2 * hd, hidden]
                proj.weight.copy_(pooled.reshape(2, 1, c.head_dim, -1).expand(2, c.num_attention_heads // 2, c.head_dim,
                                                                              -1).reshape_as(proj.weight))
    gqa = convert(mha, 2)
    x, pos = torch.randint(1, c.vocab_size, (40,)), torch.arange(40)
    assert gqa.config.num_key_value_heads == 2
    assert torch.allclose(gqa(x, pos, NoCacheBackend([40])), mha(x, pos, NoCacheBackend([40])), atol=1e-10)


def test_convert_refuses_bad_head_counts():
    mha = load_model(TARGET)
    with pytest.raises(ValueError, match=r"kv_heads must be a divisor of num_attention_heads=8, got 3"):
        convert(mha, 3)
    with pytest.raises(ValueError, match="convert an MHA model"):
        convert(convert(mha, 2), 1)
    r = subprocess.run([sys.executable, "-m", "miniengine", "convert-gqa"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert r.returncode == 2 and "--kv-heads" in r.stderr


def gqa_cases():
    return [c for h in (False, True) for c in json.loads(golden_mod.gqa_file(h).read_text())["cases"]]


@pytest.mark.parametrize("engine_args", [dict(kv_layout="paged"), dict(kv_layout="contiguous"),
                                         dict(kv_layout="paged", block_size=4, kv_cache_tokens=256),
                                         dict(speculative_model="draft", num_speculative_tokens=3)],
                         ids=["paged", "contiguous", "paged-under-pressure", "speculative"])
def test_the_engine_is_token_exact_on_the_gqa_model(engine_args):
    cases = gqa_cases()
    llm = LLM(model=str(MODELS / golden_mod.GQA_MODEL), **engine_args)
    outs = llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
    assert [o.token_ids for o in outs] == [c["token_ids"] for c in cases]


def test_the_shipped_gqa_model_has_two_kv_heads_and_a_quarter_of_the_kv():
    gqa = LLM(model=str(MODELS / golden_mod.GQA_MODEL), kv_cache_tokens=1024)
    mha = LLM(kv_cache_tokens=1024)
    assert gqa.model.config.num_key_value_heads == 2
    assert mha.engine.kv.pool_k.numel() == 4 * gqa.engine.kv.pool_k.numel()
    card = (MODELS / golden_mod.GQA_MODEL / "README.md").read_text()
    for row in ("MHA target", "converted (mean-pooled)", "uptrained"):
        assert f"| {row}" in card


def test_the_gqa_model_is_exact_in_a_per_sequence_layout_too():
    """The third kind of KV layout: one cache object per sequence (Lab 02's shape), here the loop-based one
    tests/engine/test_engine_core.py writes independently of the course's code."""
    from test_engine_core import LoopBackend, LoopCache

    from miniengine.kv import PerSequenceKV
    cases = gqa_cases()[::2]
    model = load_model(MODELS / golden_mod.GQA_MODEL)
    llm = LLM(model=model, kv=PerSequenceKV(LoopCache, LoopBackend, model.config, torch.float32, "cpu"))
    outs = llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
    assert [o.token_ids for o in outs] == [c["token_ids"] for c in cases]
