"""miniengine.course.quant_viz: the formats are read correctly, fake_quant is the engine's schemes bit for bit, the
quality numbers are train.evaluate's and modelcard.top1_agreement's, grouped attention is the engine's
attention, AWQ never does worse on its calibration inputs, and the KV designs price as the cost model does."""
import dataclasses

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from miniengine.attention import attention  # noqa: E402
from miniengine.cost.roofline import GPUS, CostModel, llama3_8b  # noqa: E402
from miniengine.course import quant_viz as qv  # noqa: E402
from miniengine.layers.quant import Int4GroupWise, Int8PerChannel, dequantized_copy, state_bytes  # noqa: E402
from miniengine.model import Llama, LlamaConfig  # noqa: E402

pytestmark = pytest.mark.student_edition  # ships in the student edition (tests/conftest.py)

SMALL = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, max_position_embeddings=64)


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    return Llama(SMALL).eval()


@pytest.fixture(scope="module")
def stream():
    return np.random.default_rng(0).integers(0, SMALL.vocab_size, 400).astype(np.uint16)


# ---------------------------------------------------------------- formats


@pytest.mark.parametrize("name,bits,exp,man,biggest", [
    ("fp32", 32, 8, 23, None), ("bf16", 16, 8, 7, None), ("fp16", 16, 5, 10, 65504.0),
    ("fp8 E4M3", 8, 4, 3, 448.0), ("fp8 E5M2", 8, 5, 2, 57344.0)])
def test_float_formats(name, bits, exp, man, biggest):
    f = qv.float_format(name)
    assert (f["bits"], f["exponent bits"], f["mantissa bits"]) == (bits, exp, man)
    assert f["relative step"] == 2.0 ** -man
    if biggest is not None:
        assert f["max"] == biggest


def test_int_formats():
    assert qv.int_format(8)["qmax"] == 127 and qv.int_format(8)["levels"] == 255
    assert qv.int_format(4)["qmax"] == 7 and qv.int_format(4)["levels"] == 15


@pytest.mark.parametrize("dtype,count,biggest", [(torch.float8_e4m3fn, 253, 448.0), (torch.float8_e5m2, 247, 57344.0)])
def test_float8_grid_is_every_finite_value(dtype, count, biggest):
    grid = qv.float8_grid(dtype)
    assert len(grid) == count and grid.max() == biggest and grid.min() == -biggest and 0.0 in grid
    t = torch.tensor(grid)
    assert torch.equal(t.to(dtype).to(torch.float64), t)  # every value is exactly representable
    assert np.all(np.diff(grid) > 0)


# ---------------------------------------------------------------- scale granularity


@pytest.mark.parametrize("shape", [(16, 64), (7, 128)])
def test_fake_quant_is_the_engines_schemes(shape):
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    s8 = Int8PerChannel()
    assert torch.equal(qv.fake_quant(w, 8, "channel"), s8.dequantize(s8.quantize(w)))
    for g in (2, 16, 32, 64):
        s4 = Int4GroupWise(g)
        assert torch.equal(qv.fake_quant(w, 4, g), s4.dequantize(s4.quantize(w)))


def test_fake_quant_error_is_at_most_half_a_step_and_zeros_stay_zero():
    w = torch.randn(8, 32, generator=torch.Generator().manual_seed(2))
    w[3] = 0
    for gran in ("tensor", "channel", 8):
        for bits in (3, 4, 8):
            qmax = 2 ** (bits - 1) - 1
            w_hat = qv.fake_quant(w, bits, gran)
            assert torch.all(w_hat[3] == 0)
            if gran == "tensor":
                step = w.abs().max() / qmax
            elif gran == "channel":
                step = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / qmax
            else:
                step = w.view(8, 4, 8).abs().amax(2, keepdim=True).clamp(min=1e-12).expand(8, 4, 8).reshape(8, 32) / qmax
            assert torch.all((w_hat - w).abs() <= step / 2 + 1e-6)
            assert len(torch.unique(torch.round(w_hat[0] / step[0] if step.dim() else w_hat[0] / step))) <= 2 * qmax + 1


def test_finer_scales_never_hurt_the_worst_error():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(3))
    worst = [(qv.fake_quant(w, 4, g) - w).abs().max().item() for g in ("tensor", "channel", 64, 32)]
    assert worst == sorted(worst, reverse=True)


@pytest.mark.parametrize("bad", ["rows", 0, 3, True, 1.5])
def test_fake_quant_refuses_bad_granularity(bad):
    with pytest.raises(ValueError, match="granularity|group size"):
        qv.fake_quant(torch.randn(4, 8), 4, bad)


@pytest.mark.parametrize("bits", [1, 17, 4.0])
def test_fake_quant_refuses_bad_bits(bits):
    with pytest.raises(ValueError, match="bits"):
        qv.fake_quant(torch.randn(4, 8), bits)


def test_bytes_per_weight_counts_the_engines_scales():
    w = torch.randn(64, 256)
    assert qv.bytes_per_weight(4, 64, in_features=256, scale_bytes=4) == 0.5625  # the engine README's figure
    assert qv.bytes_per_weight(4, 64, in_features=256, scale_bytes=4) == state_bytes(Int4GroupWise(64).quantize(w)) / w.numel()
    assert qv.bytes_per_weight(8, "channel", in_features=256, scale_bytes=4) == state_bytes(Int8PerChannel().quantize(w)) / w.numel()
    assert qv.bytes_per_weight(16) == 2 and qv.bytes_per_weight(8, "tensor", 4096, 2, 4096) == 1 + 2 / 4096 ** 2


# ---------------------------------------------------------------- quality


def test_val_loss_and_agreement_are_the_course_numbers(small, stream, monkeypatch):
    from miniengine.course import modelcard
    from miniengine.course.train import evaluate

    assert qv.val_loss(small, stream, 3, 32) == pytest.approx(evaluate(small, stream, 32, 3), abs=1e-12)
    other = dequantized_copy(small, "int4", 8)
    monkeypatch.setattr(modelcard, "encode_corpus", lambda tok, files: stream)
    monkeypatch.setattr(modelcard.corpus, "split_files", lambda: ([], []))
    assert qv.top1_agreement(other, small, stream, 3, 32) == modelcard.top1_agreement(other, small, None, 3, 32)
    assert qv.top1_agreement(small, small, stream, 3, 32) == 1.0


# ---------------------------------------------------------------- grouped attention


@pytest.mark.parametrize("H,K,Tq,Tk", [(8, 2, 1, 40), (8, 1, 1, 17), (4, 4, 1, 9), (8, 2, 5, 12)])
def test_grouped_attention_is_the_engines_attention(H, K, Tq, Tk):
    g = torch.Generator().manual_seed(4)
    B, d = 3, 16
    q, k, v = torch.randn(B, Tq, H, d, generator=g), torch.randn(B, Tk, K, d, generator=g), torch.randn(B, Tk, K, d, generator=g)
    visible = torch.rand(B, Tq, Tk, generator=g) < 0.7
    visible[..., 0] = True  # every query sees at least one key
    assert torch.allclose(qv.grouped_attention(q, k, v, visible), attention(q, k, v, visible), atol=1e-6)


# ---------------------------------------------------------------- activations and AWQ


def test_capture_inputs_records_what_each_linear_multiplies(small):
    names = ["layers.0.self_attn.q_proj", "layers.1.mlp.down_proj"]
    outs = {}
    layers = qv.linear_layers(small)
    hooks = [layers[n].register_forward_hook(lambda m, i, o, n=n: outs.setdefault(n, []).append(o.detach())) for n in names]
    got = qv.capture_inputs(small, [[1, 2, 3, 4], [5, 6, 7]], names)
    for h in hooks:
        h.remove()
    assert set(got) == set(names)
    for n in names:
        assert got[n].shape == (7, layers[n].in_features)
        assert torch.allclose(got[n] @ layers[n].weight.T, torch.cat(outs[n]), atol=1e-6)
    assert all(not m._forward_hooks for m in layers.values())
    assert len(qv.linear_layers(small)) == 7 * SMALL.num_hidden_layers
    with pytest.raises(ValueError, match="no decoder linear"):
        qv.capture_inputs(small, [[1, 2]], ["layers.9.mlp.up_proj"])


def test_awq_scales_and_the_search():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 64, generator=g)
    x[:, :2] *= 20  # two salient input channels
    w = torch.randn(32, 64, generator=g)
    s = qv.awq_scales(x.abs().mean(0), 0.5)
    assert float(s.max() * s.min()) == pytest.approx(1.0)
    assert torch.allclose(qv.awq_scales(x.abs().mean(0), 0.0), torch.ones(64))
    quant = lambda m: qv.fake_quant(m, 4, 16)  # noqa: E731
    found = qv.awq_search(w, x, quant, grid=10)
    assert found["rtn_error"] == pytest.approx(qv.output_error(w, quant(w), x), rel=1e-5)
    assert found["error"] <= found["rtn_error"] and found["error"] == found["errors"].min()
    assert found["error"] < 0.9 * found["rtn_error"]  # with real outliers the scaling helps
    # the folded form computes what the scaled layer computes: (x / s) Q(W s)^T
    sc = found["scales"]
    assert torch.allclose((x / sc) @ quant(w * sc).T, x @ qv.awq_quantize(w, sc, quant).T, atol=1e-4)


def test_awq_copy_without_calibration_is_dequantized_copy(small):
    quant = lambda m: Int4GroupWise(8).dequantize(Int4GroupWise(8).quantize(m))  # noqa: E731
    plain, searches = qv.awq_copy(small, {}, quant)
    ref = dequantized_copy(small, "int4", 8)
    assert searches == {}
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), ref.state_dict().values()))


def test_awq_copy_scales_the_calibrated_layers_only_and_leaves_the_model(small):
    before = {k: v.clone() for k, v in small.state_dict().items()}
    calib = qv.capture_inputs(small, [list(range(20))], ["layers.0.mlp.down_proj"])
    quant = lambda m: qv.fake_quant(m, 4, 8)  # noqa: E731
    out, searches = qv.awq_copy(small, calib, quant, grid=4)
    assert list(searches) == ["layers.0.mlp.down_proj"]
    assert all(torch.equal(before[k], v) for k, v in small.state_dict().items())
    w = qv.linear_layers(small)["layers.0.mlp.down_proj"].weight
    got = qv.linear_layers(out)["layers.0.mlp.down_proj"].weight
    assert torch.allclose(got, qv.awq_quantize(w, searches["layers.0.mlp.down_proj"]["scales"], quant))
    other = qv.linear_layers(out)["layers.1.mlp.down_proj"].weight
    assert torch.equal(other, quant(qv.linear_layers(small)["layers.1.mlp.down_proj"].weight))


# ---------------------------------------------------------------- KV designs


def test_kv_designs_count_the_cache():
    cfg = llama3_8b()
    gqa = qv.KVDesign("GQA-8")
    assert qv.kv_bytes_per_token(cfg, gqa, 4096) == cfg.kv_bytes_per_token(2)
    assert qv.kv_bytes_per_token(cfg, qv.KVDesign("MHA", kv_heads=32), 100) == 4 * cfg.kv_bytes_per_token(2)
    assert qv.kv_bytes_per_token(cfg, qv.KVDesign("MLA", latent=576), 100) == 576 * 32 * 2
    assert qv.kv_bytes_per_token(cfg, qv.KVDesign("CLA2", share=2), 100) == cfg.kv_bytes_per_token(2) / 2
    local = qv.KVDesign("local", window=1024, global_every=6)
    assert local.layers(cfg) == (5, 27)
    assert qv.kv_bytes_per_token(cfg, local, 1024) == cfg.kv_bytes_per_token(2)  # the window covers everything
    long = qv.kv_bytes_per_sequence(cfg, local, 8192)
    assert long == (5 * 8192 + 27 * 1024) * 2 * 8 * 128 * 2
    assert qv.KVDesign("all local", window=4096).layers(cfg) == (0, 32)


def test_priced_puts_any_cache_size_into_the_cost_model():
    cfg = llama3_8b()
    m = qv.priced(cfg, GPUS["H100"], 12345.0)
    assert m.kv_bytes_per_token == pytest.approx(12345.0)
    same = qv.priced(cfg, GPUS["H100"], cfg.kv_bytes_per_token(2))
    ref = CostModel(cfg, GPUS["H100"])
    assert same.decode(16, 2048).step_time_s == pytest.approx(ref.decode(16, 2048).step_time_s)
    assert same.max_batch(2048) == ref.max_batch(2048)


def test_design_point_reproduces_the_cost_model():
    row = qv.design_point(32, "bf16", "bf16", context=1024, batch=32)
    ref = CostModel(dataclasses.replace(llama3_8b(), num_key_value_heads=32), GPUS["H100"])
    assert row["max batch"] == ref.max_batch(1024) and row["step_s"] == ref.decode(32, 1024).step_time_s
    small = qv.design_point(8, "int4, groups of 64", "int8 / fp8", context=1024, batch=10**6)
    assert small["batch"] == small["max batch"]  # the batch is capped at what fits
    assert small["bytes per weight"] == 0.5 + qv.SCALE_BYTES / 64
    assert small["kv bytes per token"] == pytest.approx(llama3_8b().kv_bytes_per_token(1) * (1 + qv.SCALE_BYTES / 128))
    huge = qv.design_point(8, "bf16", "bf16", context=1024, batch=1, gpu="T4")  # 16 GB of weights on a 16 GB card
    assert huge["max batch"] == 0 and huge["batch"] == 0 and huge["tokens_per_s"] == 0
    assert "does not fit" not in qv.describe(row)


def test_pictures_and_explorer_build():
    rows = [qv.design_point(k, context=2048, batch=8) for k in (32, 8, 1)]
    rows.append(qv.design_point(8, context=2048, batch=1, gpu="T4"))
    fig, ax = plt.subplots()
    qv.draw_designs(ax, rows)
    assert len(ax.get_legend().get_texts()) == len(rows)
    plt.close(fig)
    b, t = qv.step_curve(rows[0])
    assert b[0] == 1 and b[-1] == rows[0]["max batch"] and np.all(np.diff(t) >= 0)
    pytest.importorskip("ipywidgets")
    box = qv.explorer()
    assert len(box.children) == 3
    plt.close("all")
