"""Weight-only quantization: packing, error bounds, scales, bad input, and exactness against the reference
running the dequantized weights."""
import json

import numpy as np
import pytest
import torch

from miniengine import LLM, SamplingParams
from miniengine.course import golden as golden_mod
from miniengine.layers.quant import (Int4GroupWise, Int8PerChannel, QuantLinear, dequantized_copy, model_weight_bytes,
                                     pack_int4, quantize_model, unpack_int4)
from miniengine.model import load_model
from miniengine.paths import TARGET


def test_int4_pack_unpack_round_trips_every_value():
    q = torch.tensor([[v, w] for v in range(-8, 8) for w in range(-8, 8)], dtype=torch.int8).reshape(16, 32)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (16, 16)
    assert torch.equal(unpack_int4(packed), q)
    assert pack_int4(torch.tensor([[1, -1]])).item() == 0xF1  # low nibble first, two's complement


@pytest.mark.parametrize("scheme", [Int8PerChannel(), Int4GroupWise(64), Int4GroupWise(128)], ids=["int8", "int4-64", "int4-128"])
def test_every_weight_is_within_half_a_step(scheme):
    torch.manual_seed(0)
    w = torch.randn(48, 256) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different scales
    state = scheme.quantize(w)
    err = (scheme.dequantize(state) - w).abs()
    if isinstance(scheme, Int8PerChannel):
        step = state["scale"][:, None].expand_as(w)
    else:
        step = state["scale"].repeat_interleave(scheme.group_size, dim=1)
    assert torch.all(err <= step / 2 + 1e-7 * w.abs().max())
    assert torch.all(state["scale"] > 0)


@pytest.mark.parametrize("scheme", [Int8PerChannel(), Int4GroupWise(64)], ids=["int8", "int4"])
def test_scales_are_never_zero_and_zero_rows_stay_zero(scheme):
    w = torch.zeros(4, 128)
    w[1, 5] = 3.0
    state = scheme.quantize(w)
    assert torch.all(state["scale"] > 0)
    out = scheme.dequantize(state)
    assert torch.equal(out[0], torch.zeros(128)) and torch.isfinite(out).all() and out[1, 5] == 3.0


@pytest.mark.parametrize("bad", [0, 3, -64, 63, True, 64.0])
def test_bad_group_sizes_are_rejected(bad):
    with pytest.raises(ValueError, match=r"group_size must be an even integer >= 2"):
        Int4GroupWise(bad)


def test_a_group_size_that_does_not_divide_the_layer_is_rejected():
    with pytest.raises(ValueError, match=r"group_size must divide the layer's 256 input features, got 96"):
        Int4GroupWise(96).quantize(torch.zeros(8, 256))
    with pytest.raises(ValueError, match=r"group_size must divide the layer's 256 input features, got 48"):
        LLM(quantization="int4", quant_group_size=48)
    with pytest.raises(ValueError, match=r"quantization must be one of \['int4', 'int8'\] or a scheme object, got 'fp8'"):
        LLM(quantization="fp8")


def test_quant_linear_computes_with_exactly_the_dequantized_weights():
    torch.manual_seed(1)
    lin = torch.nn.Linear(128, 64, bias=False)
    x = torch.randn(5, 128)
    for scheme in (Int8PerChannel(), Int4GroupWise(64)):
        q = QuantLinear.from_linear(lin, scheme)
        assert torch.equal(q(x), x @ scheme.dequantize(scheme.quantize(lin.weight)).T)


def test_weight_bytes_meet_the_targets():
    base = load_model(TARGET)
    fp32 = model_weight_bytes(base)
    assert model_weight_bytes(quantize_model(load_model(TARGET), "int8")) <= 0.27 * fp32
    assert model_weight_bytes(quantize_model(load_model(TARGET), "int4")) <= 0.15 * fp32


@pytest.mark.parametrize("scheme", golden_mod.QUANT_SCHEMES)
@pytest.mark.parametrize("kv_layout", ["paged", "contiguous"])
def test_quantized_engine_is_token_exact_on_its_golden(scheme, kv_layout):
    cases = []
    for hidden in (False, True):
        cases += json.loads(golden_mod.quant_file(scheme, hidden).read_text())["cases"]
    llm = LLM(quantization=scheme, kv_layout=kv_layout, max_num_seqs=16)
    outs = llm.generate([c["prompt_token_ids"] for c in cases], [SamplingParams(**c["params"]) for c in cases])
    assert [o.token_ids for o in outs] == [c["token_ids"] for c in cases]


def test_the_quantized_golden_differs_from_the_float_golden(golden):
    """Else the exactness test above could not tell a quantized engine from a float one."""
    int4 = json.loads(golden_mod.quant_file("int4").read_text())["cases"]
    float_cases = {(c["prompt"], json.dumps(c["params"], sort_keys=True)): c["token_ids"] for c in golden["cases"]}
    differ = [c for c in int4 if float_cases.get((c["prompt"], json.dumps(c["params"], sort_keys=True))) != c["token_ids"]]
    assert len(differ) >= len(int4) // 2


def test_the_callers_model_is_not_quantized_in_place():
    model = load_model(TARGET)
    LLM(model=model, quantization="int8")
    assert isinstance(model.lm_head, torch.nn.Linear)


def test_a_scheme_object_plugs_in():
    class Int8ByNumpy:
        """Per-row int8 written with numpy: an independent implementation of the same scheme."""

        def quantize(self, w):
            a = w.detach().numpy().astype(np.float64)
            s = np.abs(a).max(axis=1) / 127
            s[s == 0] = 1
            s = s.astype(np.float32)
            return {"q": torch.from_numpy(np.clip(np.round(a / s[:, None]), -127, 127).astype(np.int8)),
                    "scale": torch.from_numpy(s)}

        def dequantize(self, state, rows=None):
            q, s = (state["q"], state["scale"]) if rows is None else (state["q"][rows], state["scale"][rows])
            return q.to(s.dtype) * s[..., None]

    cases = json.loads(golden_mod.quant_file("int8").read_text())["cases"]
    outs = LLM(quantization=Int8ByNumpy()).generate([c["prompt_token_ids"] for c in cases],
                                                     [SamplingParams(**c["params"]) for c in cases])
    assert [o.token_ids for o in outs] == [c["token_ids"] for c in cases]
