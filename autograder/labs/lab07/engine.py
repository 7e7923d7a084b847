"""Lab 07, "your engine": the engine serving with your Int4GroupWise and with the model your mean_pool_kv converts.
Reloaded by ``autograder.labs.lab07``.

Besides its assertions, the visible test ``observe``s (autograder/notebook_checks/ledger.py) every request's tokens, with the
golden ones as the expected values, and the bytes each engine holds, for the grader to judge outside the notebook; the
hidden test sends its tokens to the grader through its HiddenReport (autograder/hidden_outputs.py)."""
from __future__ import annotations

import json

import numpy as np

import autograder.notebook_checks as checks
from autograder.labs.lab07.common import ANSWER_KEY, call, first, own_scheme, want_pool
from autograder.labs.shared import difference
from miniengine import LLM, SamplingParams
from miniengine.gqa import convert
from miniengine.layers.quant import QuantLinear


def own_parts(pack_int4, unpack_int4, Int4GroupWise, mean_pool_kv):
    """Every part the engine runs must be yours, written in the notebook."""
    checks.require_own(pack_int4, "pack_int4")
    checks.require_own(unpack_int4, "unpack_int4")
    checks.require_own(mean_pool_kv, "mean_pool_kv")
    own_scheme(Int4GroupWise)


def generate(llm, cases, label):
    """The engine's outputs for every case (a prompt and its sampling parameters), in one batch."""
    return call(llm.generate, f"{label}: generate", [c["prompt_token_ids"] for c in cases],
                [SamplingParams(**c["params"]) for c in cases])


def compare(outs, cases, label, why=lambda: ""):
    """Every request's tokens must be the expected ones; why() explains a difference when it can."""
    tok_ = checks.load_tokenizer()
    assert len(outs) == len(cases), f"{label}: {len(cases)} requests gave {len(outs)} outputs"
    for case, out in zip(cases, outs):
        got, want = checks.as_tokens(out.token_ids, f"{label}, {case['name']}: token_ids"), case["token_ids"]
        checks.observe(f"{label}, {case['name']}: token_ids", got, expect=want)
        if got != want:
            diagnosis = why()
            raise AssertionError(f"{label}: {diagnosis + '. ' if diagnosis else ''}{case['name']} ({case['params']}): "
                                 f"{difference(tok_, got, want)}")
    return len(cases)


def tokens_for_grader(llm, cases, label):
    """Every request's tokens, as plain ints, for the grader (which compares them outside this kernel)."""
    outs = generate(llm, cases, label)
    assert len(outs) == len(cases), f"{label}: {len(cases)} requests gave {len(outs)} outputs"
    return [checks.as_tokens(out.token_ids, f"{label}, {case['name']}: token_ids") for case, out in zip(cases, outs)]


def int4_weights_problem(llm):
    """Where the LM head the engine computes with differs from the lab's int4 format of the target's (or nothing)."""
    head = llm.model.lm_head
    w = checks.load_model().lm_head.weight.detach().numpy().astype(np.float32)
    groups = w.reshape(w.shape[0], -1, 64)
    scale = np.abs(groups).max(axis=2) / np.float32(7)
    scale = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    want = (np.clip(np.round(groups / scale[..., None]), -7, 7) * scale[..., None]).reshape(w.shape)
    try:
        got = head.scheme.dequantize(head.state).detach().cpu().double().numpy()
    except Exception as e:
        return f"dequantizing the engine's LM head raised {type(e).__name__}: {e}"
    if got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max())):
        return ""
    if got.shape != want.shape:
        return f"the engine's LM head dequantizes to shape {list(got.shape)}, not {list(want.shape)}"
    r, c = first(~np.isclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max())))
    return (f"your scheme's weights are not the lab's int4 format of the target's (the tests of Tasks 1 and 2 say which "
            f"part is wrong): the LM head's [{r}, {c}] dequantizes to {got[r, c]:.6g}, not {want[r, c]:.6g}")


def gqa_weights_problem(model, target):
    """Where the converted model's K/V projections differ from the group means (or nothing)."""
    H, K = target.config.num_attention_heads, model.config.num_key_value_heads
    for i, (mine, orig) in enumerate(zip(model.model.layers, target.model.layers)):
        for proj in ("k_proj", "v_proj"):
            got = getattr(mine.self_attn, proj).weight.detach().double().numpy()
            want = want_pool(getattr(orig.self_attn, proj).weight.detach().numpy(), H, K)
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max())):
                return (f"layer {i}'s {proj} in the converted model is not the mean of each group's heads (the tests "
                        f"of Task 3 say what is wrong with mean_pool_kv)")
    return ""


def int4_engine(Int4GroupWise, label, visible=False):
    """LLM(quantization=Int4GroupWise(64)) must store every linear layer as your state: half a byte per weight and a
    4-byte scale per 64 weights (visible: the bytes go to the grader too). Returns the engine."""
    llm = call(LLM, label, quantization=Int4GroupWise(group_size=64), max_num_seqs=16)
    layers = [m for m in llm.model.modules() if isinstance(m, QuantLinear)]
    assert layers and all(isinstance(m.scheme, Int4GroupWise) for m in layers), (
        f"{label}: the engine's linear layers should be quantized with your Int4GroupWise")
    stored = sum(t.numel() * t.element_size() for m in layers for t in m.state.values())
    weights = sum(m.out_features * m.in_features for m in layers)
    if visible:
        checks.observe(f"{label}: bytes the quantized layers store", stored, expect=round(weights * (0.5 + 4 / 64)))
    assert stored == round(weights * (0.5 + 4 / 64)), (
        f"{label}: the quantized layers store {stored:,} bytes for {weights:,} weights; int4 in groups of 64 is "
        f"half a byte per weight plus a 4-byte scale per 64 weights, {round(weights * (0.5 + 4 / 64)):,} bytes")
    return llm


def gqa_engine(mean_pool_kv, label):
    """LLM(model=gqa.convert(target, 2, pool=mean_pool_kv)) must hold a quarter of the target's KV per token.
    Returns the engine, the converted model, the target and both KV sizes."""
    target = checks.load_model()
    c = target.config
    model = call(convert, label, target, 2, pool=mean_pool_kv)
    llm = call(LLM, label, model=model, max_num_seqs=16)
    pool = llm.engine.kv.pool_k  # [layers, positions, kv_heads, head_dim]
    per_token = 2 * pool[:, 0].numel() * pool.element_size()  # K and V of one position, every layer
    mha = 2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * 4  # the target's: 8 heads of K and V, float32
    assert per_token * 4 == mha, (f"{label}: the engine holds {per_token:,} bytes of KV per token; 2 KV heads instead "
                                  f"of {c.num_attention_heads} should make it a quarter of the target's {mha:,}")
    return llm, model, target, per_token, mha


def gqa_label(label, cases):
    return f"{label}LLM(model=gqa.convert(target, 2, pool=mean_pool_kv)), {len(cases)} requests"


def check_int4_golden(Int4GroupWise, golden_path, label):
    """The int4 golden requests on your scheme: token-exact with the reference run on the dequantized weights."""
    with open(golden_path) as f:
        cases = json.load(f)["cases"]
    label = f"{label}LLM(quantization=Int4GroupWise(64)), {len(cases)} int4 golden requests"
    llm = int4_engine(Int4GroupWise, label, visible=True)
    return compare(generate(llm, cases, label), cases, label, lambda: int4_weights_problem(llm))


def check_gqa_golden(mean_pool_kv, cases, label):
    """The cases on the model your pooling converts: token-exact with the reference run on the same converted model."""
    label = gqa_label(label, cases)
    llm, model, target, per_token, mha = gqa_engine(mean_pool_kv, label)
    checks.observe(f"{label}: KV bytes per token", per_token, expect=mha // 4)
    n = compare(generate(llm, cases, label), cases, label, lambda: gqa_weights_problem(model, target))
    return n, per_token, mha


def check_engine(pack_int4, unpack_int4, Int4GroupWise, mean_pool_kv, golden_path, gqa_cases, label):
    """The visible test: both engines, with the course's versions of your parts forbidden.
    Returns (int4 requests, GQA requests, KV bytes per token, the target's)."""
    own_parts(pack_int4, unpack_int4, Int4GroupWise, mean_pool_kv)
    with checks.reference_forbidden("your engine's int4 and GQA parts", forbidden=ANSWER_KEY):
        n4 = check_int4_golden(Int4GroupWise, golden_path, label)
        ng, per_token, mha = check_gqa_golden(mean_pool_kv, gqa_cases, label)
    return n4, ng, per_token, mha


def report_int4(Int4GroupWise, report, label):
    """The hidden int4 requests on your scheme; the grader compares their tokens with the reference run's."""
    cases = report.cases("int4")
    label = f"{label}LLM(quantization=Int4GroupWise(64)), {len(cases)} hidden int4 requests"
    llm = int4_engine(Int4GroupWise, label)
    for case, tokens in zip(cases, tokens_for_grader(llm, cases, label)):
        report.add("int4", case, "token_ids", tokens)
    problem = int4_weights_problem(llm)
    if problem:  # the grader decides from the tokens; this says why they would differ
        print(f"{label}: note: {problem}")
    return len(cases)


def report_gqa(mean_pool_kv, report, label):
    """The hidden prompts on the model your pooling converts; the grader compares their tokens with the reference run
    of the course's conversion, and the converted weights must be the group means."""
    cases = report.cases("gqa2_pooled")
    label = gqa_label(label, cases)
    llm, model, target, per_token, mha = gqa_engine(mean_pool_kv, label)
    for case, tokens in zip(cases, tokens_for_grader(llm, cases, label)):
        report.add("gqa2_pooled", case, "token_ids", tokens)
    problem = gqa_weights_problem(model, target)
    assert not problem, f"{label}: {problem}"
    return len(cases), per_token, mha


def report_engine(pack_int4, unpack_int4, Int4GroupWise, mean_pool_kv, report, label):
    """The hidden test: both engines on the hidden prompts; their tokens go to the grader, which compares them
    outside this kernel. Returns the same four numbers as check_engine."""
    own_parts(pack_int4, unpack_int4, Int4GroupWise, mean_pool_kv)
    with checks.reference_forbidden("your engine's int4 and GQA parts", forbidden=ANSWER_KEY):
        n4 = report_int4(Int4GroupWise, report, label)
        ng, per_token, mha = report_gqa(mean_pool_kv, report, label)
    return n4, ng, per_token, mha
