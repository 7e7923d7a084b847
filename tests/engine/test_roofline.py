"""The paper GPU against the course's worked examples and public references.

Every expected number below is copied from a source, named in the comment above it:
- "worked example NAME" is a row of the worked-examples table in miniengine/README.md, section
  "Cost model (the paper GPU)": the course's numbers for Llama-3-8B/70B on an H100, H200, A100 and T4,
  computed from Meta's published Llama 3 configurations and NVIDIA's data sheets with the conventions of
  that section (their topics follow Stanford CS349D, Spring 2026, lecture 1 "Introduction");
- "CS336" is Stanford CS336 "Language Modeling from Scratch", Spring 2025, Lecture 10 "Inference",
  https://stanford-cs336.github.io/spring2025/;
- kipply, "Transformer Inference Arithmetic" (2022), https://kipp.ly/transformer-inference-arithmetic/;
- J. Austin et al., "How to Scale Your Model", part 7 "All About Transformer Inference" (2025),
  https://jax-ml.github.io/scaling-book/inference/.
Figures the source gives with "about" are checked at the precision the source states them.
"""
import argparse
import dataclasses
import json

import pytest

from miniengine.cost import roofline
from miniengine.cost.roofline import GPU, GPUS, CostModel, llama3_8b, llama3_70b
from miniengine.course.commands import roofline as roofline_command
from miniengine.model import Llama, LlamaConfig

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)


def approx(x, rel=0.01):
    return pytest.approx(x, rel=rel)


@pytest.fixture(scope="module")
def h100_8b():
    return CostModel(llama3_8b(), GPUS["H100"])


@pytest.fixture(scope="module")
def ideal():
    """Efficiencies 1 and overhead 0: the textbook roofline."""
    return dict(compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)


# ---------------------------------------------------------------- hardware


def test_gpu_table_matches_the_cost_model_page():
    # miniengine/README.md, Cost model: the hardware table (dense 16-bit).
    assert (GPUS["H100"].peak_flops, GPUS["H100"].bandwidth, GPUS["H100"].memory) == (989e12, 3.35e12, 80e9)
    assert (GPUS["H200"].peak_flops, GPUS["H200"].bandwidth, GPUS["H200"].memory) == (989e12, 4.8e12, 141e9)
    assert (GPUS["A100-80GB"].peak_flops, GPUS["A100-80GB"].bandwidth, GPUS["A100-80GB"].memory) == (312e12, 2.039e12, 80e9)
    assert (GPUS["T4"].peak_flops, GPUS["T4"].bandwidth, GPUS["T4"].memory) == (65e12, 0.32e12, 16e9)


def test_h100_ridge_point_and_h200_upgrade():
    # Worked example "Hardware": on an H100 the peak FLOP/s is 295 times the bandwidth in bytes/s.
    assert GPUS["H100"].ridge_point == approx(295)
    # Worked example "Hardware": H200 vs H100: the same compute, 43% more bandwidth, 76% more memory.
    assert GPUS["H200"].peak_flops == GPUS["H100"].peak_flops
    assert GPUS["H200"].bandwidth / GPUS["H100"].bandwidth - 1 == approx(0.43)
    assert GPUS["H200"].memory / GPUS["H100"].memory - 1 == approx(0.76)


# ---------------------------------------------------------------- model arithmetic


def test_param_count_equals_the_torch_model_for_tied_and_untied_configs():
    # The counting formula against an independent count: torch's, on a small synthetic config.
    small = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                        num_attention_heads=6, num_key_value_heads=2)
    for cfg in (small, dataclasses.replace(small, tie_word_embeddings=False)):
        assert roofline.param_count(cfg) == Llama(cfg).num_parameters()


def test_llama3_8b_size():
    # Worked example "Model size": 8.03B parameters, 16.06 GB of weights in bf16.
    assert roofline.param_count(llama3_8b()) == approx(8.03e9)
    assert roofline.weight_bytes(llama3_8b()) == approx(16.06e9)


def test_llama3_70b_hand_count():
    # Worked example "Model size": Llama-3-70B counted by hand, part by part.
    parts = roofline.param_breakdown(llama3_70b())
    assert parts["attention_per_layer"] == approx(151.0e6)
    assert parts["mlp_per_layer"] == approx(704.6e6)
    assert parts["attention_per_layer"] + parts["mlp_per_layer"] == approx(855.6e6)
    assert 80 * (parts["attention_per_layer"] + parts["mlp_per_layer"]) == approx(68.45e9)
    assert parts["embedding"] == approx(1.05e9) and parts["lm_head"] == approx(1.05e9)
    assert parts["total"] == approx(70.55e9)
    assert roofline.weight_bytes(llama3_70b()) == approx(141e9)
    assert roofline.kv_bytes_per_token(llama3_70b()) == 327680  # exactly 320 KiB
    assert CostModel(llama3_70b(), GPUS["H100"]).kv_capacity_tokens == 0  # the weights alone exceed 80 GB
    assert roofline.weight_bytes(llama3_70b(), bytes_per_param=1) == approx(71e9)  # 8-bit weights, about 71 GB


def test_kv_bytes_per_token():
    # Worked example "KV per token": 2 x 32 x 8 x 128 x 2 = 131072 bytes = 128 KiB (8B); 320 KiB (70B).
    assert roofline.kv_bytes_per_token(llama3_8b()) == 131072
    assert roofline.kv_bytes_per_token(llama3_70b()) == 320 * 1024
    # Worked example "KV per token": a 128K-token request's KV cache is 16 GiB, as big as the 8B model's weights.
    assert 128 * 1024 * roofline.kv_bytes_per_token(llama3_8b()) == 16 * 2**30


def test_kv_cache_formula_and_decode_intensity_of_cs336():
    # CS336 lecture 10 (the KV cache): M_KV = 2 * B * S * L * K * H * bytes, read by every decode step.
    cfg, B, S = llama3_8b(), 8, 1000
    assert roofline.decode_cost(cfg, B, S).kv_read_bytes == 2 * B * S * 32 * 8 * 128 * 2
    # CS336 lecture 10 (MLP layers): the intensity of a weight matmul is about B*T, so a decode step of a
    # batch of B short sequences does about B FLOPs per byte.
    for B in (1, 4, 16):
        assert roofline.decode_cost(cfg, B, 1).arithmetic_intensity == approx(B)


def test_gqa_saves_kv_by_the_group_factor():
    # CS336 lecture 10 (GQA): KV cache shrinks by N/K; worked example "KV per token": MHA Llama-3-8B stores 512 KiB.
    mha = dataclasses.replace(llama3_8b(), num_key_value_heads=32)
    assert roofline.kv_bytes_per_token(mha) == 512 * 1024
    assert roofline.kv_bytes_per_token(mha) / roofline.kv_bytes_per_token(llama3_8b()) == 32 / 8


def test_attention_flops_count_only_visible_pairs():
    # How to Scale Your Model, part 7, "What about attention?": QK^T and AV cost 2*B*S*T*D FLOPs each.
    cfg = llama3_8b()
    per_pair = 4 * cfg.num_hidden_layers * cfg.hidden_size  # D = heads * head_dim = hidden_size here
    # Decode (T = 1) over S cached tokens: each extra cached token adds one pair.
    f = lambda S: roofline.decode_cost(cfg, 1, S).flops
    assert f(1000) - f(0) == per_pair * 1000
    # Causal prefill: T(T+1)/2 pairs, not T^2.  Its second difference in T is one pair's FLOPs
    # (a full T^2 mask would give two); the linear terms cancel.
    g = lambda T: roofline.prefill_cost(cfg, 1, T).flops
    assert g(101) - 2 * g(100) + g(99) == per_pair


def test_bytes_weights_once_embedding_rows_and_kv():
    # The accounting rules (miniengine/README.md, Cost model): a forward reads every weight once except
    # the embedding table, of which it reads only the rows it looks up (the few extra embedding rows
    # are the only difference in weight bytes between cached and uncached decode); it reads each
    # sequence's KV history and writes the KV of its new tokens.
    cfg = llama3_8b()
    row, kv = cfg.hidden_size * 2, roofline.kv_bytes_per_token(cfg)
    non_embedding = (roofline.param_count(cfg) - cfg.vocab_size * cfg.hidden_size) * 2
    assert roofline.decode_cost(cfg, 1, 0).bytes == non_embedding + row + kv
    # One more prompt token: one more row gathered and one more token of KV written.
    assert roofline.prefill_cost(cfg, 1, 101).bytes - roofline.prefill_cost(cfg, 1, 100).bytes == row + kv
    # One more cached token: one more token of KV read by each sequence.
    assert roofline.decode_cost(cfg, 4, 101).bytes - roofline.decode_cost(cfg, 4, 100).bytes == 4 * kv
    # A tied table is read in full anyway, as the LM head.
    tied = dataclasses.replace(cfg, tie_word_embeddings=True)
    assert roofline.decode_cost(tied, 1, 0).weight_bytes == roofline.weight_bytes(tied) + row


def test_lm_head_only_where_logits_are_used():
    # Prefill computes logits for the last token only; "all" (speculative verification) for every token.
    cfg = llama3_8b()
    last = roofline.forward_cost(cfg, [100], [0]).flops
    every = roofline.forward_cost(cfg, [100], [0], logits="all").flops
    assert every - last == 2 * cfg.vocab_size * cfg.hidden_size * 99


# ---------------------------------------------------------------- worked examples: prefill and decode on an H100


def test_batch1_decode_is_memory_bound_and_wastes_the_gpu(h100_8b):
    # Worked example "Batch-1 decode": reading 16 GB at 3.35 TB/s takes about 4.8 ms, the floor per token.
    assert roofline.weight_bytes(llama3_8b()) / GPUS["H100"].bandwidth == approx(4.8e-3)
    est = h100_8b.decode(1, 1024)
    assert est.bound == "memory"
    # Worked example "Batch-1 decode": arithmetic intensity about 1, MFU 0.3%.
    assert round(est.cost.arithmetic_intensity) == 1
    assert round(est.mfu * 100, 1) == 0.3


def test_prefill_time_is_flat_up_to_the_ridge_then_linear(h100_8b):
    # Worked example "Prefill": from 1 to 256 prompt tokens prefill takes about 6.1 ms (reading the weights once).
    for T in (1, 64, 256):
        assert h100_8b.prefill(1, T).step_time_s == approx(6.1e-3)
    # Worked example "Prefill": with the discount factors the crossover is at about 260 tokens.
    assert h100_8b.effective_ridge_point == approx(260)
    assert h100_8b.prefill(1, 256).bound == "memory" and h100_8b.prefill(1, 300).bound == "compute"
    # Worked example "Prefill": an 8K prompt takes about 0.2 s, a 32K prompt about 1 s.
    assert round(h100_8b.prefill(1, 8192).step_time_s, 1) == 0.2
    assert round(h100_8b.prefill(1, 32768).step_time_s) == 1


def test_prefill_time_per_token(h100_8b):
    # Worked example "Prefill": a 2048-token prefill costs about 21.2 us per token.
    assert h100_8b.prefill(1, 2048).time_per_token_s == approx(21.2e-6)
    # Worked example "Prefill": at 32K the time per token grows to about 33 us (attention is quadratic).
    assert round(h100_8b.prefill(1, 32768).time_per_token_s * 1e6) == 33


def test_h100_decode_table_at_context_1024(h100_8b):
    # Worked example "Decode batching": per-token decode time at batch 1, 64, 256 (context 1024).
    b1, b64, b256 = (h100_8b.decode(b, 1024) for b in (1, 64, 256))
    assert b1.time_per_token_s == approx(6.15e-3)
    assert b64.time_per_token_s == approx(145e-6)
    assert b256.time_per_token_s == approx(74e-6)
    # Worked example "Decode batching": batch 1 -> 64, the step goes from about 6 to about 9 ms ...
    assert round(b1.step_time_s * 1e3) == 6 and round(b64.step_time_s * 1e3) == 9
    # ... the step grows 50% while the throughput grows 42x.
    assert b64.step_time_s / b1.step_time_s == approx(1.5)
    assert (64 / b64.step_time_s) / (1 / b1.step_time_s) == approx(42)
    # Worked example "Decode batching": at B = 256, reading KV is 70% of the bytes moved; MFU 21%; still memory-bound.
    assert b256.cost.kv_read_bytes / b256.cost.bytes == approx(0.70)
    assert round(b256.mfu * 100) == 21
    assert b256.bound == "memory"


def test_memory_is_the_ceiling_on_batch(h100_8b):
    # Worked example "Memory ceiling": 90% of 80 GB, minus 16 GB of weights, leaves about 56 GB: 426,784
    # tokens of KV, so at context 1024 at most 416 requests.
    assert 0.9 * 80e9 - roofline.weight_bytes(llama3_8b()) == approx(56e9)
    assert h100_8b.kv_capacity_tokens == approx(426_784)
    assert h100_8b.max_batch(1024) == 416
    assert h100_8b.max_batch(1024) < 512  # B = 512 does not fit


def test_long_context_cuts_peak_throughput_64x(h100_8b):
    # Worked example "Memory ceiling": from context 512 to 32K the best single-GPU throughput drops about 64x.
    def best(ctx):
        b = h100_8b.max_batch(ctx)
        return b / h100_8b.decode(b, ctx).step_time_s

    assert best(512) / best(32768) == approx(64)


def test_without_gqa(h100_8b):
    # Worked example "Without GQA": Llama-3-8B with 32 KV heads: 8.84B params, 103,624 KV tokens on an H100,
    # max batch 101 at context 1024, and a batch-32 decode step of 13.12 ms against GQA's 7.70 ms.
    mha = CostModel(dataclasses.replace(llama3_8b(), num_key_value_heads=32), GPUS["H100"])
    assert roofline.param_count(mha.config) == approx(8.84e9)
    assert mha.kv_capacity_tokens == approx(103_624)
    assert mha.max_batch(1024) == 101
    assert mha.decode(32, 1024).step_time_s == approx(13.12e-3)
    assert h100_8b.decode(32, 1024).step_time_s == approx(7.70e-3)


def test_a100_exercise():
    # Worked example "A100": Llama-3-8B on an A100-80GB.
    a100 = CostModel(llama3_8b(), GPUS["A100-80GB"])
    h100 = CostModel(llama3_8b(), GPUS["H100"])
    assert a100.ridge_point == approx(153)  # the nominal ridge point
    assert a100.effective_ridge_point == approx(134)  # with the efficiencies: 312 x 0.7 / (2.039 x 0.8)
    assert a100.prefill(1, 142).bound == "memory"  # the lm_head and embedding bytes push it past 134
    assert a100.prefill(1, 145).bound == "compute"
    # Batch-1 decode at context 512: 9.74 ms vs 6.13 ms on the H100.
    assert a100.decode(1, 512).step_time_s == approx(9.74e-3)
    assert h100.decode(1, 512).step_time_s == approx(6.13e-3)
    assert roofline.weight_bytes(llama3_8b()) / GPUS["A100-80GB"].bandwidth == approx(7.88e-3)  # the floor
    ratio = a100.decode(1, 512).step_time_s / h100.decode(1, 512).step_time_s
    assert round(ratio, 1) == 1.6  # about the bandwidth ratio 1.64, far from the compute ratio 3.2
    assert abs(ratio - 3.35 / 2.039) < abs(ratio - 989 / 312)


# ---------------------------------------------------------------- ideal textbook figures


def kipply_52b():
    # kipply's 52B example: d_model 8192, 64 layers, multi-head attention (64 heads of 128), a
    # 4 x d_model two-matrix MLP (8 d^2 weights).  As a SwiGLU that is intermediate 8 d / 3 = 21845.
    # Her latency uses 12 * n_layers * d^2 parameters, without the (un)embeddings: a tiny vocab.
    return LlamaConfig(vocab_size=256, hidden_size=8192, intermediate_size=21845, num_hidden_layers=64,
                       num_attention_heads=64, num_key_value_heads=64)


def test_kipply_52b_on_a100(ideal):
    # kipply, sections "kv cache" and "flops counting": the A100 she uses does 312e12 FLOP/s and
    # 1.5e12 bytes/s (the 40 GB part, not in our GPU table).
    a100_40 = GPU("A100-40GB", 312e12, 1.5e12, 40e9)
    model = CostModel(kipply_52b(), a100_40, **ideal)
    assert a100_40.ridge_point == approx(208)  # "a distinct ratio here of 208"
    assert roofline.kv_bytes_per_token(kipply_52b()) == 2_097_152  # "4 * 64 * 8192 = 2,097,152 bytes"
    assert roofline.param_count(kipply_52b()) == approx(51.5e9)  # "we get 51.5B instead of 52B"
    assert roofline.decode_cost(kipply_52b(), 1, 0).flops == approx(103_079_215_104)  # 64 * 24 * 8192^2
    # "12 * 2 * n_layers * d_model^2 / 1.5e12 ~ 69 milliseconds for up to 208 tokens"
    assert model.decode(1, 0).step_time_s == approx(69e-3)
    assert model.prefill(1, 208).step_time_s == approx(69e-3)
    # "If we had 416 (double) tokens ... twice as long, and 312 tokens would take 1.5 times as long."
    assert model.prefill(1, 416).step_time_s == approx(2 * 69e-3)
    assert model.prefill(1, 312).step_time_s == approx(1.5 * 69e-3)


@pytest.mark.parametrize("batch, step_ms, tokens_per_s", [
    (1, 4.98, 200.61), (8, 12.13, 659.30), (16, 20.30, 787.99),
    (32, 36.65, 873.21), (64, 69.33, 923.13), (240, 249.09, 963.53),
])
def test_scaling_book_llama2_13b_step_time(ideal, batch, step_ms, tokens_per_s):
    # How to Scale Your Model, part 7, "Modeling throughput and latency for LLaMA 2-13B": the
    # theoretical step time (batch x KV cache size + parameter size) / bandwidth, for 8192-token
    # sequences on 8 TPU v5e chips (8.2e11 bytes/s and 1.97e14 FLOP/s each; 16 GB each).
    llama2_13b = LlamaConfig(vocab_size=32000, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                             num_attention_heads=40, num_key_value_heads=40, tie_word_embeddings=False)
    tpus = GPU("8x TPU v5e", 8 * 1.97e14, 8 * 8.2e11, 8 * 16e9)
    assert roofline.param_count(llama2_13b) == approx(13e9)
    assert 8192 * roofline.kv_bytes_per_token(llama2_13b) == approx(6.7e9)  # "6.7GB" per sequence
    est = CostModel(llama2_13b, tpus, **ideal).decode(batch, 8192)
    assert est.bound == "memory"
    assert est.step_time_s == approx(step_ms * 1e-3)
    assert batch / est.step_time_s == approx(tokens_per_s)


def test_ideal_roofline_formula(ideal):
    # miniengine/README.md, Cost model: time = max(FLOPs / (ce * peak), bytes / (be * bw)) + overhead.
    cost = roofline.decode_cost(llama3_8b(), 16, 500)
    gpu = GPUS["T4"]
    assert CostModel(llama3_8b(), gpu, **ideal).step_time(cost) == max(cost.flops / gpu.peak_flops,
                                                                      cost.bytes / gpu.bandwidth)
    tweaked = CostModel(llama3_8b(), gpu, compute_eff=0.5, bandwidth_eff=0.25, overhead_s=0.01)
    assert tweaked.step_time(cost) == max(cost.flops / (0.5 * gpu.peak_flops),
                                          cost.bytes / (0.25 * gpu.bandwidth)) + 0.01


def test_vectorised_decode_run_matches_step_by_step(h100_8b):
    times = h100_8b.decode_run_times([10, 200, 3000], steps=5)
    for j in range(5):
        one = h100_8b.forward([1, 1, 1], [10 + j, 200 + j, 3000 + j]).step_time_s
        assert times[j] == pytest.approx(one, rel=1e-12)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs", [dict(compute_eff=0), dict(bandwidth_eff=1.5), dict(overhead_s=-1e-3)])
def test_cost_model_rejects_bad_conventions(kwargs):
    with pytest.raises(ValueError):
        CostModel(llama3_8b(), GPUS["H100"], **kwargs)


def test_forward_cost_rejects_bad_shapes():
    with pytest.raises(ValueError, match="batch"):
        roofline.decode_cost(llama3_8b(), 0, 10)
    with pytest.raises(ValueError, match="context"):
        roofline.decode_cost(llama3_8b(), 1, -1)
    with pytest.raises(ValueError, match="new_tokens"):
        roofline.forward_cost(llama3_8b(), [0], [0])


def test_course_models_are_looked_up_lazily(tmp_path, monkeypatch):
    # The trained target/draft models may not exist yet: their config is read only when asked for.
    from miniengine import model, paths

    cfg = LlamaConfig(num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    monkeypatch.setattr(paths, "TARGET", tmp_path)
    assert roofline.get_model_config("target") == model.load_config(tmp_path)
    monkeypatch.setattr(paths, "DRAFT", tmp_path / "missing")
    with pytest.raises(ValueError, match="draft"):
        roofline.get_model_config("draft")


# ---------------------------------------------------------------- CLI (miniengine/course/commands/roofline.py)


def parse(*argv):
    parser = argparse.ArgumentParser()
    roofline_command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_json_has_the_documented_keys(capsys):
    args = parse("--model", "llama3-8b", "--gpu", "H100", "--phase", "decode", "--batch", "64",
                 "--context", "1024", "--json")
    assert roofline_command.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"params", "flops", "bytes", "step_time_s", "time_per_token_s", "bound", "mfu",
                        "kv_bytes_per_token", "kv_capacity_tokens", "max_batch"}
    assert out["time_per_token_s"] == approx(145e-6)  # worked example "Decode batching"
    assert out["kv_capacity_tokens"] == 426_784 and out["max_batch"] == 416 and out["bound"] == "memory"


def test_cli_table(capsys):
    assert roofline_command.run(parse("--phase", "prefill", "--context", "2048", "--gpu", "a100-80gb")) == 0
    text = capsys.readouterr().out
    assert "step time" in text and "compute-bound" in text and "A100-80GB" in text


@pytest.mark.parametrize("argv, flag", [
    (["--gpu", "V100"], "--gpu"),
    (["--model", "gpt-5"], "--model"),
    (["--phase", "train"], "--phase"),
    (["--batch", "0"], "--batch"),
    (["--context", "-1"], "--context"),
    (["--phase", "prefill", "--context", "0"], "--context"),
    (["--compute-eff", "0"], "--compute-eff"),
    (["--bandwidth-eff", "1.01"], "--bandwidth-eff"),
    (["--overhead-ms", "-0.1"], "--overhead-ms"),
])
def test_cli_bad_values_raise_value_error_naming_the_flag(argv, flag):
    with pytest.raises(ValueError) as err:
        roofline_command.run(parse(*argv))
    message = str(err.value)
    assert flag in message and "\n" not in message


def test_cli_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="H100.*H200.*A100-80GB.*T4"):
        roofline_command.run(parse("--gpu", "V100"))
    with pytest.raises(ValueError, match="llama3-8b.*llama3-70b.*target.*draft"):
        roofline_command.run(parse("--model", "gpt-5"))
